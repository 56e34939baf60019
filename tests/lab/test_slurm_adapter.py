"""The Slurm adapter's contract, against the real lab controller, for every backend that
works on this machine: the CLI backend always; the slurmrestd backend where slurmrestd and
the auth/jwt plugin are installed (`stb lab up` installs them, and runs slurmrestd on the
lab's loopback port); pyslurm where its libslurm matches."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bridge.lab import lab as lab_mod
from bridge.lab import system
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
from bridge.slurm.model import ReservationSpec
from bridge.slurm.rest import RestSettings, SlurmRest, UnsupportedApi
from bridge.slurm.select import open_backend

pytestmark = pytest.mark.lab

_NO_RESTD = "slurmrestd or the auth/jwt plugin (slurm-wlm-jwt-plugin) is not installed"


@pytest.fixture
def _needs_rest(lab: LabSpec) -> None:
    """slurmrestd and its plugin, looked for when the test runs (after `stb lab up`, which
    installs them on a fresh machine), not when it is collected."""
    if not system.rest_available():
        pytest.skip(_NO_RESTD)


_NEEDS_REST = pytest.mark.usefixtures("_needs_rest")


def _backends() -> list[object]:
    names: list[object] = ["cli", "rest"]
    try:
        import pyslurm  # noqa: F401

        names.append("pyslurm")
    except ImportError:
        pass
    return names


def _rest(lab: LabSpec, settings: RestSettings | None = None) -> SlurmRest:
    """The rest backend on the lab's slurmrestd; the test skips where that slurmrestd
    serves no OpenAPI version the backend speaks (a newer Slurm, in the release matrix)."""
    if not system.rest_available():
        pytest.skip(_NO_RESTD)
    rest = SlurmRest(settings or RestSettings.from_env(lab.rest_env()), env=lab.env())
    try:
        rest.api_version()
    except UnsupportedApi as exc:
        pytest.skip(f"the lab's slurmrestd speaks no version of this backend: {exc}")
    return rest


@pytest.fixture(params=_backends())
def slurm(request: pytest.FixtureRequest, lab: LabSpec) -> SlurmProtocol:
    if request.param == "rest":
        return _rest(lab)
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
    # every node, the one of MIG slices in its hidden partition too (scontrol --all)
    assert set(nodes) == {n.name for n in lab.all_nodes}
    for spec_node in lab.nodes:
        node = nodes[spec_node.name]
        assert node.addr == spec_node.addr
        assert node.gpus == lab.gpus_per_node
        assert node.gpu_type == lab.gpu_type
    assert nodes[lab.pool_nodes("elastic")[0].name].partitions == ("elastic", "infer", "scavenger")
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


def test_script_directives_apply_and_the_spec_wins(
    slurm: SlurmProtocol, lab: LabSpec, cleanup: list[str], tmp_path: Path
) -> None:
    """A batch script's #SBATCH lines count (sbatch reads them; the REST backend reads them
    for slurmrestd), and the spec's own settings win over them, as sbatch's command line
    does; the spec's environment reaches the job."""
    script = tmp_path / "contract.sbatch"
    script.write_text(
        "#!/bin/sh\n"
        "#SBATCH --job-name=contract-script\n"
        "#SBATCH --comment=stb:contract-script\n"
        "#SBATCH --partition=elastic  # the spec says train\n"
        'echo "marker=$STB_CONTRACT_MARKER"\n'
        "sleep 120\n"
    )
    out = lab.log_dir / f"contract-script-{time.monotonic_ns()}.out"
    node = lab.pool_nodes("train")[0].name
    job_id = slurm.submit(
        JobSpec(
            partition="train",
            account="team-vision",
            script=str(script),
            nodelist=(node,),
            gpus_per_node=1,
            output=str(out),
            env={"STB_CONTRACT_MARKER": "m-42"},
        )
    )
    cleanup.append(job_id)
    _wait("the job runs", lambda: _state(slurm, job_id) == "RUNNING")
    job = _job(slurm, job_id)
    assert job is not None
    assert (job.name, job.partition, job.tags) == (
        "contract-script",
        "train",
        ("stb:contract-script",),
    )
    _wait("the job writes its output", lambda: out.exists() and "marker=" in out.read_text())
    assert out.read_text().splitlines()[0] == "marker=m-42"
    slurm.cancel(job_id)
    out.unlink(missing_ok=True)


def test_signal_reaches_the_batch_script(
    slurm: SlurmProtocol, lab: LabSpec, cleanup: list[str]
) -> None:
    """`cancel(signal=...)` signals the job's batch shell (the Triton script drains on
    TERM), and the job goes on running until it acts on it."""
    out = lab.log_dir / f"contract-signal-{time.monotonic_ns()}.out"
    job_id = slurm.submit(
        JobSpec(
            partition="train",
            account="team-vision",
            wrap="trap 'echo got-usr1' USR1; for i in $(seq 240); do sleep 0.5; done",
            gpus_per_node=1,
            output=str(out),
        )
    )
    cleanup.append(job_id)
    _wait("the job runs", lambda: _state(slurm, job_id) == "RUNNING")
    time.sleep(1)  # the trap is set
    slurm.cancel(job_id, signal="USR1")
    _wait("the script saw the signal", lambda: out.exists() and "got-usr1" in out.read_text())
    assert _state(slurm, job_id) == "RUNNING"
    slurm.cancel(job_id)
    _wait("the job ends", lambda: _state(slurm, job_id) not in ("RUNNING", "PENDING"))
    out.unlink(missing_ok=True)


def test_rejected_submission_quotes_slurm(slurm: SlurmProtocol) -> None:
    with pytest.raises(CommandRejected, match=r"(?i)invalid account"):
        slurm.submit(JobSpec(partition="infer", account="team-nlp", wrap="true"))


def test_reservation_create_list_delete(slurm: SlurmProtocol, lab: LabSpec) -> None:
    name = "stb-contract-resv"
    node = lab.pool_nodes("train")[0].name
    slurm.delete_reservation(name)
    spec = ReservationSpec(name, (node,), duration_s=600, users=("root",))
    slurm.create_reservation(spec)
    try:
        resv = next(r for r in slurm.reservations() if r.name == name)
        assert resv.nodes == (node,)
        assert {"MAINT", "IGNORE_JOBS"} <= resv.flags
        assert resv.start is not None and resv.end is not None
        assert timedelta(minutes=9) < resv.end - resv.start <= timedelta(minutes=11)
        with pytest.raises(CommandRejected):
            slurm.create_reservation(spec)
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

    # Slurm makes the requeued run eligible 31 s later (the lab's cred_expire + 1): a window that
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@_NEEDS_REST
def test_unreachable_rest_server_is_transient(lab: LabSpec) -> None:
    settings = RestSettings(url=f"http://127.0.0.1:{_free_port()}", user="root", timeout_s=5)
    with pytest.raises(ControllerUnreachable) as err:
        SlurmRest(settings, env=lab.env()).nodes()
    assert err.value.transient and "127.0.0.1" in str(err.value)


@_NEEDS_REST
def test_rest_with_the_controller_down_is_transient(lab: LabSpec, tmp_path: Path) -> None:
    """A slurmrestd of its own whose slurm.conf names a dead slurmctld port: reads and
    writes say the controller did not answer (slurmrestd 22.05: HTTP 500, "Unspecified
    error" for reads, "Unable to contact slurm controller" for writes)."""
    _rest(lab)  # the lab's slurmrestd, the same binary, speaks the backend's version
    conf = lab.slurm_conf.read_text().replace(f"SlurmctldPort={lab.ctld_port}", "SlurmctldPort=1")
    (tmp_path / "slurm.conf").write_text(conf)
    (tmp_path / "gres.conf").write_text((lab.etc / "gres.conf").read_text())
    port = _free_port()
    # pytest's tmp_path is under a 0700 folder: this also runs the lab's root fallback
    daemon = lab_mod.rest_daemon(tmp_path / "slurm.conf", port)
    assert daemon.user == "root" and daemon.env["SLURMRESTD_SECURITY"] == "disable_user_check"
    proc = subprocess.Popen(
        daemon.argv,
        env=lab.env() | daemon.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait("slurmrestd listens", lambda: system.port_open("127.0.0.1", port), 10)
        # the lab's slurmctld mints the token; the private slurmrestd cannot reach it
        dead = SlurmRest(RestSettings(url=f"http://127.0.0.1:{port}", user="root"), env=lab.env())
        with pytest.raises(ControllerUnreachable, match="Unspecified error"):
            dead.nodes()
        with pytest.raises(ControllerUnreachable, match=r"(?i)unable to contact slurm controller"):
            dead.submit(JobSpec(partition="train", account="team-vision", wrap="true"))
    finally:
        proc.terminate()
        proc.wait(10)


@_NEEDS_REST
def test_rest_reads_agree_with_the_cli(lab: LabSpec) -> None:
    """The same cluster state read through slurmrestd and through the command line gives
    the same records: nodes (one drained, one running a job), partitions, a reservation,
    the queue, and slurmdbd's runs over a window."""
    rest = _rest(lab)
    cli = SlurmCLI(env=lab.env())
    since = datetime.now(UTC) - timedelta(hours=2)
    drained, busy = lab.pool_nodes("train")[-1].name, lab.pool_nodes("train")[0].name
    job_id = cli.submit(
        JobSpec(
            partition="train",
            account="team-vision",
            wrap="sleep 120",
            comment="stb:contract",
            nodelist=(busy,),
            gpus_per_node=3,
            output="/dev/null",
        )
    )
    cli.drain(drained, "contract agreement")
    cli.create_reservation(
        ReservationSpec("stb-contract-agree", (drained,), duration_s=600, users=("root",))
    )
    try:
        _wait("the job runs", lambda: _state(cli, job_id) == "RUNNING")
        reads: list[Callable[[SlurmProtocol], object]] = [
            lambda s: s.nodes(),
            lambda s: s.partitions(),
            lambda s: s.reservations(),
            lambda s: s.jobs(),
        ]
        for read in reads:
            # a flag may change between two reads (a node's COMPLETING): read again
            _wait("REST and CLI agree", lambda read=read: read(rest) == read(cli), 10)
        nodes = {n.name: n for n in rest.nodes()}
        assert nodes[drained].fenced_by_bridge and nodes[busy].gpus_alloc >= 3
        until = datetime.now(UTC) + timedelta(minutes=1)
        _wait(
            "slurmdbd has the job",
            lambda: job_id in {r.job_id for r in rest.accounting(since, until)},
            30,
        )

        def runs(s: SlurmProtocol) -> list[AccountingRecord]:
            # a running job's elapsed time is counted to the moment of the read
            recs = s.accounting(since, until)
            return [dataclasses.replace(r, elapsed_s=0) if r.end is None else r for r in recs]

        assert runs(rest) == runs(cli)
    finally:
        cli.cancel(job_id)
        cli.delete_reservation("stb-contract-agree")
        cli.resume(drained)


@_NEEDS_REST
def test_rest_with_a_configured_token(lab: LabSpec) -> None:
    """A token from configuration (minted elsewhere) is sent as it is: nothing minted."""
    token = SlurmCLI(env=lab.env()).token("root", 120)
    settings = RestSettings(url=lab.rest_url, user="root", token=token)
    rest = _rest(lab, settings)
    assert {n.name for n in rest.nodes()} == {n.name for n in lab.nodes}
    assert rest.version() == SlurmCLI(env=lab.env()).version()
    assert rest.tokens.minted == 0
