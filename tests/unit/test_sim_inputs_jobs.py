"""Batch jobs for the simulator from a site's `sacct --json --duplicates`, on records of the
real lab's Slurm 22.05 (tests/data/site/, provenance in capture.py: a job array, a 2-node
job, an elastic job requeued once, a job held by --begin, one still running, the bridge's
Triton servers; tests/data/slurm/: an earlier requeue): each job as it came, what is left
out counted, and hostile files refused by name."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bridge.config import BridgeConfig
from bridge.sim.inputs import (
    InputError,
    jobs_from_records,
    partition_kinds,
    read_sacct_files,
    record_span,
    replay_records,
    replay_sacct_files,
)

DATA = Path(__file__).resolve().parents[1] / "data"
SITE = DATA / "site" / "sacct-site-22.05.json"
REQUEUE = DATA / "slurm" / "sacct-requeue-22.05.json"
CAPTURE = json.loads((DATA / "site" / "captures.json").read_text())


def job(role: str) -> str:
    """The id of the capture's one job whose role says `role`."""
    (found,) = [j for j, said in CAPTURE["jobs"].items() if role in said]
    return str(found)


#: the capture's start: its jobs were submitted after it (earlier ones are in the file too)
START = datetime.fromtimestamp(CAPTURE["capture_started"], tz=UTC)
END = START + timedelta(hours=1)
KINDS = partition_kinds(BridgeConfig())


def test_the_bridges_default_pools_give_the_kinds() -> None:
    assert KINDS == {"train": "training", "elastic": "elastic", "infer": None}


def test_the_site_capture_replays_each_job_as_it_came() -> None:
    records = read_sacct_files([SITE])
    replay = replay_records(records, start=START, end=END, kind_of_partition=KINDS)
    jobs = {j.job_id: j for j in replay.jobs}
    by_id = {r.job_id: r for r in records}
    array = sorted(j for j in jobs if j.startswith(job("array of 3 tasks") + "_"))
    assert len(array) == 3  # each task its own job
    for task in array:
        j = jobs[task]
        assert (j.kind, j.duration_s, j.gpus_per_node, j.nodes) == ("training", 20.0, 1, 1)
    two = jobs[job("2 nodes on train")]
    assert (two.nodes, two.gpus_per_node, two.duration_s) == (2, 2, 30.0)
    # requeued once: submitted when its first run was, as long as its last run
    elastic_id = job("requeued once")
    runs = [r for r in records if r.job_id == elastic_id]
    assert [r.state for r in runs] == ["REQUEUED", "COMPLETED"]
    el = jobs[elastic_id]
    assert el.kind == "elastic" and el.duration_s == 40.0 and el.gpus_per_node == 4
    first = min(r.submit for r in runs if r.submit)
    assert el.submit_s == (first - START).total_seconds()
    # held by --begin: it arrives when it became eligible, a minute after its submit
    held = job("held by --begin=now+60")
    rec = by_id[held]
    assert rec.eligible is not None and rec.submit is not None
    assert (rec.eligible - rec.submit).total_seconds() >= 59
    assert jobs[held].submit_s == (rec.eligible - START).total_seconds()
    # still running: its elapsed time so far
    running = job("still running")
    assert by_id[running].end is None
    assert jobs[running].duration_s == by_id[running].elapsed_s
    # the bridge's Triton servers are not batch work; the restarted one, running, has no
    # comment in sacct yet (slurmdbd stores it later) and is known by its partition
    servers = [j for j, role in CAPTURE["jobs"].items() if role.startswith("Triton")]
    assert not set(servers) & set(jobs)
    about = replay.about
    assert about["jobs"] == len(jobs) == 3 + 1 + 1 + 1 + 1
    assert (about["training"], about["elastic"]) == (6, 1)
    assert (about["requeued"], about["array_tasks"], about["multi_node"]) == (1, 3, 1)
    assert (about["running_at_end"], about["carried_in"]) == (1, 0)
    left = about["left_out"]
    assert isinstance(left, dict)
    assert left["in an inference partition"] == 1  # the running server
    assert left["serving (the bridge's Triton jobs: stb:triton, workload inference)"] >= 1
    assert left["over before the window"] >= 1  # the earlier capture's training job


def test_a_job_running_at_the_start_is_carried_in_with_what_is_left() -> None:
    records = read_sacct_files([SITE])
    running = job("still running")
    rec = next(r for r in records if r.job_id == running)
    assert rec.start is not None
    start = rec.start + timedelta(seconds=100)
    replay = replay_records(
        records, start=start, end=start + timedelta(hours=1), kind_of_partition=KINDS
    )
    carried = next(j for j in replay.jobs if j.job_id == running)
    assert carried.submit_s == 0.0 and carried.duration_s == rec.elapsed_s - 100
    assert replay.about["carried_in"] >= 1
    # a window that ends before a job arrives leaves it out
    early = replay_records(records, start=START, end=rec.start, kind_of_partition=KINDS)
    assert running not in {j.job_id for j in early.jobs}
    assert early.about["left_out"]["submitted after the window"] >= 1  # type: ignore[index]


def test_the_earlier_requeue_recording() -> None:
    """22.05's second run of the preempted job 8 was cancelled as it started (elapsed 0):
    the run that ran is the job's length; job 14 never ran; the servers are left out."""
    records = read_sacct_files([REQUEUE])
    start = datetime(2026, 11, 29, 14, 10, tzinfo=UTC)
    replay = replay_records(
        records, start=start, end=start + timedelta(minutes=20), kind_of_partition=KINDS
    )
    assert [(j.job_id, j.kind, j.duration_s, j.gpus) for j in replay.jobs] == [
        ("6", "training", 3.0, 2),
        ("8", "elastic", 23.0, 4),
        ("10", "training", 3.0, 2),
    ]
    assert replay.about["left_out"] == {
        "never ran (pending, or cancelled before it started)": 1,
        "serving (the bridge's Triton jobs: stb:triton, workload inference)": 9,
    }
    assert (
        jobs_from_records(
            records, start=start, end=start + timedelta(minutes=20), kind_of_partition=KINDS
        )
        == replay.jobs
    )
    assert record_span(records) == (
        datetime(2026, 11, 29, 14, 11, 42, tzinfo=UTC),
        datetime(2026, 11, 29, 14, 20, 4, tzinfo=UTC),
    )


def test_an_id_slurm_gave_again_is_another_job() -> None:
    """The two recordings come from two lab clusters two days apart whose slurmdbd started
    its ids over: ids 6, 10, 11 and 14 name a job in each. A requeue resubmits as its run
    ends; a run submitted hours after the last one of its id is another job."""
    records = read_sacct_files([REQUEUE, SITE])
    start = datetime(2026, 11, 29, tzinfo=UTC)
    replay = replay_records(records, start=start, end=END, kind_of_partition=KINDS)
    jobs = {j.job_id: j for j in replay.jobs}
    assert replay.about["reused_ids"] == 4
    assert jobs["6"].duration_s == 3.0 and jobs["6#2"].duration_s == 202.0  # Nov 29, Dec 1
    assert "10" in jobs and "10#2" not in jobs  # the second job 10 is a Triton server
    # job 14: pending on Nov 29 (never ran), an elastic job requeued once on Dec 1
    assert "14" not in jobs and jobs["14#2"].duration_s == 40.0
    alone = replay_records(read_sacct_files([SITE]), start=start, end=END, kind_of_partition=KINDS)
    assert jobs["14#2"].submit_s == next(j for j in alone.jobs if j.job_id == "14").submit_s
    assert replay.about["requeued"] == 2  # 8 (Nov 29) and 14 (Dec 1), nothing more


def test_a_run_read_twice_takes_its_latest_reading(tmp_path: Path) -> None:
    """Two exports that overlap hold the same run: once running, once ended."""
    doc = json.loads(SITE.read_text())
    running = job("still running")
    later = json.loads(SITE.read_text())
    for j in later["jobs"]:
        if str(j["job_id"]) == running:
            j["state"]["current"] = "COMPLETED"
            j["time"]["end"] = j["time"]["start"] + 600
            j["time"]["elapsed"] = 600
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "b.json").write_text(json.dumps(later))
    replay = replay_sacct_files(
        [tmp_path / "a.json", tmp_path / "b.json"], start=START, end=END, kind_of_partition=KINDS
    )
    assert next(j for j in replay.jobs if j.job_id == running).duration_s == 600.0
    assert replay.about["running_at_end"] == 0 and replay.about["files"] == ["a.json", "b.json"]


def test_a_partition_of_no_known_kind_is_named_with_a_job() -> None:
    records = read_sacct_files([SITE])
    with pytest.raises(InputError) as err:
        replay_records(records, start=START, end=END, kind_of_partition={"elastic": "elastic"})
    # the jobs whose workload tag slurmdbd has not stored yet (both running)
    restarted = job("restarted")
    assert (
        "GPU jobs in partitions whose kind is not known: 'infer' (1 job, e.g. "
        f"{restarted}); 'train' (1 job, e.g. {job('still running')})"
    ) in str(err.value)
    assert "--partition-kind PART=KIND" in str(err.value)
    # the workload tag decides before the partition: re-tagged, they need no map
    for_tags = replay_records(
        [r for r in records if "stb:workload=training" in r.comment],
        start=START,
        end=END,
        kind_of_partition={},
    )
    assert for_tags.jobs and all(j.kind == "training" for j in for_tags.jobs)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "cannot parse sacct --json output (empty)"),
        ('{"jobs": [{"job_id": 1, "state": "COMPLETED"', "truncated?"),
        ("[]", "not a JSON object"),
        ('{"jobs": {}}', "'jobs' is not a list"),
        (
            '{"jobs": [], "errors": '
            '[{"error": "Unable to contact slurm controller", "error_number": -1}]}',
            "Unable to contact slurm controller",
        ),
    ],
)
def test_hostile_sacct_files_are_named_and_the_parser_quoted(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "sacct.json"
    path.write_text(text)
    with pytest.raises(
        InputError, match=re.escape(f"sacct file {path}: ") + ".*" + re.escape(message)
    ):
        read_sacct_files([path])


def test_missing_files_and_windows() -> None:
    with pytest.raises(InputError, match="cannot read it"):
        read_sacct_files([Path("/nonexistent/sacct.json")])
    with pytest.raises(InputError, match="no file given"):
        read_sacct_files([])
    records = read_sacct_files([REQUEUE])
    with pytest.raises(InputError, match="has no time zone"):
        replay_records(records, start=datetime(2026, 11, 29), end=END, kind_of_partition=KINDS)
    with pytest.raises(InputError, match="the window ends"):
        replay_records(records, start=END, end=START, kind_of_partition=KINDS)
