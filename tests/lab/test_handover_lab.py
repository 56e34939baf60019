"""A node handed over from an elastic job to a Triton job and back, on the lab (issue 33's
hand-over hygiene), with `[triton] run_as = "stb-triton"`: the elastic job on the elastic
node leaves a file in the node's /tmp (readable by anyone there); the operator's lend
requeues it and the Triton job that replaces it serves as `stb-triton`, whose /tmp and
/dev/shm are its own: the file is not there for it to read, and the Python backend's
shared memory lives in its private /dev/shm. After the return nothing of the Triton job
is left: no process of it, none of its shared-memory files on the node."""

from __future__ import annotations

import pwd
import subprocess
import uuid
from pathlib import Path

import pytest

from bridge.audit.asks import ask_lend, ask_return
from bridge.config import TritonJobConfig
from bridge.daemon.launcher import triton_home
from bridge.daemon.reconciler import Reconciler
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.lab.system import TRITON_USER
from bridge.lab.triton import server_python_path
from bridge.lifecycle import LeaseState
from bridge.paths import project_root

from .helpers import BUSY_INPUT, sbatch, tick_until, tick_until_baseline, upstreams, wait_state

pytestmark = pytest.mark.lab


@pytest.fixture
def bridge_update(lab: LabSpec, triton_config: TritonJobConfig) -> dict[str, object]:
    python = server_python_path(lab)  # made by `stb lab up` where the host allows
    if str(project_root().resolve()).startswith(("/tmp/", "/dev/shm/")):
        pytest.skip("the checkout is under /tmp, which the server's private /tmp hides")
    if not python.exists():
        pytest.skip(f"no Python for {TRITON_USER} at {python} (see `stb lab up`'s output)")
    # the server's files must be reachable by its user (a checkout under a home only root
    # enters, say, is not): else the baseline never serves, and the test would only time out
    needs = [
        ("-x", triton_home() / "bin" / "tritonserver"),
        ("-r", triton_config.model_repository.resolve() / "busy" / "config.pbtxt"),
        ("-r", triton_config.key_shim_path),
        ("-x", python),
    ]
    for flag, path in needs:
        argv = ["setpriv", f"--reuid={TRITON_USER}", f"--regid={TRITON_USER}", "--clear-groups",
                "test", flag, str(path)]  # fmt: skip
        if subprocess.run(argv, capture_output=True).returncode != 0:
            pytest.skip(f"{TRITON_USER} cannot reach {path} (test {flag}) on this host")
    update = {"run_as": TRITON_USER, "python": python}
    return {"triton": triton_config.model_copy(update=update)}


def _processes(match: str) -> list[int]:
    """Pids whose environment holds `match` (a `NAME=value` line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if match.encode() in env:
            found.append(int(entry.name))
    return found


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def _of_user(uid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _uid(int(entry.name)) == uid:
                    out.append(int(entry.name))
            except (OSError, AssertionError):
                continue
    return out


def test_the_triton_job_sees_nothing_the_elastic_job_left_and_leaves_nothing(
    lab: LabSpec, bridge: tuple[Reconciler, str]
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    node = lab.pool_nodes("elastic")[0].name
    uid = pwd.getpwnam(TRITON_USER).pw_uid
    secret = Path(f"/tmp/stb-hygiene-{uuid.uuid4().hex}")
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    elastic = sbatch(
        lab, "-p", "elastic", "-A", lab.accounts[0], "-w", node, "--requeue",
        "--wrap", f"umask 022; echo training-data > {secret}; sleep 600",
    )  # fmt: skip
    try:
        wait_state(lab, elastic, {"RUNNING"}, 30)
        tick_until(rec, secret.exists, 10, log)
        assert secret.stat().st_mode & 0o004, "the file is readable by anyone on the node"
        ask_lend(queue, node, ["busy"])
        tick_until(
            rec, lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()), 90, log
        )
        (lease,) = store.open_leases()
        job = str(lease.slurm_job_id)
        servers = [
            p for p in _processes(f"SLURM_JOB_ID={job}")
            if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver"
        ]  # fmt: skip
        assert len(servers) == 1, servers
        pid = servers[0]
        # the server runs as its own user, and the node's /tmp is not its /tmp
        assert _uid(pid) == uid
        root = Path(f"/proc/{pid}/root")
        assert secret.exists() and not (root / str(secret).lstrip("/")).exists()
        with pytest.raises(FileNotFoundError):
            (root / str(secret).lstrip("/")).read_text()
        # the Python backend's shared memory is in its private /dev/shm, not the node's
        private_shm = {p.name for p in (root / "dev/shm").iterdir()}
        assert any(n.startswith("triton_python_backend") for n in private_shm), private_shm
        assert not private_shm & {p.name for p in Path("/dev/shm").iterdir()}
        assert len(upstreams(endpoint, "busy", BUSY_INPUT)) == 2  # and it serves
        log_text = (lab.log_dir / f"triton-{job}.log").read_text(errors="replace")
        assert f"stb-hygiene: serving as {TRITON_USER}" in log_text

        ask_return(queue, lease.id or 0)
        tick_until(rec, lambda: not store.open_leases(), 90, log)
        # the job's processes end (the baseline's, on the reserved node, serve on as it)
        tick_until(rec, lambda: not _processes(f"SLURM_JOB_ID={job}"), 30, log)
        assert pid not in _of_user(uid)
        assert not private_shm & {p.name for p in Path("/dev/shm").iterdir()}
    finally:
        slurm(lab, "scancel", elastic, check=False)
        secret.unlink(missing_ok=True)
