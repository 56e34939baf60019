"""The lab's main job, for now: Triton on the inference partition, real requests, and
what Slurm and Triton say about them.

Starts the baseline Triton job on the reserved inference node, sends requests to each
example model through tritonclient, prints client latency beside Triton's own p99, and
(unless asked to keep it) cancels the job and shows the GPU booking sacct made for it.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import tritonclient.http as httpclient
from rich.console import Console
from rich.table import Table

from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec

MODELS = ("echo", "busy")


@dataclass(frozen=True)
class ModelRun:
    model: str
    sent: int
    errors: int
    seconds: float
    latencies_ms: list[float]

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


def send(url: str, model: str, requests: int, concurrency: int) -> ModelRun:
    """Send `requests` inferences to `model` with `concurrency` in flight."""
    data = np.arange(16, dtype=np.float32)
    if model == "echo":
        data = data.reshape(1, -1)

    def one(_: int) -> float | None:
        client = httpclient.InferenceServerClient(url)
        inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        start = time.perf_counter()
        try:
            client.infer(model, [inp])
        except Exception:  # any failure is counted as an error and shown
            return None
        finally:
            client.close()
        return (time.perf_counter() - start) * 1000

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    lat = [r for r in results if r is not None]
    return ModelRun(model, requests, requests - len(lat), time.perf_counter() - start, lat)


def triton_p99_ms(metrics_url: str, model: str) -> float | None:
    """Triton's own p99 (summary over its sliding window) for model, in ms."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(metrics_url, timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name != "nv_inference_request_summary_us":
            continue
        for s in family.samples:
            if s.labels.get("model") == model and s.labels.get("quantile") == "0.99":
                return float(s.value) / 1000
    return None


def _sacct(spec: LabSpec, job_id: str, timeout_s: float = 20) -> dict[str, object] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = slurm(spec, "sacct", "-j", job_id, "--json", check=False)
        try:
            jobs = json.loads(out).get("jobs", [])
        except json.JSONDecodeError:
            jobs = []
        if jobs and jobs[0]["state"]["current"] not in ("RUNNING", "PENDING"):
            return dict(jobs[0])
        time.sleep(0.5)
    return None


def run(spec: LabSpec, console: Console, *, requests: int, concurrency: int, keep: bool) -> None:
    reserved = spec.pool_nodes("infer")[0].name
    t0 = time.monotonic()
    job_id = triton.submit(spec, node=reserved)
    console.print(f"submitted Triton as Slurm job {job_id} on partition infer, node {reserved}")
    job = triton.wait_ready(spec, job_id)
    console.print(
        f"Triton ready at {job.http_url} in {time.monotonic() - t0:.1f}s "
        "(sbatch to /v2/health/ready)"
    )

    table = Table(title=f"{requests} requests per model, {concurrency} in flight")
    for col in ("model", "ok", "errors", "req/s", "p50 ms", "p99 ms", "Triton p99 ms"):
        table.add_column(col, justify="right")
    for model in MODELS:
        r = send(job.http_url, model, requests, concurrency)
        tp99 = triton_p99_ms(job.metrics_url, model)
        table.add_row(
            model,
            str(len(r.latencies_ms)),
            str(r.errors),
            f"{len(r.latencies_ms) / r.seconds:.0f}",
            f"{r.quantile(0.5):.1f}",
            f"{r.quantile(0.99):.1f}",
            f"{tp99:.1f}" if tp99 is not None else "-",
        )
    console.print(table)
    console.print(slurm(spec, "squeue", "-o", "%.6i %.8P %.12j %.8a %.8T %.6M %N %b").rstrip())
    if keep:
        console.print(f"Triton job {job_id} keeps running; `scancel {job_id}` stops it")
        return
    slurm(spec, "scancel", job_id)
    rec = _sacct(spec, job_id)
    if rec is None:
        console.print(f"[yellow]sacct has no final record of job {job_id} yet[/yellow]")
        return
    tres = rec["tres"]["allocated"]  # type: ignore[index]
    gpus = next((t["count"] for t in tres if t["type"] == "gres" and t["name"] == "gpu"), 0)
    elapsed = int(rec["time"]["elapsed"])  # type: ignore[index]
    console.print(
        f"sacct books job {job_id} ({rec['name']}, account {rec['account']}, partition "
        f"{rec['partition']}, {rec['state']['current']}): {gpus} GPU x {elapsed}s = "  # type: ignore[index]
        f"{gpus * elapsed / 3600:.4f} GPU-hours"
    )
