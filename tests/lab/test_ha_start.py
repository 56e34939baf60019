"""Two real `stb daemon` processes started in the same instant on a new PostgreSQL database,
as two hosts booting would (each its own lock file, exporter port and nginx; one
`database_url`): the schema is created exactly once, under the schema lock, and both stay
up, one active and the other standing by."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from bridge.lab.pair import Instance
from bridge.lab.spec import LabSpec
from bridge.leases import leader
from bridge.leases.schema import head_revision
from bridge.leases.store import make_engine
from tests.lab.helpers import cancel_triton_jobs

pytestmark = pytest.mark.lab
TICK_S = 2.0
#: the daemon's log line of its schema check (`bridge.daemon.service.open_database`)
SCHEMA_LINE = re.compile(r"^(\S+ [\d:,]+) \S+ the bridge's database at \S+: (.+)$", re.M)


def _schema_line(instance: Instance) -> tuple[datetime, str]:
    """When the daemon checked the schema, and what it found."""
    found = SCHEMA_LINE.findall(instance.log.read_text())
    assert len(found) == 1, f"{instance.name}: {found}"
    at, what = found[0]
    return datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f"), what


def test_two_daemons_started_together_on_a_pg_database_both_run_one_active(
    lab: LabSpec, pg_database: str, tmp_path: Path
) -> None:
    pair = [
        Instance(name, lab, tmp_path / name, pg_database, TICK_S)
        for name in ("bridge-a", "bridge-b")
    ]
    engine = make_engine(pg_database)
    try:
        for x in pair:  # back to back: both processes exist within milliseconds
            x.start()
        deadline = time.monotonic() + 60
        while not all(x.role() in ("active", "standby") for x in pair):
            for x in pair:
                assert x.proc is not None and x.proc.poll() is None, x.log.read_text()
            assert time.monotonic() < deadline, "both daemons not up within 60 s"
            time.sleep(0.1)
        time.sleep(3 * TICK_S)  # some ticks and beats: the standby stays up and stands by

        for x in pair:
            assert x.proc is not None and x.proc.poll() is None, x.log.read_text()
            assert "Traceback" not in x.log.read_text(), x.log.read_text()
        roles = {x.name: x.role() for x in pair}
        assert sorted(roles.values()) == ["active", "standby"], roles
        (active,) = [name for name, role in roles.items() if role == "active"]
        held = leader.current(engine)
        assert held is not None and (held.holder, held.epoch) == (active, 1)
        assert sum(x.metric("stb_active") or 0 for x in pair) == 1

        # the schema was created once: one daemon made it, the other found it made
        (at_a, what_a), (at_b, what_b) = (_schema_line(x) for x in pair)
        head = head_revision()
        assert sorted([what_a, what_b]) == [f"at {head}, nothing to do", f"created at {head}"]
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM bridge_alembic_version"))
            assert [r[0] for r in versions] == [head]
        print(
            f"\ntwo daemons on a new database: schema checks ended "
            f"{abs((at_a - at_b).total_seconds()):.3f} s apart ({what_a}; {what_b}); "
            f"{active} active, epoch {held.epoch}"
        )
    finally:
        for x in pair:
            x.stop()
        cancel_triton_jobs(lab)
        engine.dispose()
