"""MIG slices in the ledger, on the lab's node of fake MIG devices (`LabSpec.mig_nodes`:
one H100 cut into 4g.40gb + 2g.20gb + 1g.10gb, character devices typed in gres.conf with
AutoDetect=off, in the hidden partition `mig`). The module's `lab` brings that
node up (`with_mig_node`: as `stb lab up --mig`) and the lab back as it was after; it
runs last (`last`), so no other test sees the node or the restarts.

Two jobs on slices run side by side; sacct's TRES of each counts a slice as one
`gres/gpu` and names its type (`gres/gpu:h100_1g.10gb=1`, the type listed in
AccountingStorageTRES). Ingested with the lab's configuration (`[accounting.slices]`
default: by compute slices, 7 per H100), each job's ledger rows are, per slice type, its
elapsed seconds x the slice's compute fraction worked out here from sacct's own record
(the type's `<n>g` over 7), to the millisecond; and per job the ledger's GPU-hours are
that fraction of sacct's `gres/gpu` x elapsed (what sreport would book as whole GPUs).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import pytest
from sqlalchemy import select

from accounting.buckets import floor_hour
from accounting.db import open_ledger
from accounting.tables import LEDGER
from bridge.lab.demo import lab_config
from bridge.lab.spec import MIG_POOL, LabSpec
from bridge.ledger.feed import ingest_window
from bridge.slurm.cli import SlurmCLI
from tests.lab.fixtures import with_mig_node
from tests.lab.helpers import gpu_count, sbatch, wait_sacct_final

#: last: this module's `lab` adds the node of MIG slices, and restarts the lab to do so
pytestmark = [pytest.mark.lab, pytest.mark.last]


@pytest.fixture(scope="module")
def lab(lab: LabSpec) -> Iterator[LabSpec]:
    """The session's lab with its node of MIG slices, for this module (`with_mig_node`)."""
    yield from with_mig_node(lab)


_SLICE = re.compile(r"^gpu:.+_(\d)g\.\d+gb$")


def _sacct_slices(record: dict[str, object]) -> dict[str, int]:
    """The slice types and counts of a sacct record's allocated TRES."""
    out = {}
    for t in record["tres"]["allocated"]:  # type: ignore[index]
        if t["type"] == "gres" and _SLICE.match(t["name"]):
            out[t["name"].split(":", 1)[1]] = int(t["count"])
    return out


def test_a_job_on_a_mig_slice_books_its_fraction_agreeing_with_sacct(
    lab: LabSpec, tmp_path: Path
) -> None:
    node = lab.mig_nodes[0].name
    one, two, _four = (f"{lab.gpu_type}_{p}" for p in ("1g.10gb", "2g.20gb", "4g.40gb"))
    jobs = [
        sbatch(lab, "-p", MIG_POOL, "-A", lab.accounts[0], f"--gres=gpu:{one}:1",
               "--wrap", "sleep 3"),
        sbatch(lab, "-p", MIG_POOL, "-A", lab.accounts[1], f"--gres=gpu:{two}:1,gpu:{_four}:1",
               "--wrap", "sleep 2"),
    ]  # fmt: skip
    recs = {job: wait_sacct_final(lab, job) for job in jobs}
    for rec in recs.values():
        assert rec["state"]["current"] == "COMPLETED" and rec["nodes"] == node, rec["state"]
    assert _sacct_slices(recs[jobs[0]]) == {one: 1}
    assert _sacct_slices(recs[jobs[1]]) == {two: 1, _four: 1}
    assert [gpu_count(recs[j]) for j in jobs] == [1, 2]  # Slurm: a slice is one gres/gpu

    cli = SlurmCLI(env=lab.env())
    now = datetime.now(UTC)
    first = min(datetime.fromtimestamp(r["time"]["start"], UTC) for r in recs.values())
    ledger = open_ledger(f"sqlite:///{tmp_path / 'mig.db'}")
    ingest_window(lab_config(lab), cli, ledger, floor_hour(first), now, now=now)

    with ledger.connect() as conn:
        rows = conn.execute(
            select(LEDGER.c.source, LEDGER.c.gpu_type, LEDGER.c.pool, LEDGER.c.gpu_ms).where(
                LEDGER.c.bucket >= floor_hour(first) - timedelta(hours=1)
            )
        ).all()
    for job, rec in recs.items():
        booked: dict[str, int] = defaultdict(int)
        for source, gpu_type, pool, ms in rows:
            if source.startswith(f"{lab.cluster}:{job}:"):
                assert pool == MIG_POOL
                booked[gpu_type] += ms
        elapsed_ms = rec["time"]["elapsed"] * 1000
        expected = {
            t: n * Fraction(int(_SLICE.match(f"gpu:{t}")[1]), 7) * elapsed_ms  # type: ignore[index]
            for t, n in _sacct_slices(rec).items()
        }
        # sacct's GPU-hours as whole gres/gpu, and the ledger's as fractions of a GPU
        sacct_gpu_h = gpu_count(rec) * elapsed_ms / 3_600_000
        ledger_gpu_h = sum(booked.values()) / 3_600_000
        print(
            f"job {job}: sacct {dict(_sacct_slices(rec))} gres/gpu={gpu_count(rec)} "
            f"elapsed {rec['time']['elapsed']} s = {sacct_gpu_h:.6f} gres/gpu-h; ledger "
            f"{dict(booked)} ms = {ledger_gpu_h:.6f} GPU-h; expected "
            f"{ {t: float(v) for t, v in expected.items()} } ms"
        )
        assert booked.keys() == expected.keys(), (job, dict(booked), expected)
        for t, ms in booked.items():
            assert abs(ms - expected[t]) < 2, (job, t, ms, float(expected[t]))

    # the node's capacity is its slices' fractions: one H100 cut in 7 of its 7 slices
    mig_capacity = [r for r in rows if r.pool == MIG_POOL and r.source == "capacity"]
    assert {r.gpu_type for r in mig_capacity} <= {one, two, _four}
