"""Lend-to-serving with the node-local weight cache, on the lab's elastic node: seconds
from `sbatch` of a Triton job to its model answering ready, for

- `staged`: weighty (bridge.lab.weights) with `--size` bytes of weights (default about
  2 GB), its version staged into the node's cache by a staging Slurm job, verified and
  stamped there: the job's overlay checks the copy (`bridge.weights.overlay`, with the
  default `[weights] verify = "stamp"`: its files unchanged since the staging job read
  them all) and Triton loads it from the node's disk (weighty reads every byte);
- `cold`: the same model and job with an empty cache: the model reads its weights from
  the shared origin, an nginx on 127.0.0.1 throttled to `--rate` bytes a second
  (default: the size over 55 s, so a cold load takes about a minute);
- `none`: the baseline, a model with no weights (the lab's `echo`), the same job script
  and overlay step;

in `--rounds` rounds, the three kinds alternating, all on the elastic node through the
infer partition as a lend would, each run on the node idle again. Each staged run also
reports what its overlay's check of the copy took (the job log's `stb-weights:
repository ... ready in`) and the model's own load (weighty reads its weights and
answers how long that took), so the part of the staged time spent on the weights shows.

The weights are random bytes generated at run time under the lab's folder
(`<lab>/bench-weights/`, never in the repository), removed at the end unless `--keep`
(then the next run reuses them). Needs the lab up (`stb lab up`) and no other job on
the elastic node. Usage:
    .venv/bin/python bench/weights_lab.py [--rounds 3] [--size 2000000000] [--keep]
Prints each round's three times side by side, the medians, the ratios staged/none
(target: within 1.3x) and cold/staged, and one `RESULT key=value ...` line.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

import httpx

from bridge.config import WeightsConfig
from bridge.lab import lab as lab_mod
from bridge.lab import triton
from bridge.lab import weights as labweights
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir, model_repository
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.staging import staging_job, submit_staging
from bridge.triton.ports import HTTP_PORT
from bridge.weights import manifest as mf
from bridge.weights.overlay import sources

BASELINE = "echo"
TARGET = 1.3
#: the overlay's line with the time it took to build the job's repository
OVERLAY_READY = re.compile(r"stb-weights: repository \S+ ready in ([0-9.]+)s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gone(spec: LabSpec, job_id: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while triton.job_state(spec, job_id)[0] and time.monotonic() < deadline:
        time.sleep(0.3)


def _node_free(spec: LabSpec, node: str, timeout_s: float = 120) -> None:
    """Until `node` runs no job and Slurm calls it idle (a job's end leaves it completing
    for a moment, and a job submitted then waits for a later scheduling pass: seconds
    that would fall on whichever kind came next)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = slurm(spec, "squeue", "-h", "-w", node, "-o", "%i", check=False).strip()
        state = slurm(spec, "sinfo", "-h", "-n", node, "-o", "%T", check=False).strip()
        if not jobs and state.splitlines() and all(s == "idle" for s in state.splitlines()):
            return
        time.sleep(0.2)
    sys.exit(f"node {node} still runs jobs after {timeout_s:.0f} s: free it first")


def origin(work: Path, size: int) -> mf.Manifest:
    """weighty's version 1 with `size` bytes of weights under `work/origin`, generated once
    (an existing one of that size, whose manifest verifies, is reused)."""
    folder = work / "origin" / labweights.MODEL / "1"
    if folder.is_dir():
        try:
            found = mf.read(folder)
            if found.total_bytes >= size and mf.verify(folder, labweights.MODEL, 1).ok:
                print(f"origin: reusing {found.total_bytes / 1e9:.2f} GB at {folder}", flush=True)
                return found
        except mf.ManifestError:
            pass
        shutil.rmtree(work / "origin")
    t0 = time.monotonic()
    made = labweights.build_origin(work / "origin", size)
    print(f"origin: {size / 1e9:.2f} GB generated in {time.monotonic() - t0:.1f} s", flush=True)
    return made


def stage(spec: LabSpec, node: str, url: str, cache: Path) -> float:
    """The version staged into `cache` by a staging Slurm job on `node` (as the daemon
    stages it: low priority, from the origin, verified), unthrottled by the job (the
    origin's own rate applies); seconds it took (0 when a verified copy was there)."""
    if mf.verify(cache / labweights.MODEL / "1", labweights.MODEL, 1).ok:
        return 0.0
    cfg = WeightsConfig(cache_root=cache, bandwidth_bytes_s=0)
    spec_job = staging_job(
        cfg, node=node, model=labweights.MODEL, version=1, source=url, account="bridge",
        partition="elastic", log_dir=spec.log_dir,
    )  # fmt: skip
    t0 = time.monotonic()
    job_id = submit_staging(SlurmCLI(env=spec.env()), spec_job)
    _gone(spec, job_id, timeout_s=1800)
    took = time.monotonic() - t0
    if not mf.verify(cache / labweights.MODEL / "1", labweights.MODEL, 1).ok:
        log = spec.log_dir / f"stage-{job_id}.log"
        sys.exit(f"staging job {job_id} left no verified copy: {log}")
    return took


def serve(
    spec: LabSpec, node: str, repo: Path, cache: Path, model: str
) -> tuple[float, str, float | None]:
    """A Triton job of `model` on `node` reading `repo` through `cache`: (seconds from
    sbatch to the model's ready, the job's log, the model's own load seconds for
    weighty)."""
    _node_free(spec, node)
    cfg = triton.job_config(spec).model_copy(update={"model_repository": repo})
    addr = next(n.addr for n in spec.nodes if n.name == node)
    t0 = time.monotonic()
    job_id = triton.submit(
        spec, node=node, models=model, config=cfg, weights_cache=cache, name="stb-bench-weights"
    )
    load_s = None
    try:
        url = f"http://{addr}:{HTTP_PORT}"
        with httpx.Client(timeout=2.0) as client:
            while True:
                try:
                    if client.get(f"{url}/v2/models/{model}/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > 600:
                    sys.exit(f"{model} was not ready on {node} within 600 s (job {job_id})")
                time.sleep(0.05)
            took = time.monotonic() - t0
            if model == labweights.MODEL:
                body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                                    "data": [0.0]}]}  # fmt: skip
                out = client.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)
                load_s = float(out.json()["outputs"][0]["data"][1])
    finally:
        slurm(spec, "scancel", job_id, check=False)
        _gone(spec, job_id)
    log = (spec.log_dir / f"triton-{job_id}.log").read_text(errors="replace")
    return took, log, load_s


def _overlay_s(log: str) -> float | None:
    m = OVERLAY_READY.search(log)
    return float(m.group(1)) if m else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=2_000_000_000, help="bytes of weights")
    parser.add_argument("--rate", type=int, default=0, help="origin bytes/s (default: size / 55 s)")
    parser.add_argument("--keep", action="store_true", help="keep the weights for a next run")
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    rate = args.rate or max(1, args.size // 55)
    node = spec.pool_nodes("elastic")[0].name
    work = spec.lab_dir / "bench-weights"
    work.mkdir(parents=True, exist_ok=True)
    origin(work, args.size)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = labweights.start_origin(work / "nginx", work / "origin", port, rate)
    try:
        repo = labweights.build_repository(work / "repo", url)
        if not (repo / BASELINE).exists():
            shutil.copytree(model_repository() / BASELINE, repo / BASELINE,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        staged_cache, empty_cache = work / "cache", work / "cache-empty"
        empty_cache.mkdir(exist_ok=True)
        _node_free(spec, node)
        stage_s = stage(spec, node, url, staged_cache)
        print(
            f"node {node}; origin {url} at {rate / 1e6:.1f} MB/s; staged in {stage_s:.1f} s "
            "(0: a verified copy was there)",
            flush=True,
        )
        times: dict[str, list[float]] = {"staged": [], "cold": [], "none": []}
        overlay: list[float] = []
        loads: dict[str, list[float]] = {"staged": [], "cold": []}
        print(f"\n{'round':<7}{'staged s':>10}{'cold s':>10}{'none s':>10}"
              f"{'overlay s':>11}{'load staged':>13}{'load cold':>11}")  # fmt: skip
        for i in range(args.rounds):
            order = ("staged", "cold", "none") if i % 2 == 0 else ("none", "cold", "staged")
            row: dict[str, float | None] = {}
            for kind in order:
                cache = empty_cache if kind == "cold" else staged_cache
                model = BASELINE if kind == "none" else labweights.MODEL
                took, log, load_s = serve(spec, node, repo, cache, model)
                src = sources(log).get(model, (0, "?"))[1]
                want = {"staged": "local", "cold": "shared", "none": "shared"}[kind]
                if src != want:
                    sys.exit(f"{kind} run read {model} from {src}, not {want}:\n{log[-2000:]}")
                times[kind].append(took)
                if kind == "staged":
                    row["overlay"] = _overlay_s(log)
                    if row["overlay"] is not None:
                        overlay.append(row["overlay"])
                if load_s is not None:
                    loads[kind].append(load_s)
                    row[f"load_{kind}"] = load_s
            print(
                f"{i + 1:<7}{times['staged'][-1]:>10.2f}{times['cold'][-1]:>10.2f}"
                f"{times['none'][-1]:>10.2f}{row.get('overlay') or 0:>11.2f}"
                f"{row.get('load_staged') or 0:>13.2f}{row.get('load_cold') or 0:>11.2f}",
                flush=True,
            )
    finally:
        proc.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ov = statistics.median(overlay) if overlay else float("nan")
    ld = statistics.median(loads["staged"]) if loads["staged"] else float("nan")
    ratio = med["staged"] / med["none"]
    print(f"\n{'kind':<8}{'median s':>10}{'min s':>8}{'max s':>8}")
    for k, v in times.items():
        print(f"{k:<8}{med[k]:>10.2f}{min(v):>8.2f}{max(v):>8.2f}")
    print(
        f"staged/none {ratio:.2f}x (target within {TARGET}x); cold/staged "
        f"{med['cold'] / med['staged']:.1f}x; of the staged time the overlay's check of "
        f"the copy took {ov:.2f} s and the model's own read of its weights {ld:.2f} s"
    )
    print(
        f"RESULT rounds={args.rounds} size_gb={args.size / 1e9:.2f} "
        f"origin_mb_s={rate / 1e6:.1f} staged_s={med['staged']:.2f} cold_s={med['cold']:.2f} "
        f"none_s={med['none']:.2f} staged_over_none={ratio:.2f} "
        f"cold_over_staged={med['cold'] / med['staged']:.1f} overlay_check_s={ov:.3f} "
        f"model_load_staged_s={ld:.2f} target_met={'yes' if ratio <= TARGET else 'no'}"
    )


if __name__ == "__main__":
    main()
