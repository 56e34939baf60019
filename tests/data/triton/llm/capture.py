"""Records the lab LLM's Triton metric pages in this folder (provenance of `smol_*.prom`).

Not a test. Run by hand with the lab up (`stb lab up`), under the lab's lock:
    flock /tmp/stb-lab.lock -c '.venv/bin/python tests/data/triton/llm/capture.py'
It starts Triton on the lab's repository with the LLM alone (triton_repo/smol, SmolLM2-135M on
llama-cpp-python, the vLLM backend's metric families) as a Slurm job on the first
inference node, as tests/lab/test_llm_lab.py does; streams two requests and saves
`smol_a.prom`; opens a long stream and, after its first token, saves `smol_open.prom`
(one stream being generated: Triton's pending count is 0 there); lets it finish, streams
two more and saves `smol_b.prom`; then cancels its job. `captures.json` holds each page's
scrape time (unix seconds). tests/unit/test_llm_metrics.py reads these pages.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from bridge.daemon.launcher import triton_job
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir
from bridge.slurm.cli import SlurmCLI

HERE = Path(__file__).resolve().parent
MODEL = "smol"


def stream(base: str, prompt: str, max_tokens: int, first: threading.Event | None = None) -> int:
    """One streamed request; the number of events read."""
    body = {"text_input": prompt, "max_tokens": max_tokens, "stream": True,
            "parameters": {"temperature": 0}}  # fmt: skip
    events = 0
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{base}/v2/models/{MODEL}/generate_stream", json=body) as r,
    ):
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:"):
                events += 1
                if first is not None:
                    first.set()
    return events


def save(job: triton.TritonJob, name: str, stamps: dict[str, float]) -> None:
    text = httpx.get(job.metrics_url, timeout=5).text
    stamps[name] = time.time()
    (HERE / name).write_text(text)
    print(f"saved {name} ({len(text)} bytes)")


def main() -> None:
    lab = LabSpec.load(default_lab_dir())
    assert lab is not None, "lab is not set up; run `stb lab up`"
    config = triton.job_config(lab)
    node = lab.pool_nodes("infer")[0].name
    spec = triton_job(config, node=node, models=[MODEL], name="stb-triton-llm-capture")
    job_id = SlurmCLI(env=lab.env()).submit(spec)
    stamps: dict[str, float] = {}
    try:
        job = triton.wait_ready(lab, job_id, timeout_s=120)
        base = f"http://{job.http_url}"
        for prompt in ("Name three colours.", "What does a scheduler do?"):
            stream(base, prompt, 24)
        save(job, "smol_a.prom", stamps)
        first = threading.Event()
        long = threading.Thread(
            target=stream, args=(base, "Write a long story about the sea.", 200, first)
        )
        long.start()
        assert first.wait(30), "no first token in 30 s"
        time.sleep(0.3)
        save(job, "smol_open.prom", stamps)
        long.join(timeout=120)
        for prompt in ("Write one sentence about the sea.", "Name a planet."):
            stream(base, prompt, 24)
        save(job, "smol_b.prom", stamps)
    finally:
        slurm(lab, "scancel", job_id, check=False)
    (HERE / "captures.json").write_text(json.dumps(stamps, indent=2) + "\n")


if __name__ == "__main__":
    main()
