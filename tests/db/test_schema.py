"""The bridge's schema on SQLite and PostgreSQL: its migrations build exactly the models, a
database made by `create_all` before the migrations is checked and stamped, an older or
newer schema is refused by the daemon's rule (and upgraded by `stb db upgrade`), and many
threads or processes starting at once on a new database create it once, under the schema
lock, with the ledger beside it."""

from __future__ import annotations

import multiprocessing
import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlmodel import SQLModel
from typer.testing import CliRunner

from accounting import db as ledger_db
from accounting.schema import LEDGER_TABLES
from bridge.cli import app
from bridge.daemon.service import DaemonError, open_database
from bridge.db import Migrations, SchemaError, make_engine, schema_lock
from bridge.leases import (  # noqa: F401 - tables
    advice,
    audit,
    leader,
    loads,
    rates,
    requests,
    rollouts,
    schema,
    weights,
)
from bridge.leases.migrations import baseline
from bridge.leases.store import LeaseStore
from tests.db.helpers import table_of

NOW_SQL = "CURRENT_TIMESTAMP"
#: the bridge's newest revision, and the one a next release would add after it
HEAD = schema.head_revision()
NEXT = f"{int(HEAD) + 1:04d}"


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def _baseline_tables(engine: Engine) -> set[str]:
    """Revision 0001's tables on this backend (the leader row's on PostgreSQL only)."""
    return {t.name for t in baseline.tables(engine.dialect.name)}


def _bridge_tables(engine: Engine) -> set[str]:
    """The bridge's tables at head on this backend: 0001's, the load times' (0002), the
    rate history's (0003), the weight copies' catalogue (0004), the audit trail (0007) and
    every table a later revision adds to `schema.TABLES`."""
    more = set(loads.TABLES) | set(rates.TABLES) | set(weights.TABLES) | set(audit.TABLES)
    later = {t for t in schema.TABLES if t != "stb_leader"}
    return _baseline_tables(engine) | more | later


def _create_all_as_before(engine: Engine, names: set[str]) -> None:
    """What `create_schema` did before the migrations: `create_all` of the models as they
    were then (revision 0001's frozen tables)."""
    baseline.METADATA.create_all(engine, tables=[baseline.METADATA.tables[n] for n in names])


def _version_rows(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT version_num FROM bridge_alembic_version"))]


def test_the_migrations_build_exactly_the_models(database_url: str) -> None:
    engine = make_engine(database_url)
    change = schema.create_schema(engine)
    assert (change.found, change.adopted, change.now) == (None, None, HEAD)
    assert schema.current_revision(engine) == schema.head_revision() == HEAD
    assert _tables(engine) == _bridge_tables(engine) | {"bridge_alembic_version"}
    assert ("stb_leader" in _tables(engine)) == leader.supported(engine)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = [
            d
            for d in compare_metadata(ctx, SQLModel.metadata)
            if table_of(d) in _bridge_tables(engine)
        ]
    assert diff == []
    schema.BRIDGE.migrate(engine, "base", down=True)
    assert _tables(engine) == {"bridge_alembic_version"}
    assert schema.create_schema(engine).line() == f"created at {HEAD}"  # and up again


def test_a_database_made_before_the_migrations_is_checked_and_stamped(database_url: str) -> None:
    engine = make_engine(database_url)
    # a release before the rollouts: some of revision 0001's tables, one lease in them
    older = _baseline_tables(engine) - set(rollouts.TABLES)
    _create_all_as_before(engine, older)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO lease (node, pool, lend_mode, models, state, request_key, "
                f"reason, created_at, updated_at) VALUES ('n3', 'elastic', 'preempt', '[]', "
                f"'serving', 'k1', 'lent', {NOW_SQL}, {NOW_SQL})"
            )
        )
    # the daemon's rule adopts it as 0001, which is older than head: refused, nothing done
    with pytest.raises(SchemaError, match=f"is at schema revision 0001; this stb needs {HEAD}"):
        schema.open_schema(engine)
    assert _tables(engine) == older
    change = schema.create_schema(engine)  # `stb db upgrade` adopts it and upgrades it
    assert (change.found, change.adopted, change.now) == (None, "0001", HEAD)
    assert change.line() == f"tables from before its migrations adopted as 0001, upgraded to {HEAD}"
    assert _version_rows(engine) == [HEAD]
    assert _tables(engine) == _bridge_tables(engine) | {"bridge_alembic_version"}
    (kept,) = LeaseStore(engine).open_leases()
    assert (kept.node, kept.request_key) == ("n3", "k1")
    assert schema.open_schema(engine).line() == f"at {HEAD}, nothing to do"


def test_tables_from_before_that_are_not_0001s_are_refused_and_left_alone(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE lease (id INTEGER PRIMARY KEY, node TEXT, extra TEXT)"))
    for ensure in (schema.open_schema, schema.create_schema):
        with pytest.raises(SchemaError) as info:
            ensure(engine)
        message = str(info.value)
        assert "has tables from before its migrations that are not revision 0001's" in message
        assert "(lease lacks created_at, lend_mode, models, pool, reason, request_key, " in message
        assert "and has extra): not adopting them" in message
        assert "\n" not in message
    assert _tables(engine) == {"lease"}  # nothing created, nothing stamped


@pytest.fixture
def next_release(tmp_path: Path) -> Migrations:
    """The bridge's migrations as the next release would ship them, with revision `NEXT` (a new
    nullable column `lease.note`)."""
    where = tmp_path / "migrations"
    source = Path(schema.__file__).parent / "migrations"
    shutil.copytree(source, where, ignore=shutil.ignore_patterns("__pycache__"))
    (where / "versions" / f"{NEXT}_lease_note.py").write_text(
        '"""A note on each lease (a test revision)."""\n'
        "import sqlalchemy as sa\nfrom alembic import op\n\n"
        f'revision = "{NEXT}"\ndown_revision = "{HEAD}"\n'
        "branch_labels = None\ndepends_on = None\n\n\n"
        "def upgrade() -> None:\n"
        '    with op.batch_alter_table("lease") as batch:\n'
        '        batch.add_column(sa.Column("note", sa.Text(), nullable=True))\n\n\n'
        "def downgrade() -> None:\n"
        '    with op.batch_alter_table("lease") as batch:\n'
        '        batch.drop_column("note")\n'
    )
    return Migrations(schema.BRIDGE.what, str(where), schema.BRIDGE.version_table)


def _columns(engine: Engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns(table)}


def test_an_older_schema_stops_the_daemon_and_stb_db_upgrade_upgrades_it(
    database_url: str, next_release: Migrations, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(database_url)
    schema.create_schema(engine)  # made by this release: HEAD
    monkeypatch.setattr(schema, "BRIDGE", next_release)  # then the site installs the next
    with pytest.raises(DaemonError) as info:
        open_database(database_url)
    assert str(info.value) == (
        f"the bridge's database at {engine.url.render_as_string(hide_password=True)} is at "
        f"schema revision {HEAD}; this stb needs {NEXT}: run `stb db upgrade`"
    )
    assert schema.current_revision(engine) == HEAD and "note" not in _columns(engine, "lease")

    config = tmp_path / "bridge.toml"
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config.write_text(
        f'database_url = "{database_url}"\n[accounting]\nledger_url = "{ledger_url}"\n'
    )
    done = CliRunner().invoke(app, ["db", "upgrade", "-c", str(config)])
    assert done.exit_code == 0, done.output
    assert (
        "the bridge's database at " in done.output and f": upgraded {HEAD} -> {NEXT}" in done.output
    )
    assert "the ledger at sqlite:///" in done.output and ": created at 0008" in done.output
    assert schema.current_revision(engine) == NEXT and "note" in _columns(engine, "lease")
    open_database(database_url).dispose()  # the daemon starts now
    again = CliRunner().invoke(app, ["db", "upgrade", "-c", str(config)])
    assert again.exit_code == 0 and again.output.count("nothing to do") == 2, again.output


def test_a_schema_newer_than_this_stb_is_refused_by_every_path(
    database_url: str, next_release: Migrations, tmp_path: Path
) -> None:
    engine = make_engine(database_url)
    next_release.ensure(engine, upgrade=True)  # a newer release made it: NEXT
    expected = (
        f"the bridge's database at {engine.url.render_as_string(hide_password=True)} is at "
        f"schema revision {NEXT}, which this stb does not know (its newest is {HEAD}): a newer "
        "release made it; run that release, or upgrade stb on this host"
    )
    for ensure in (schema.open_schema, schema.create_schema):
        with pytest.raises(SchemaError) as info:
            ensure(engine)
        assert str(info.value) == expected
    with pytest.raises(DaemonError, match="which this stb does not know"):
        open_database(database_url)
    config = tmp_path / "bridge.toml"
    config.write_text(f'database_url = "{database_url}"\n')
    refused = CliRunner().invoke(app, ["db", "upgrade", "-c", str(config)])
    assert refused.exit_code == 1
    assert " ".join(refused.output.split()) == f"error: {expected}"
    assert schema.current_revision(engine) == NEXT and "note" in _columns(engine, "lease")


def test_an_older_ledger_is_refused_by_the_daemons_rule_and_upgraded_by_its_commands(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    ledger_db.upgrade(engine, "0005")
    older = (
        r"the ledger at .* is at schema revision 0005; this stb needs 0008: run `stb db upgrade`"
    )
    with pytest.raises(SchemaError, match=older):
        ledger_db.open_ledger(database_url, migrate=False)
    assert ledger_db.current_revision(engine) == "0005"
    ledger_db.open_ledger(database_url).dispose()  # the one-shot commands' way
    assert ledger_db.current_revision(engine) == "0008"


def test_threads_starting_together_create_both_schemas_once(database_url: str) -> None:
    n = 6
    barrier = threading.Barrier(n)
    results: list[tuple[str, str]] = []
    errors: list[str] = []

    def start() -> None:
        engine = make_engine(database_url)  # an engine each, as separate daemons have
        try:
            with engine.connect():
                pass
            barrier.wait()
            bridge = schema.open_schema(engine).line()
            ledger = ledger_db.ensure(engine, upgrade=False).line()
            results.append((bridge, ledger))
        except BaseException:
            errors.append(traceback.format_exc())  # where it failed, in the report
        finally:
            engine.dispose()

    threads = [threading.Thread(target=start, daemon=True) for _ in range(n)]  # a hang fails
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert errors == [] and len(results) == n
    assert sorted(b for b, _ in results) == [f"at {HEAD}, nothing to do"] * (n - 1) + [
        f"created at {HEAD}"
    ]
    assert sorted(x for _, x in results) == ["at 0008, nothing to do"] * (n - 1) + [
        "created at 0008"
    ]
    assert _version_rows(make_engine(database_url)) == [HEAD]


def _start_daemon_schema(url: str, barrier: Any, out: Any) -> None:
    """One process's start, as `stb daemon`'s: connect, wait for the others, then open
    the bridge's database and the ledger by the daemon's rule."""
    engine = make_engine(url)
    try:
        with engine.connect():
            pass
        barrier.wait(60)
        started = time.perf_counter()
        bridge = schema.open_schema(engine).line()
        ledger = ledger_db.ensure(engine, upgrade=False).line()
        out.put((bridge, ledger, time.perf_counter() - started))
    except Exception as exc:
        out.put((f"error: {type(exc).__name__}: {exc}", "", 0.0))


def test_processes_starting_together_on_a_new_database_create_it_once(database_url: str) -> None:
    """The issue's race (PostgreSQL: `UniqueViolation` on `pg_type` from `CREATE TABLE
    lease` in all of 5 rounds of 2 processes with the old `create_all`)."""
    n = 6
    # fresh interpreters, not forks of this one (its threads, its engines), started from a
    # server that imported this module once: each start takes milliseconds, not seconds
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=_start_daemon_schema, args=(database_url, barrier, out), daemon=True)
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    print(f"\n{n} processes: slowest open {max(r[2] for r in results):.3f}s")
    assert [p.exitcode for p in procs] == [0] * n
    bridge = sorted(r[0] for r in results)
    assert bridge == [f"at {HEAD}, nothing to do"] * (n - 1) + [f"created at {HEAD}"], bridge
    ledger = sorted(r[1] for r in results)
    assert ledger == ["at 0008, nothing to do"] * (n - 1) + ["created at 0008"], ledger
    engine = make_engine(database_url)
    assert _version_rows(engine) == [HEAD]
    assert _tables(engine) >= _bridge_tables(engine) | set(LEDGER_TABLES)


def test_a_second_starter_waits_for_the_schema_lock(database_url: str) -> None:
    engine = make_engine(database_url)
    other = make_engine(database_url)
    done: list[str] = []
    with schema_lock(engine):  # another host's migration, in progress
        waiting = threading.Thread(target=lambda: done.append(schema.open_schema(other).line()))
        waiting.start()
        time.sleep(1.0)
        assert done == [] and waiting.is_alive()
    waiting.join(30)
    assert done == [f"created at {HEAD}"]
    if engine.dialect.name == "postgresql":
        refused = pytest.raises(SchemaError, match="held the schema lock")
        with schema_lock(engine), refused, schema_lock(other, wait_s=0.2):
            pass
