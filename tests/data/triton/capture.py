"""Records the Triton metric pages in this folder from the real lab Triton (provenance).

Not a test. Run by hand with the lab up (`stb lab up`), on the reserved node n4 only:
    .venv/bin/python tests/data/triton/capture.py
It starts Triton as a Slurm job on n4, saves `idle.prom`, sends bounded load to `busy`
(and a little to `echo`), saves `busy_a.prom` and `busy_b.prom` ten seconds apart,
restarts Triton (scancel, then a new job on the same node), sends a few requests, saves
`restart.prom`, and cancels its job. `captures.json` holds each page's scrape time (unix
seconds). The unit tests in tests/unit/test_triton_*.py read these pages.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as httpclient

from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir

HERE = Path(__file__).resolve().parent
NODE = "n4"


def infer(url: str, model: str, n: int, stop: threading.Event | None = None) -> None:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT0", [1, 8] if model == "echo" else [8], "FP32")
    data = np.arange(8, dtype=np.float32)
    inp.set_data_from_numpy(data.reshape(1, -1) if model == "echo" else data)
    for _ in range(n):
        if stop is not None and stop.is_set():
            break
        client.infer(model, [inp])
    client.close()


def save(job: triton.TritonJob, name: str, stamps: dict[str, float]) -> None:
    text = httpx.get(job.metrics_url, timeout=5).text
    stamps[name] = time.time()
    (HERE / name).write_text(text)
    print(f"saved {name} ({len(text)} bytes)")


def start(spec: LabSpec) -> triton.TritonJob:
    return triton.wait_ready(spec, triton.submit(spec, node=NODE, name="stb-triton-capture"))


def main() -> None:
    spec = LabSpec.load(default_lab_dir())
    assert spec is not None, "lab is not set up; run `stb lab up`"
    stamps: dict[str, float] = {}
    job = start(spec)
    try:
        infer(job.http_url, "echo", 3)
        time.sleep(1)
        save(job, "idle.prom", stamps)
        # Four clients against busy (one instance, 20 ms each): requests queue.
        stop = threading.Event()
        workers = [
            threading.Thread(target=infer, args=(job.http_url, "busy", 2000, stop))
            for _ in range(4)
        ] + [threading.Thread(target=infer, args=(job.http_url, "echo", 300, stop))]
        for w in workers:
            w.start()
        time.sleep(8)
        save(job, "busy_a.prom", stamps)
        time.sleep(10)
        save(job, "busy_b.prom", stamps)
        stop.set()
        for w in workers:
            w.join(timeout=30)
        slurm(spec, "scancel", job.job_id, check=False)
        deadline = time.monotonic() + 90
        while triton.job_state(spec, job.job_id)[0] and time.monotonic() < deadline:
            time.sleep(0.5)
        job = start(spec)
        infer(job.http_url, "busy", 5)
        infer(job.http_url, "echo", 2)
        time.sleep(1)
        save(job, "restart.prom", stamps)
    finally:
        slurm(spec, "scancel", job.job_id, check=False)
    (HERE / "captures.json").write_text(json.dumps(stamps, indent=2) + "\n")


if __name__ == "__main__":
    main()
