"""Triton Inference Server on the lab, always as a Slurm job.

`prepare` lays out a backend directory (the nvidia-pytriton wheel's Python backend plus
the stub built for the running Python) and the model-repository API key. `submit` runs
`deploy/slurm/triton-server.sbatch` through sbatch; `wait_ready` polls the job until
Slurm has placed it and Triton answers `/v2/health/ready` on that node's address.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bridge.config import TritonJobConfig
from bridge.daemon.keyshim import KeyShimError, ensure_key_shim
from bridge.daemon.launcher import triton_home, triton_job
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import model_repository, triton_sbatch
from bridge.slurm.cli import SlurmCLI
from bridge.triton.ports import GRPC_PORT, HTTP_PORT, METRICS_PORT


class TritonLabError(RuntimeError):
    """Triton could not be started or did not become ready; the message says where to look."""


def backends_dir(spec: LabSpec) -> Path:
    return spec.triton_dir / "backends"


def server_python_path(spec: LabSpec) -> Path:
    """Where `server_python` makes its environment."""
    return spec.triton_dir / "py" / "bin" / "python3"


def server_python(spec: LabSpec, base: str = "/usr/bin/python3") -> Path:
    """A Python the lab's Triton user (`[triton] run_as`) can run, for the Python
    backend's models: a virtual environment of the system's `base` (this host's own
    Python may sit under a home others cannot enter) with this Python's numpy, made once.
    TritonLabError when `base` is missing or not this Python's X.Y (the backend's stub is
    built for one)."""
    python = server_python_path(spec)
    if python.exists():
        return python
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        theirs = subprocess.run(
            [base, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise TritonLabError(f"no usable {base} for the Triton user's Python: {exc}") from exc
    if theirs != ours:
        raise TritonLabError(f"{base} is Python {theirs}, the backend's stub is for {ours}")
    import numpy  # the version the lab's models run with

    folder = python.parent.parent
    try:
        subprocess.run(
            [base, "-m", "venv", str(folder)], check=True, capture_output=True, timeout=120
        )
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"numpy=={numpy.__version__}"],
            check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        said = getattr(exc, "stderr", "") or exc
        raise TritonLabError(
            f"could not make the Triton user's Python at {folder}: {said}"
        ) from exc
    return python


def prepare(spec: LabSpec) -> None:
    """Backend directory with the Python stub for this Python, the API key file, and the
    key shim beside it."""
    home = triton_home()
    py = backends_dir(spec) / "python"
    py.mkdir(parents=True, exist_ok=True)
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = home / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonLabError(f"nvidia-pytriton ships no Python-backend stub for Python {ver}")
    links = {p.name: p for p in (home / "backends" / "python").iterdir()} | {stub.name: stub}
    for name, target in links.items():
        link = py / name
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    if not spec.triton_key_file.exists():
        spec.triton_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(spec.triton_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
    try:
        ensure_key_shim(job_config(spec))
    except KeyShimError as exc:
        raise TritonLabError(str(exc)) from exc


def api_key(spec: LabSpec) -> str:
    return spec.triton_key_file.read_text().strip()


@dataclass(frozen=True)
class TritonJob:
    job_id: str
    node: str
    addr: str

    @property
    def http_url(self) -> str:
        return f"{self.addr}:{HTTP_PORT}"

    @property
    def grpc_url(self) -> str:
        return f"{self.addr}:{GRPC_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.addr}:{METRICS_PORT}/metrics"


def job_config(spec: LabSpec) -> TritonJobConfig:
    """The lab's Triton job settings (what deploy/lab/bridge.toml says for the daemon)."""
    return TritonJobConfig(
        sbatch_script=triton_sbatch(),
        model_repository=model_repository(),
        key_file=spec.triton_key_file,
        backend_directory=backends_dir(spec),
        log_dir=spec.log_dir,
    )


def submit(
    spec: LabSpec,
    *,
    node: str | None = None,
    models: str = "*",
    gpus: int = 1,
    exclusive: bool = False,
    name: str = "stb-triton",
    config: TritonJobConfig | None = None,
    weights_cache: Path | None = None,
) -> str:
    """sbatch the Triton job on the infer partition; returns the job id. `models` is
    "*" or names separated by ','; `exclusive` takes the whole node and all its GPUs;
    `config`: another job configuration (another model repository) than the lab's;
    `weights_cache`: the node-local weight cache the job reads verified copies from."""
    job = triton_job(
        config or job_config(spec),
        node=node,
        models=[] if models == "*" else [m for m in models.split(",") if m],
        exclusive=exclusive,
        gpus=spec.gpus_per_node if exclusive else gpus,
        name=name,
        weights_cache=weights_cache,
    )
    return SlurmCLI(env=spec.env()).submit(job)


def job_state(spec: LabSpec, job_id: str) -> tuple[str, str]:
    """(state, node list) of a job from squeue; ("", "") once it has left the queue."""
    out = slurm(spec, "squeue", "-h", "-j", job_id, "-o", "%T %N", check=False).split()
    return (out[0], out[1] if len(out) > 1 else "") if out else ("", "")


def wait_ready(spec: LabSpec, job_id: str, timeout_s: float = 120.0) -> TritonJob:
    """Wait until the job runs and its Triton answers ready; return where it serves."""
    addrs = {n.name: n.addr for n in spec.nodes}
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        state, node = job_state(spec, job_id)
        if state == "RUNNING" and node in addrs:
            job = TritonJob(job_id, node, addrs[node])
            try:
                r = httpx.get(f"http://{job.http_url}/v2/health/ready", timeout=1.0)
                if r.status_code == 200:
                    return job
            except httpx.HTTPError:
                pass
        elif state in ("", "FAILED", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(0.2)
    log = spec.log_dir / f"triton-{job_id}.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log.exists() else ""
    raise TritonLabError(
        f"Triton job {job_id} not ready (last state {state or 'gone'}); see {log}:\n{tail}"
    )
