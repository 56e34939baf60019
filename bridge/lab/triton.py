"""Triton Inference Server on the lab, always as a Slurm job.

`prepare` lays out a backend directory (the nvidia-pytriton wheel's Python backend plus
the stub built for the running Python) and the model-repository API key. `submit` runs
`deploy/slurm/triton-server.sbatch` through sbatch; `wait_ready` polls the job until
Slurm has placed it and Triton answers `/v2/health/ready` on that node's address.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import model_repository, triton_sbatch

TRITON_HTTP_PORT = 8000
TRITON_GRPC_PORT = 8001
TRITON_METRICS_PORT = 8002
API_KEY_HEADER = "X-Stb-Key"


class TritonLabError(RuntimeError):
    """Triton could not be started or did not become ready; the message says where to look."""


def triton_home() -> Path:
    """The tritonserver install inside the nvidia-pytriton wheel."""
    import pytriton  # the wheel that ships the server binary

    home = Path(pytriton.__file__).resolve().parent / "tritonserver"
    if not (home / "bin" / "tritonserver").exists():
        raise TritonLabError(f"no tritonserver binary under {home}; reinstall nvidia-pytriton")
    return home


def backends_dir(spec: LabSpec) -> Path:
    return spec.triton_dir / "backends"


def prepare(spec: LabSpec) -> None:
    """Backend directory with the Python stub for this Python, and the API key file."""
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


def api_key(spec: LabSpec) -> str:
    return spec.triton_key_file.read_text().strip()


@dataclass(frozen=True)
class TritonJob:
    job_id: str
    node: str
    addr: str

    @property
    def http_url(self) -> str:
        return f"{self.addr}:{TRITON_HTTP_PORT}"

    @property
    def grpc_url(self) -> str:
        return f"{self.addr}:{TRITON_GRPC_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.addr}:{TRITON_METRICS_PORT}/metrics"


def submit(
    spec: LabSpec,
    *,
    node: str | None = None,
    models: str = "*",
    gpus: int = 1,
    exclusive: bool = False,
    name: str = "stb-triton",
) -> str:
    """sbatch the Triton job on the infer partition; returns the job id."""
    exports = {
        "STB_TRITON_HOME": str(triton_home()),
        "STB_TRITON_BACKENDS": str(backends_dir(spec)),
        "STB_MODEL_REPO": str(model_repository()),
        "STB_TRITON_KEY_FILE": str(spec.triton_key_file),
        "STB_MODELS": models,
        # The Python backend's stub finds numpy through the python3 first on PATH.
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        "--partition=infer",
        "--account=bridge",
        f"--output={spec.log_dir / 'triton-%j.log'}",
        "--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items()),
    ]
    argv += (
        ["--exclusive", f"--gres=gpu:{spec.gpus_per_node}"] if exclusive else [f"--gres=gpu:{gpus}"]
    )
    if node:
        argv.append(f"--nodelist={node}")
    argv.append(str(triton_sbatch()))
    return slurm(spec, *argv).strip().split(";")[0]


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
