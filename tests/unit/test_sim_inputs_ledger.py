"""Batch jobs for the simulator from the GPU-hour ledger (`replay_ledger`, `stb simulate
--jobs ledger`): the real lab's sacct records (tests/data/site/, tests/data/slurm/) are
booked into a SQLite ledger by the ledger's own ingest, then read back. The jobs are
sacct's own (`replay_records` of the same records: kinds, nodes, GPUs per node,
durations), arriving at their first run's start instead of their submit; what the
ledger cannot say is said; hostile ledgers and windows are refused by name."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from accounting.attribution import Context
from accounting.db import current_revision, open_ledger, upgrade
from accounting.ingest import ingest_records
from bridge.cli import app
from bridge.config import BridgeConfig
from bridge.db import make_engine
from bridge.leases.store import create_schema
from bridge.sim.inputs import (
    InputError,
    JobReplay,
    partition_kinds,
    read_sacct_files,
    replay_ledger,
    replay_records,
)
from bridge.sim.inputs.common import iso
from bridge.slurm.model import AccountingRecord

DATA = Path(__file__).resolve().parents[1] / "data"
SITE = DATA / "site" / "sacct-site-22.05.json"
REQUEUE = DATA / "slurm" / "sacct-requeue-22.05.json"
CAPTURE = json.loads((DATA / "site" / "captures.json").read_text())
START = datetime.fromtimestamp(CAPTURE["capture_started"], tz=UTC)
END = START + timedelta(hours=1)
KINDS = partition_kinds(BridgeConfig())
#: the ledger's workloads of the bridge's default partitions (as `bridge.ledger.feed` maps them)
WORKLOADS = {"train": "training", "elastic": "elastic", "infer": "inference"}
SERVING = "serving (the bridge's Triton jobs: stb:triton, workload inference)"
RUN = CliRunner()


def job(role: str) -> str:
    (found,) = [j for j, said in CAPTURE["jobs"].items() if role in said]
    return str(found)


def book(path: Path, records: list[AccountingRecord]) -> str:
    """A SQLite ledger at `path` holding `records`, booked by the ledger's own ingest up
    to the moment sacct was read (a running job's elapsed time so far); its URL."""
    running = [r for r in records if r.end is None and r.start is not None]
    read_at = max(
        (r.start + timedelta(seconds=r.elapsed_s) for r in running if r.start),
        default=max(r.end for r in records if r.end),
    )
    url = f"sqlite:///{path}"
    engine = open_ledger(url)
    ctx = Context(workload_of_partition=WORKLOADS, horizon=read_at)
    ingest_records(engine, records, ctx, now=read_at)
    engine.dispose()
    return url


@pytest.fixture
def site(tmp_path: Path) -> str:
    return book(tmp_path / "ledger.db", read_sacct_files([SITE]))


def first_starts(records: list[AccountingRecord]) -> dict[str, datetime]:
    out: dict[str, datetime] = {}
    for r in records:
        if r.start is not None and r.elapsed_s > 0:
            out[r.job_id] = min(out.get(r.job_id, r.start), r.start)
    return out


def same_jobs(
    ledger: JobReplay, sacct: JobReplay, records: list[AccountingRecord], start: datetime
) -> None:
    """The ledger's jobs are sacct's, each arriving at its first run's start."""
    shape = {j.job_id: (j.kind, j.nodes, j.gpus_per_node, j.duration_s) for j in sacct.jobs}
    assert {j.job_id: (j.kind, j.nodes, j.gpus_per_node, j.duration_s) for j in ledger.jobs} == (
        shape
    )
    first = first_starts(records)
    for j in ledger.jobs:
        assert j.submit_s == max(0.0, (first[j.job_id] - start).total_seconds()), j


@pytest.mark.parametrize("shift_s", [None, 100.0])
def test_the_site_capture_from_the_ledger_is_sacct_s_jobs_arriving_at_their_start(
    site: str, shift_s: float | None
) -> None:
    records = read_sacct_files([SITE])
    start = START
    if shift_s is not None:  # a window that starts while job 16 runs: carried in
        (running,) = [r for r in records if r.job_id == job("still running")]
        assert running.start is not None
        start = running.start + timedelta(seconds=shift_s)
    end = start + timedelta(hours=1)
    sacct = replay_records(records, start=start, end=end, kind_of_partition=KINDS)
    ledger = replay_ledger(site, start=start, end=end, kind_of_partition=KINDS)
    same_jobs(ledger, sacct, records, start)
    about = ledger.about
    same = ("jobs", "training", "elastic", "requeued", "array_tasks", "multi_node", "carried_in")
    for key in (*same, "running_at_end"):
        assert about[key] == sacct.about[key], key
    assert about["running_at_end"] == 1 and about["carried_in"] == (2 if shift_s else 0)
    assert about["source"] == "ledger" and about["ledger"] == "ledger.db"
    assert about["window"] == [iso(start), iso(end)]
    assert about["gpus_inconsistent"] == {"runs": 0}
    assert "queueing seen at the site before a job started is not replayed" in str(about["arrival"])
    # both Triton servers are serving: the restarted one by its partition (no tag yet)
    assert about["left_out"][SERVING] >= 2  # type: ignore[index]
    if shift_s is None:  # the arrival is the start, not the submit or eligible time
        by_id = {j.job_id: j for j in ledger.jobs}
        waited = by_id[job("2 nodes on train")]
        held = by_id[job("held by --begin=now+60")]
        sacct_by_id = {j.job_id: j for j in sacct.jobs}
        assert waited.submit_s > sacct_by_id[waited.job_id].submit_s
        assert held.submit_s > sacct_by_id[held.job_id].submit_s


def test_the_earlier_requeue_recording_from_the_ledger(tmp_path: Path) -> None:
    """Job 8's second run was cancelled as it started: no ledger row, but still a run
    of the job (requeued); job 14 never ran and is not in the ledger at all."""
    records = read_sacct_files([REQUEUE])
    url = book(tmp_path / "requeue.db", records)
    start = datetime(2026, 11, 29, 14, 10, tzinfo=UTC)
    end = start + timedelta(minutes=20)
    sacct = replay_records(records, start=start, end=end, kind_of_partition=KINDS)
    ledger = replay_ledger(url, start=start, end=end, kind_of_partition=KINDS)
    same_jobs(ledger, sacct, records, start)
    assert [j.job_id for j in ledger.jobs] == ["6", "8", "10"]
    assert ledger.about["requeued"] == 1
    assert ledger.about["left_out"] == {SERVING: 9}  # sacct's "never ran" is not booked


def test_a_requeued_run_that_waited_hours_is_still_its_job(tmp_path: Path) -> None:
    """Slurm resubmits a requeued job as its run ends: in the ledger (no submit time)
    its next run, hours later, is the same job, not an id given again."""
    records = read_sacct_files([SITE])
    elastic = job("requeued once")
    late = timedelta(hours=3)
    moved = [
        replace(r, start=r.start + late, end=r.end + late, submit=r.submit + late)
        if r.job_id == elastic and r.state == "COMPLETED" and r.start and r.end and r.submit
        else r
        for r in records
    ]
    url = book(tmp_path / "late.db", moved)
    ledger = replay_ledger(url, start=START, end=END + late, kind_of_partition=KINDS)
    jobs = {j.job_id: j for j in ledger.jobs}
    assert f"{elastic}#2" not in jobs
    first = first_starts(moved)[elastic]
    assert jobs[elastic].submit_s == (first - START).total_seconds()
    assert jobs[elastic].duration_s == 40.0  # its last run's
    assert ledger.about["requeued"] == 1 and ledger.about["reused_ids"] == 0


def test_ids_slurm_gave_again_in_one_ledger(tmp_path: Path) -> None:
    """Both recordings in one ledger (two lab clusters whose ids started over): each id
    a job per life, as with sacct's, but job 14's first life never ran (not booked), so
    its second is plain 14."""
    records = read_sacct_files([REQUEUE, SITE])
    url = book(tmp_path / "both.db", records)
    start = datetime(2026, 11, 29, tzinfo=UTC)
    sacct = replay_records(records, start=start, end=END, kind_of_partition=KINDS)
    ledger = replay_ledger(url, start=start, end=END, kind_of_partition=KINDS)
    renamed = {j.job_id.replace("14#2", "14"): j for j in sacct.jobs}
    assert {j.job_id: (j.kind, j.duration_s, j.gpus) for j in ledger.jobs} == {
        name: (j.kind, j.duration_s, j.gpus) for name, j in renamed.items()
    }
    assert ledger.about["reused_ids"] == 3 and sacct.about["reused_ids"] == 4
    assert ledger.about["requeued"] == 2


def test_a_window_narrower_than_the_ledger_reads_only_its_jobs(site: str) -> None:
    """Rows are by hour: a run of the window's first hour that ended before the window is
    counted as over before it, not replayed."""
    ledger = replay_ledger(site, start=START, end=END, kind_of_partition=KINDS)
    assert job("still running") in {j.job_id for j in ledger.jobs}
    assert ledger.about["left_out"]["over before the window"] == 1  # type: ignore[index]


def test_a_missing_file_is_named_and_not_made(tmp_path: Path) -> None:
    gone = tmp_path / "gone.db"
    with pytest.raises(InputError, match=re.escape(f"ledger: no database file {gone}")):
        replay_ledger(f"sqlite:///{gone}", start=START, end=END, kind_of_partition=KINDS)
    assert not gone.exists()


def test_a_ledger_at_an_old_revision_is_refused_not_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine, "0005")
    with pytest.raises(InputError) as err:
        replay_ledger(f"sqlite:///{path}", start=START, end=END, kind_of_partition=KINDS)
    assert "its schema is at revision 0005, not 0008: run `stb accounting migrate`" in str(
        err.value
    )
    assert str(path) in str(err.value)
    assert current_revision(engine) == "0005"
    engine.dispose()


def test_a_database_that_holds_no_ledger_or_is_no_database(tmp_path: Path) -> None:
    """The bridge's lease store (its database_url, not its ledger_url), and a file that
    is no database at all."""
    bridge_db = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(bridge_db)
    bridge_db.dispose()
    with pytest.raises(
        InputError, match=r"bridge\.db: holds no ledger \(no ledger_alembic_version"
    ):
        replay_ledger(
            f"sqlite:///{tmp_path / 'bridge.db'}", start=START, end=END, kind_of_partition=KINDS
        )
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(InputError, match=r"junk\.db: cannot read its jobs: .*not a database"):
        replay_ledger(f"sqlite:///{junk}", start=START, end=END, kind_of_partition=KINDS)


def test_a_window_with_no_rows_says_what_the_ledger_holds(site: str) -> None:
    early = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(InputError) as err:
        replay_ledger(site, start=early, end=early + timedelta(days=1), kind_of_partition=KINDS)
    said = str(err.value)
    assert "no sacct run booked in the window 2026-01-01T00:00:00Z to 2026-01-02T00:00:00Z" in said
    assert "its runs span 2026-12-01T08:" in said
    with pytest.raises(InputError, match="has no time zone"):
        replay_ledger(site, start=datetime(2026, 12, 1), end=END, kind_of_partition=KINDS)
    with pytest.raises(InputError, match="the window ends"):
        replay_ledger(site, start=END, end=START, kind_of_partition=KINDS)


def test_rows_of_a_workload_and_partition_of_no_known_kind_are_named(site: str) -> None:
    """A ledger written by something else: a workload that is no batch kind falls back on
    the partition's, and a partition of no known kind is named with a job of it."""
    held = job("held by --begin=now+60")
    engine = make_engine(site)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE ledger_row SET workload = 'batch', partition = 'debug' WHERE source LIKE :k"
            ),
            {"k": f"%:{held}:%"},
        )
    engine.dispose()
    with pytest.raises(InputError) as err:
        replay_ledger(site, start=START, end=END, kind_of_partition=KINDS)
    assert (f"GPU jobs in partitions whose kind is not known: 'debug' (1 job, e.g. {held})") in str(
        err.value
    )
    known = replay_ledger(
        site, start=START, end=END, kind_of_partition={**KINDS, "debug": "elastic"}
    )
    assert next(j for j in known.jobs if j.job_id == held).kind == "elastic"


def test_gpu_time_that_is_not_whole_gpus_is_said(site: str) -> None:
    two = job("2 nodes on train")
    engine = make_engine(site)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE ledger_row SET gpu_ms = gpu_ms + 7 WHERE source LIKE :k"),
            {"k": f"%:{two}:%"},
        )
    engine.dispose()
    ledger = replay_ledger(site, start=START, end=END, kind_of_partition=KINDS)
    odd = ledger.about["gpus_inconsistent"]
    assert isinstance(odd, dict) and odd["runs"] == 1
    assert re.search(rf":{two}:\d+: a row of hour .* holds 2\.000 GPUs", odd["e.g."])
    jobs = {j.job_id: j for j in ledger.jobs}
    assert (jobs[two].nodes, jobs[two].gpus_per_node) == (2, 2)  # rounded


def test_stb_simulate_jobs_ledger_end_to_end(site: str, tmp_path: Path) -> None:
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(f'[accounting]\nledger_url = "{site}"\n')
    out = tmp_path / "sim.json"
    window = ["--until", "2026-12-01T09:00:00Z", "--days", "0.05"]
    small = ["--nodes", "6", "--gpus-per-node", "4", "--mean-rps", "1", "--models", "1"]
    args = ["simulate", "--jobs", "ledger", *window, *small, "--tradeoff", "none"]
    res = RUN.invoke(app, [*args, "--config", str(cfg), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())["scenario"]
    jobs = s["batch_jobs"]
    # the capture's 7 and job 6 of the capture before it (08:38 to 08:42)
    assert (jobs["source"], jobs["ledger"], jobs["jobs"], s["jobs"]) == (
        "ledger",
        "ledger.db",
        8,
        8,
    )
    assert s["window"] == ["2026-12-01T07:48:00Z", "2026-12-01T09:00:00Z"]
    assert "not replayed" in jobs["arrival"] and s["load"] is None
    assert str(tmp_path) not in out.read_text()
    # --ledger-url instead of --config; the table names the source
    table = RUN.invoke(app, [*args, "--ledger-url", site, "--policies", "bridge"])
    assert table.exit_code == 0, table.output
    assert "ledger jobs" in table.stdout
    # without a ledger to read, or a ledger URL nothing reads: one line, exit 2
    for bad, message in [
        ([], "--jobs ledger reads the bridge's database: give --config FILE"),
        (
            ["--jobs", "synthetic", "--ledger-url", site],
            "--ledger-url is read only with --jobs ledger",
        ),
        (["--ledger-url", f"sqlite:///{tmp_path / 'gone.db'}"], "ledger: no database file"),
    ]:
        res = RUN.invoke(app, [*args, *bad])
        assert res.exit_code == 2 and message in res.output, res.output
