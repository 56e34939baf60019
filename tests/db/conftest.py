"""Database fixtures: `database_url` runs a test against SQLite and the real PostgreSQL.

`database_url` gives an empty database per test: a fresh SQLite file, or a PostgreSQL
database made once per session (`stb_test_db_<random>`, dropped at the end) whose `public`
schema is wiped before each test. PostgreSQL is the local server (127.0.0.1:5432, user
postgres, trust auth) or `$STB_TEST_POSTGRES_URL` (a URL to a maintenance database the user
may create databases from); if none answers and a Docker engine is reachable, a
testcontainers PostgreSQL is started for the session; otherwise the postgresql parameter is
skipped with the reason. The lease store's and the ledger's tests use it; `engine` and
`store` are the bridge's tables made on it and the lease store over them (a module with
tables of its own defines its own `engine`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url

from bridge.leases.store import LeaseStore, create_schema, make_engine
from tests.db.helpers import libpq

ADMIN_URL = make_url(
    os.environ.get("STB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
)


def _docker_engine() -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return not host.startswith("unix://") or os.path.exists(host[len("unix://") :])


@pytest.fixture(scope="session")
def admin_url() -> Iterator[URL]:
    """A maintenance database URL: the local server, or a testcontainers PostgreSQL."""
    try:
        psycopg.connect(libpq(ADMIN_URL), connect_timeout=3).close()
        yield ADMIN_URL
        return
    except psycopg.Error as exc:
        local_error = exc
    if not _docker_engine():
        pytest.skip(f"no PostgreSQL answers at {ADMIN_URL!r} ({local_error}) and no Docker engine")
    try:  # testcontainers >= 4.13 moved it; the old path still works, with a warning
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16-alpine", driver=None) as pg:
        yield make_url(pg.get_connection_url())


@pytest.fixture(scope="session")
def postgres_database(admin_url: URL) -> Iterator[str]:
    """A PostgreSQL database of its own for this test session; its SQLAlchemy URL."""
    name = f"stb_test_db_{secrets.token_hex(4)}"
    with psycopg.connect(libpq(admin_url), autocommit=True, connect_timeout=3) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = admin_url.set(drivername="postgresql+psycopg", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        # a connection of its own: the server may have restarted since (tests/lab/test_ha)
        with psycopg.connect(libpq(admin_url), autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database's SQLAlchemy URL, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    url: str = request.getfixturevalue("postgres_database")
    with psycopg.connect(libpq(make_url(url)), autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """The bridge's tables (`create_schema`) on `database_url`."""
    eng = make_engine(database_url)
    create_schema(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def store(engine: Engine) -> LeaseStore:
    """The lease store over `engine`."""
    return LeaseStore(engine)
