"""The Triton job under a container runtime, run on the lab as the bridge submits it.

`[triton] runtime = "apptainer"` and `"pyxis"`: the job script goes through sbatch to
the reserved node with fake `apptainer` and `srun` first on the job's PATH
(tests/fake_runtimes.py). They record their command line and run the wheel's real
tritonserver in place of the image's; the pyxis fake runs it through the lab's real
srun, as a job step. Checked: the bridge's readiness check finds it ready on the node's
address; the key opens the repository API, a wrong key does not, and the key is on no
command line and in no environment; SIGTERM drains it, both the batch step's SIGTERM
(what `--signal=B:TERM@30` and `scancel --batch` send) and the job's cancel (what the
bridge's release runs).

This proves the job script's logic through a runtime's command line: what it binds and
passes, the key shim and the probe inside the wrapper, and the signal path. It does not
prove Apptainer or pyxis themselves, which cannot run on this machine.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

import pytest

from bridge.config import TritonJobConfig
from bridge.daemon.launcher import triton_home, triton_job
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.slurm.cli import SlurmCLI
from bridge.triton.client import TritonHttpClient
from bridge.triton.errors import TritonRejected
from tests import fake_runtimes

pytestmark = pytest.mark.lab

NODE = "n4"
IMAGE = {"pyxis": "nvcr.io#nvidia/tritonserver:24.10-py3"}


def _server_pids(addr: str) -> list[int]:
    """tritonserver processes bound to `addr` (argv[0] is the image's `tritonserver`)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"tritonserver") and f"--http-address={addr}".encode() in argv:
            pids.append(int(proc.name))
    return pids


def _wait_gone(lab: LabSpec, job_id: str, timeout_s: float) -> float:
    start = time.monotonic()
    while triton.job_state(lab, job_id)[0]:
        assert time.monotonic() - start < timeout_s, f"job {job_id} still there"
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.mark.parametrize("stop", ["batch-sigterm", "scancel"])
@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_a_containerised_triton_job_serves_keeps_the_key_and_drains(
    lab: LabSpec, tmp_path: Path, runtime: str, stop: str
) -> None:
    sif = tmp_path / "tritonserver-24.10.sif"
    sif.write_bytes(b"")  # the fake only checks that the image file is there
    cache = tmp_path / "cache"
    cache.mkdir()
    cfg = TritonJobConfig.model_validate(
        triton.job_config(lab).model_dump()
        | {"runtime": runtime, "image": IMAGE.get(runtime, str(sif)), "binds": (str(cache),)}
    )
    bin_dir, log_dir = tmp_path / "fakes", tmp_path / "records"
    fake_runtimes.install(
        bin_dir,
        log_dir,
        tritonserver=triton_home() / "bin" / "tritonserver",
        # the Python backend's stub finds numpy through the python3 first on PATH
        image_path=(str(Path(sys.executable).parent), "/usr/bin", "/bin"),
        real_srun=shutil.which("srun") if runtime == "pyxis" else None,
    )
    spec = triton_job(cfg, node=NODE, name=f"stb-triton-{runtime}")
    spec = dataclasses.replace(spec, env=spec.env | {"PATH": fake_runtimes.path_with(bin_dir)})
    job_id = SlurmCLI(env=lab.env()).submit(spec)
    try:
        job = triton.wait_ready(lab, job_id, timeout_s=120)  # the bridge's readiness check
        key = triton.api_key(lab)

        # it ran through the runtime's command line, with the key in none of it
        argv, runtime_env = fake_runtimes.recorded(
            log_dir, "apptainer" if runtime == "apptainer" else "srun"
        )
        assert f"{cache}:{cache}:ro" in " ".join(argv)
        assert (str(sif) if runtime == "apptainer" else f"--container-image={IMAGE['pyxis']}") in (
            argv
        )
        assert not any(key in a for a in argv) and "LD_PRELOAD" not in runtime_env

        # the key: it opens the repository API, a wrong one does not, no one sees it
        with TritonHttpClient(job.http_url, api_key=key) as client:
            client.load_model("echo")
            assert client.is_model_ready("echo")
        with (
            TritonHttpClient(job.http_url, api_key="not-the-key") as client,
            pytest.raises(TritonRejected),
        ):
            client.load_model("echo")
        pids = _server_pids(job.addr)
        assert len(pids) == 1
        cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes()
        assert b"X-Stb-Key=@STB_KEY@" in cmdline and key.encode() not in cmdline
        assert key.encode() not in Path(f"/proc/{pids[0]}/environ").read_bytes()

        # drain on SIGTERM, through the runtime
        if stop == "batch-sigterm":
            slurm(lab, "scancel", "--batch", "--signal=TERM", job_id)
        else:
            slurm(lab, "scancel", job_id)
        took = _wait_gone(lab, job_id, timeout_s=60)
        assert took < 30  # well inside KillWait (30 s): Triton exited by itself
    finally:
        slurm(lab, "scancel", job_id, check=False)
    # tritonserver exited 0 by itself: a SIGKILL would read CANCELLED or 0:9. It runs in
    # the batch step under apptainer (exec) and in step 0 under pyxis (srun)
    step = f"{job_id}.batch" if runtime == "apptainer" else f"{job_id}.0"
    assert _final_state(lab, job_id, step) == "COMPLETED|0:0"
    log = (lab.log_dir / f"triton-{job_id}.log").read_text(errors="replace")
    assert key not in log
    assert "Signal (15) received." in log, log[-2000:]
    assert "Killed" not in log, log[-2000:]
    if runtime == "pyxis" and stop == "scancel":
        # The cancel reaches srun too, which asks for SIGKILL of its tasks and stops
        # relaying their output; on the lab the SIGKILL was not delivered (the job was
        # already terminating) and the server drained, but its last lines are lost.
        assert "srun: forcing job termination" in log
        return
    assert "Waiting for in-flight requests to complete." in log
    assert "successfully unloaded 'echo'" in log and "successfully unloaded 'busy'" in log
    if stop == "batch-sigterm":
        assert _final_state(lab, job_id, job_id) == "COMPLETED|0:0"


def _final_state(lab: LabSpec, job_id: str, row: str, timeout_s: float = 30) -> str:
    """`State|ExitCode` of one row (the job or a step) of sacct, once slurmdbd has it."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = slurm(lab, "sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State,ExitCode")
        rows = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        state = rows.get(row, "")
        if (state and not state.startswith(("RUNNING", "PENDING"))) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)
