"""The Slurm adapter's contract, against the real lab controller, for every backend that
imports on this machine (the CLI backend always; pyslurm where its libslurm matches)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bridge.lab.spec import LabSpec
from bridge.slurm import (
    AccountingRecord,
    CommandRejected,
    ControllerUnreachable,
    Job,
    JobSpec,
    SlurmProtocol,
)
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.select import open_backend

pytestmark = pytest.mark.lab


def _backends() -> list[str]:
    names = ["cli"]
    try:
        import pyslurm  # noqa: F401

        names.append("pyslurm")
    except ImportError:
        pass
    return names


@pytest.fixture(params=_backends())
def slurm(request: pytest.FixtureRequest, lab: LabSpec) -> SlurmProtocol:
    return open_backend(request.param, env=lab.env())


@pytest.fixture
def cleanup(slurm: SlurmProtocol) -> Iterator[list[str]]:
    jobs: list[str] = []
    yield jobs
    for job_id in jobs:
        slurm.cancel(job_id)


def _wait(what: str, cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout_s}s")


def _job(slurm: SlurmProtocol, job_id: str) -> Job | None:
    return next((j for j in slurm.jobs() if j.job_id == job_id), None)


def _state(slurm: SlurmProtocol, job_id: str) -> str:
    job = _job(slurm, job_id)
    return job.state if job else ""


def test_version_and_inventory(slurm: SlurmProtocol, lab: LabSpec) -> None:
    assert slurm.version().split(".")[0].isdigit()
    nodes = {n.name: n for n in slurm.nodes()}
    assert set(nodes) == {n.name for n in lab.nodes}
    for spec_node in lab.nodes:
        node = nodes[spec_node.name]
        assert node.addr == spec_node.addr
        assert node.gpus == lab.gpus_per_node
        assert node.gpu_type == lab.gpu_type
    assert nodes[lab.pool_nodes("elastic")[0].name].partitions == ("elastic", "infer")
    parts = {p.name: p for p in slurm.partitions()}
    assert parts["infer"].priority_tier > parts["elastic"].priority_tier
    assert parts["infer"].allow_accounts == ("bridge",)
    assert parts["elastic"].preempt_mode == "REQUEUE"
    assert parts["elastic"].grace_time_s == lab.grace_time_s
    assert set(parts["infer"].nodes) == {n.name for n in lab.partition_nodes("infer")}


def test_drain_then_resume(slurm: SlurmProtocol, lab: LabSpec) -> None:
    name = lab.pool_nodes("train")[-1].name
    try:
        slurm.drain(name, "contract test")
        slurm.drain(name, "stb: contract test")  # draining twice is harmless
        node = next(n for n in slurm.nodes() if n.name == name)
        assert node.drained and node.fenced_by_bridge
        assert node.reason == "stb: contract test"
    finally:
        slurm.resume(name)
    node = next(n for n in slurm.nodes() if n.name == name)
    assert not node.drained and node.reason == ""
    slurm.resume(name)  # resuming a node that is not drained is harmless


def test_submit_list_and_cancel(slurm: SlurmProtocol, lab: LabSpec, cleanup: list[str]) -> None:
    node = lab.pool_nodes("train")[0].name
    job_id = slurm.submit(
        JobSpec(
            partition="train",
            account="team-vision",
            wrap="sleep 120",
            name="contract",
            comment="stb:contract",
            nodelist=(node,),
            gpus_per_node=2,
            output=str(lab.log_dir / "contract-%j.out"),
        )
    )
    cleanup.append(job_id)
    _wait("the job runs", lambda: _state(slurm, job_id) == "RUNNING")
    tagged = slurm.jobs(tag="stb:contract", states=["RUNNING"])
    assert [j.job_id for j in tagged] == [job_id]
    job = tagged[0]
    assert (job.partition, job.account, job.nodes, job.gpus) == ("train", "team-vision", (node,), 2)
    assert job.start_time is not None and job.start_time.tzinfo is not None
    assert job_id in {j.job_id for j in slurm.jobs(node=node)}
    assert job_id not in {j.job_id for j in slurm.jobs(partition="elastic")}
    allocated = next(n for n in slurm.nodes() if n.name == node)
    assert allocated.gpus_alloc >= 2
    slurm.cancel(job_id)
    _wait("the job ends", lambda: _state(slurm, job_id) not in ("RUNNING", "PENDING"))
    slurm.cancel(job_id)  # cancelling a finished job is harmless


def test_rejected_submission_quotes_slurm(slurm: SlurmProtocol) -> None:
    with pytest.raises(CommandRejected, match=r"(?i)invalid account"):
        slurm.submit(JobSpec(partition="infer", account="team-nlp", wrap="true"))


def test_reservation_create_list_delete(slurm: SlurmProtocol, lab: LabSpec) -> None:
    name = "stb-contract-resv"
    node = lab.pool_nodes("train")[0].name
    slurm.delete_reservation(name)
    slurm.create_reservation(name, [node], duration_s=600, users=["root"])
    try:
        resv = next(r for r in slurm.reservations() if r.name == name)
        assert resv.nodes == (node,)
        assert {"MAINT", "IGNORE_JOBS"} <= resv.flags
        assert resv.start is not None and resv.end is not None
        assert timedelta(minutes=9) < resv.end - resv.start <= timedelta(minutes=11)
        with pytest.raises(CommandRejected):
            slurm.create_reservation(name, [node], duration_s=600, users=["root"])
    finally:
        slurm.delete_reservation(name)
    assert name not in {r.name for r in slurm.reservations()}
    slurm.delete_reservation(name)  # deleting a missing reservation is harmless


def test_requeued_job_has_one_accounting_record_per_run(
    slurm: SlurmProtocol, lab: LabSpec, cleanup: list[str]
) -> None:
    since = datetime.now(UTC) - timedelta(seconds=5)
    job_id = slurm.submit(
        JobSpec(
            partition="train",
            account="team-research",
            wrap="sleep 120",
            requeue=True,
            gpus_per_node=1,
            output=str(lab.log_dir / "contract-%j.out"),
        )
    )
    cleanup.append(job_id)
    _wait("the job runs", lambda: _state(slurm, job_id) == "RUNNING")
    time.sleep(2)
    slurm.requeue(job_id)
    _wait("the job is pending again", lambda: _state(slurm, job_id) == "PENDING")
    job = _job(slurm, job_id)
    assert job is not None and job.restarts == 1

    # Slurm makes the requeued run eligible about two minutes later: a window that
    # reaches past that sees both runs.
    def runs() -> list[AccountingRecord]:
        until = datetime.now(UTC) + timedelta(minutes=5)
        return [r for r in slurm.accounting(since, until) if r.job_id == job_id]

    _wait("sacct shows both runs", lambda: len(runs()) == 2, timeout_s=30)
    recs = runs()
    first, second = sorted(recs, key=lambda r: r.submit or since)
    assert first.state == "REQUEUED" and second.state == "PENDING"
    assert first.gpus == 1 and first.gpu_type == lab.gpu_type
    assert first.start is not None and first.end is not None
    assert first.start.tzinfo == UTC
    assert 1 <= first.elapsed_s <= 60
    assert first.key != second.key


def test_unreachable_controller_is_transient(lab: LabSpec, tmp_path: Path) -> None:
    conf = lab.slurm_conf.read_text().replace(f"SlurmctldPort={lab.ctld_port}", "SlurmctldPort=1")
    (tmp_path / "slurm.conf").write_text(conf)
    (tmp_path / "gres.conf").write_text((lab.etc / "gres.conf").read_text())
    dead = SlurmCLI(env=lab.env() | {"SLURM_CONF": str(tmp_path / "slurm.conf")}, timeout_s=60)
    with pytest.raises(ControllerUnreachable) as err:
        dead.nodes()
    assert err.value.transient
