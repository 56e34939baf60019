"""The parsers on each Slurm release's own JSON: `sacct --json` and `squeue --json` of the
same small scenario, recorded by `bench/slurm_matrix.py --record` in each release's Debian
root (tests/data/slurm/{sacct,squeue}-matrix-<release>.json). Each release must read the
same: the shapes differ (22.05 gives a job's state as one name, 23.02 and later as the
base state and its flags; 24.11 gives a run that never started the start time NO_VAL),
the records must not.

Scenario (bench/slurm_matrix_inside.py): a running training job with 2 GPUs and a
comment; a held array `2-4%2`, released and run; a Triton-tagged job of the bridge's
account on the reserved node; an elastic job with 3 GPUs requeued while it runs, then
cancelled while pending (two runs); a training job with its own comment.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from bridge.slurm.model import AccountingRecord
from bridge.slurm.sacct import parse_sacct_json, parse_sacct_json_plain
from bridge.slurm.squeue import parse_squeue_json

DATA = Path(__file__).parent.parent / "data" / "slurm"
RELEASES = sorted(p.name.removeprefix("sacct-matrix-").removesuffix(".json")
                  for p in DATA.glob("sacct-matrix-*.json"))  # fmt: skip


def test_the_releases_past_the_host_s_are_recorded() -> None:
    assert "24.11" in RELEASES


def _one(recs: list[AccountingRecord], what: str, **match: object) -> AccountingRecord:
    found = [r for r in recs if all(getattr(r, k) == v for k, v in match.items())]
    assert len(found) == 1, f"{what}: {len(found)} records match {match}"
    return found[0]


@pytest.mark.parametrize("release", RELEASES)
def test_sacct_reads_the_same_on_every_release(release: str) -> None:
    text = (DATA / f"sacct-matrix-{release}.json").read_text()
    recs = parse_sacct_json(text)
    assert recs == parse_sacct_json_plain(text)  # the typed reader equals the reference
    assert len(recs) == 8
    assert all(r.end is not None and r.end.tzinfo is not None for r in recs)

    train = _one(recs, "the training job", comment="stb:test,stb:workload=training")
    assert (train.state, train.gpus, train.partition, train.account) == (
        "CANCELLED", 2, "train", "team-vision",
    )  # fmt: skip
    assert train.start is not None and len(train.nodes) == 1

    tasks = sorted((r for r in recs if r.array_task_id is not None), key=lambda r: r.job_id)
    assert [r.array_task_id for r in tasks] == [2, 3, 4]
    assert {(r.state, r.gpus, r.account) for r in tasks} == {("COMPLETED", 1, "team-nlp")}
    assert {r.array_job_id for r in tasks} == {int(tasks[0].job_id.split("_")[0])}
    assert tasks[0].job_id.endswith("_2")

    triton = _one(recs, "the Triton job", partition="infer")
    assert triton.account == "bridge" and triton.gpus == 1
    assert triton.comment == "stb:triton,stb:workload=inference"  # job_submit.lua's tag

    elastic = sorted((r for r in recs if r.partition == "elastic"), key=lambda r: r.start is None)
    assert [r.state for r in elastic] == ["REQUEUED", "CANCELLED"]
    ran, never = elastic
    # the second run's restart count is 0 in 22.05's sacct and 1 in 24.11's: not compared
    assert ran.restarts == 0
    assert ran.gpus == 3 and ran.start is not None and ran.elapsed_s >= 1
    assert ran.key != never.key and ran.job_id == never.job_id
    # cancelled while pending: no start (22.05: 0; 24.11: NO_VAL), no node, no GPU time
    assert never.start is None and never.nodes == () and never.gpu_seconds == 0

    nightly = _one(recs, "the commented job", comment="nightly run,stb:workload=training")
    assert nightly.state == "COMPLETED" and nightly.gpus == 1


@pytest.mark.parametrize("release", RELEASES)
def test_squeue_reads_the_same_on_every_release(release: str) -> None:
    everything = parse_squeue_json((DATA / f"squeue-matrix-{release}.json").read_text())
    # 22.05's squeue also lists the jobs that ended within MinJobAge (the tests' own)
    jobs = [j for j in everything if j.state in ("RUNNING", "PENDING")]
    assert len(jobs) == 4
    running, array = sorted(
        (j for j in jobs if j.partition == "train"), key=lambda j: j.state != "RUNNING"
    )
    assert (running.state, running.gpus, running.tags) == ("RUNNING", 2, ("stb:test",))
    assert running.start_time is not None and len(running.nodes) == 1
    assert array.state == "PENDING" and array.reason == "JobHeldUser"
    assert array.job_id.endswith("_[2-4%2]") and array.start_time is None
    (triton,) = (j for j in jobs if j.partition == "infer")
    assert (triton.state, triton.gpus, triton.tags) == ("RUNNING", 1, ("stb:triton",))
    (elastic,) = (j for j in jobs if j.partition == "elastic")
    assert (elastic.state, elastic.restarts, elastic.gpus) == ("PENDING", 1, 3)
    assert elastic.start_time is None  # pending: squeue's expected start is not a start
    # the running jobs' ends: 26.05's lab gives them a year's time limit (525600 min);
    # the others none (UNLIMITED), where Slurm's end_time is the start plus a year anyway
    for job in (running, triton):
        assert job.start_time is not None
        limited = job.start_time + timedelta(minutes=525600)
        assert job.end_time == (limited if release == "26.05" else None)
    assert array.end_time is None and elastic.end_time is None  # pending
