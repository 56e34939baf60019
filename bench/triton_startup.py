"""Time from `sbatch` of the Triton job to `/v2/health/ready`, beside the baseline of
the same script started directly (no Slurm), in one run.

Needs the lab up (`stb lab up`) and root. Usage:
    .venv/bin/python bench/triton_startup.py [--rounds 5]
Prints per-round times, medians, and the ratio Slurm-path / direct.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bridge.lab import lab as lab_mod
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir, model_repository, triton_sbatch

DIRECT_ADDR = "127.0.1.200"  # a loopback address no lab node uses


def _ready(addr: str) -> bool:
    try:
        return httpx.get(f"http://{addr}:8000/v2/health/ready", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def direct_once(spec: LabSpec) -> float:
    """Run deploy/slurm/triton-server.sbatch with bash, outside Slurm."""
    env = os.environ | {
        "STB_TRITON_HOME": str(triton.triton_home()),
        "STB_TRITON_BACKENDS": str(triton.backends_dir(spec)),
        "STB_MODEL_REPO": str(model_repository()),
        "STB_TRITON_KEY_FILE": str(spec.triton_key_file),
        "STB_TRITON_ADDR": DIRECT_ADDR,
        "SLURMD_NODENAME": "bench",
        "SLURM_JOB_ID": "0",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    start = time.perf_counter()
    proc = subprocess.Popen(
        ["bash", str(triton_sbatch())],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not _ready(DIRECT_ADDR):
            if proc.poll() is not None or time.perf_counter() - start > 120:
                raise RuntimeError("direct tritonserver did not become ready")
            time.sleep(0.05)
        return time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def slurm_once(spec: LabSpec) -> float:
    node = spec.pool_nodes("infer")[0].name
    start = time.perf_counter()
    job_id = triton.submit(spec, node=node, name="stb-triton-bench")
    try:
        triton.wait_ready(spec, job_id, timeout_s=120)
        return time.perf_counter() - start
    finally:
        slurm(spec, "scancel", job_id)
        deadline = time.monotonic() + 60
        while triton.job_state(spec, job_id)[0] and time.monotonic() < deadline:
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    direct, via_slurm = [], []
    for i in range(args.rounds):
        direct.append(direct_once(spec))
        via_slurm.append(slurm_once(spec))
        print(f"round {i + 1}: direct {direct[-1]:.2f}s  sbatch {via_slurm[-1]:.2f}s", flush=True)
    d, s = statistics.median(direct), statistics.median(via_slurm)
    print(f"\n{'path':<28}{'median s':>10}{'min s':>8}{'max s':>8}")
    print(f"{'tritonserver direct':<28}{d:>10.2f}{min(direct):>8.2f}{max(direct):>8.2f}")
    print(
        f"{'sbatch -> /v2/health/ready':<28}{s:>10.2f}{min(via_slurm):>8.2f}{max(via_slurm):>8.2f}"
    )
    print(f"ratio sbatch/direct: {s / d:.2f}x  (Slurm's share: {s - d:.2f}s)")


if __name__ == "__main__":
    main()
