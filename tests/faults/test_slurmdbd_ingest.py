"""Fault 2: slurmdbd stopped during a ledger ingest.

Jobs of two teams run and finish; a first ingest fills a ledger. More work runs, then an
ingest over a three-day window starts and, after sacct's first day has answered, the
lab's slurmdbd is stopped (by its pid file), so the next day's `sacct` fails in the middle
of the ingest. Expected: the ingest fails with a Slurm error, and `stb accounting ingest`
says what is wrong in one clear line (no traceback, exit status 1); the ledger is exactly
as before, every table, row for row (the ingest is one transaction and writes only after
sacct has answered for the whole window). After slurmdbd is restarted the next ingest
catches up: its totals equal those of an ingest of the same window into a fresh ledger
that never saw the fault.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, MetaData, select

from accounting.buckets import floor_hour
from accounting.db import open_ledger
from accounting.tables import LEDGER
from bridge.config import load_config
from bridge.lab.spec import LabSpec
from bridge.ledger.feed import ingest_window
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.errors import SlurmError
from tests.lab.helpers import sbatch, wait_sacct_final

from .tools import lab_daemon_running, restart_lab, stb_ingest, stop_lab_daemon

pytestmark = pytest.mark.lab


def _config(lab: LabSpec, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'database_url = "sqlite:///{tmp_path / name}-bridge.db"\n'
        "[accounting]\n"
        f'ledger_url = "sqlite:///{tmp_path / name}-ledger.db"\n'
        f'cluster = "{lab.cluster}"\n'
    )
    return path


def _everything(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table of the ledger database."""
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        return {
            name: sorted(tuple(r) for r in conn.execute(select(table)))
            for name, table in meta.tables.items()
        }


def _totals(engine: Engine, since: datetime) -> dict[tuple[str, ...], int]:
    """GPU-ms per (pool, workload, account, team, model) from `since` on."""
    out: dict[tuple[str, ...], int] = defaultdict(int)
    with engine.connect() as conn:
        for r in conn.execute(select(LEDGER).where(LEDGER.c.bucket >= since)):
            out[(r.pool, r.workload, r.account, r.team, r.model)] += r.gpu_ms
    return dict(out)


def test_slurmdbd_stopped_during_an_ingest(lab: LabSpec, tmp_path: Path) -> None:
    t0 = datetime.now(UTC)
    first = [
        sbatch(lab, "--partition=train", "--account=team-vision", "--gres=gpu:2",
               "--wrap", "sleep 2"),
        sbatch(lab, "--partition=train", "--account=team-nlp", "--gres=gpu:1",
               "--wrap", "sleep 3"),
    ]  # fmt: skip
    for job in first:
        wait_sacct_final(lab, job, timeout_s=90)
    since = floor_hour(t0)
    until1 = datetime.now(UTC).replace(microsecond=0)
    faulted = _config(lab, tmp_path, "faulted")
    code, out = stb_ingest(lab, faulted, since, until1)
    assert code == 0, out
    ledger = open_ledger(load_config(faulted).accounting.ledger_url)
    before = _everything(ledger)
    assert before["ledger_row"], "the first ingest booked nothing"

    later = sbatch(lab, "--partition=train", "--account=team-research", "--gres=gpu:1",
                   "--wrap", "sleep 2")  # fmt: skip
    wait_sacct_final(lab, later, timeout_s=90)
    until2 = datetime.now(UTC).replace(microsecond=0)

    steps: list[tuple[datetime, datetime, int]] = []

    def on_step(lo: datetime, hi: datetime, n: int) -> None:
        steps.append((lo, hi, n))
        if len(steps) == 1:  # sacct answered for the first day: now slurmdbd goes away
            stop_lab_daemon(lab, "slurmdbd")

    try:
        with pytest.raises(SlurmError) as failure:
            ingest_window(
                load_config(faulted), SlurmCLI(env=lab.env()), ledger,
                until2 - timedelta(days=3), until2, on_step=on_step,
            )  # fmt: skip
        assert len(steps) == 1 and not lab_daemon_running(lab, "slurmdbd")
        print(f"the ingest failed after {len(steps)} sacct step: {failure.value}")
        assert "Connection refused" in str(failure.value), failure.value
        assert _everything(ledger) == before  # no row lost, none half-written

        # `stb accounting ingest` while slurmdbd is down: one clear line, nothing written.
        code, out = stb_ingest(lab, faulted, since, until2)
        print(f"stb accounting ingest with slurmdbd down: exit {code}: {out.strip()}")
        assert code == 1, out
        assert "Problem talking to the database" in out and "Traceback" not in out, out
        assert _everything(ledger) == before
    finally:
        restart_lab(lab)

    # slurmdbd is back: the next ingest catches up with one that never saw a fault.
    code, out = stb_ingest(lab, faulted, since, until2)
    assert code == 0, out
    clean = _config(lab, tmp_path, "clean")
    code, out = stb_ingest(lab, clean, since, until2)
    assert code == 0, out
    reference = open_ledger(load_config(clean).accounting.ledger_url)
    caught_up, expected = _totals(ledger, since), _totals(reference, since)
    assert caught_up == expected
    accounts = {key[2] for key in caught_up}
    assert {"team-vision", "team-nlp", "team-research"} <= accounts, accounts
