"""Database fixtures: `database_url` runs a test against SQLite and the real PostgreSQL.

`database_url` gives an empty database per test: a fresh SQLite file, or a PostgreSQL
database made once per session (`stb_test_db_<random>`, dropped at the end) whose `public`
schema is wiped before each test. PostgreSQL is the local server (127.0.0.1:5432, user
postgres, trust auth) or `$STB_TEST_POSTGRES_URL` (a URL to a maintenance database the user
may create databases from); if none answers, the postgresql parameter is skipped with the
reason. The leases tests use it now; the ledger's tests can reuse it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import URL, make_url

ADMIN_URL = make_url(
    os.environ.get("STB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
)


def _libpq(url: URL) -> str:
    """The URL as psycopg takes it (no SQLAlchemy '+driver' part)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A PostgreSQL database of its own for this test session; its SQLAlchemy URL."""
    try:
        admin = psycopg.connect(_libpq(ADMIN_URL), autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL answers at {ADMIN_URL!r}: {exc}")
    name = f"stb_test_db_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            url = ADMIN_URL.set(drivername="postgresql+psycopg", database=name)
            yield url.render_as_string(hide_password=False)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database's SQLAlchemy URL, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    url: str = request.getfixturevalue("postgres_database")
    with psycopg.connect(_libpq(make_url(url)), autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return url
