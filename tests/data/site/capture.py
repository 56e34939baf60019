"""Records the site data in this folder from the real lab (provenance): what a site feeds
`stb simulate` (`bridge.sim.inputs`), taken from real Slurm 22.05, Triton and Prometheus.

Not a test. Run by hand with the lab up (`stb lab up`) and no job in its queue:
    .venv/bin/python tests/data/site/capture.py
About eight minutes. It starts Triton as a Slurm job on the reserved node n4 and a
Prometheus of its own (a temporary folder, a free loopback port) scraping that Triton
every 5 s, submits batch jobs (a job array, a 2-node job, an elastic job it requeues
once, a job held by --begin, one still running at the end, one still pending), sends
load to `busy` and `echo` in three phases with Triton down for OUTAGE_S between the last
two (a real gap in the series), then saves:

- `prometheus-rate-range.json`: Prometheus' own answer to `/api/v1/query_range` of
  `bridge.sim.inputs.DEFAULT_QUERY` at 5 s steps over the load (the body as sent);
- `prometheus-rate-by-instance.json`: the same without the sum (a series per instance
  and version: the labels a query must keep or sum);
- `prometheus-service.json`: the answer to `service_query` (an instant query);
- `prometheus-error.json`: the answer to a query Prometheus refuses (HTTP 400);
- `sacct-site-22.05.json`: `sacct --json --duplicates -a` over the capture;
- `captures.json`: the window, the load phases and what each job was.

It cancels every job it submitted and stops its Prometheus. The unit tests in
tests/unit/test_sim_inputs*.py read these files.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.http as httpclient

from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir
from bridge.sim.inputs import DEFAULT_QUERY, service_query

HERE = Path(__file__).resolve().parent
NODE = "n4"
STEP_S = 5
#: seconds with no Triton between the second and third phases: longer than the query's
#: 1-minute rate window, so the series has no sample for a while
OUTAGE_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def send(url: str, model: str, rate: float, until: float, stop: threading.Event) -> None:
    """`rate` requests a second to `model` until `until` (monotonic), paced, one at a time."""
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT0", [1, 8] if model == "echo" else [8], "FP32")
    data = np.arange(8, dtype=np.float32)
    inp.set_data_from_numpy(data.reshape(1, -1) if model == "echo" else data)
    due = time.monotonic()
    while not stop.is_set() and due < until:
        time.sleep(max(0.0, due - time.monotonic()))
        # a restarting server: the requests are lost, the load goes on
        with contextlib.suppress(Exception):
            client.infer(model, [inp])
        due += 1.0 / rate
    client.close()


def phase(url: str, rates: dict[str, float], seconds: float) -> None:
    stop = threading.Event()
    until = time.monotonic() + seconds
    workers = []
    for model, rate in rates.items():
        per = 2 if rate > 20 else 1  # busy holds 20 ms a request: two senders above 20/s
        workers += [
            threading.Thread(target=send, args=(url, model, rate / per, until, stop))
            for _ in range(per)
        ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=seconds + 30)
    stop.set()


def sbatch(spec: LabSpec, *args: str) -> str:
    return slurm(spec, "sbatch", "--parsable", "-o", "/dev/null", *args).strip().split(";")[0]


def wait_running(spec: LabSpec, job_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if triton.job_state(spec, job_id)[0] == "RUNNING":
            return
        time.sleep(0.5)
    raise RuntimeError(f"job {job_id} did not start within {timeout_s}s")


def get(url: str, path: str, params: dict[str, Any]) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params, timeout=30)


def main() -> None:
    spec = LabSpec.load(default_lab_dir())
    assert spec is not None, "lab is not set up; run `stb lab up`"
    queue = slurm(spec, "squeue", "-h", "-o", "%i").split()
    assert not queue, f"the lab's queue holds jobs {queue}: run this when the lab is free"
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is installed by `stb lab up`"
    t0 = time.time()
    jobs: dict[str, str] = {}
    tsdb = Path(tempfile.mkdtemp(prefix="stb-capture-prom-"))
    prom: subprocess.Popen[bytes] | None = None
    server = triton.wait_ready(spec, triton.submit(spec, node=NODE, name="stb-triton-capture"))
    jobs[server.job_id] = "Triton (stb:triton), first run"
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        (tsdb / "prometheus.yml").write_text(
            "global: {scrape_interval: 5s, evaluation_interval: 5s}\n"
            "scrape_configs:\n"
            "  - job_name: triton\n"
            f"    static_configs: [{{targets: ['{server.addr}:8002']}}]\n"
        )
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tsdb / 'prometheus.yml'}",
                f"--storage.tsdb.path={tsdb / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        a = "--gres=gpu:1"
        jobs[
            sbatch(spec, "-p", "train", "-A", "team-nlp", "--array=0-2", a, "--wrap", "sleep 20")
        ] = "array of 3 tasks on train, 1 GPU each, 20 s"
        two = sbatch(spec, "-p", "train", "-A", "team-vision", "-N", "2", "--gres=gpu:2",
                     "--wrap", "sleep 30")  # fmt: skip
        jobs[two] = "2 nodes on train, 2 GPUs each, 30 s"
        elastic = sbatch(spec, "-p", "elastic", "-A", "team-research", "--gres=gpu:4",
                         "--requeue", "--wrap", "sleep 40")  # fmt: skip
        jobs[elastic] = "elastic, 4 GPUs, 40 s, requeued once 10 s into its first run"
        held = sbatch(spec, "-p", "train", "-A", "team-nlp", a, "--begin=now+60",
                      "--wrap", "sleep 15")  # fmt: skip
        jobs[held] = "train, 1 GPU, 15 s, held by --begin=now+60 (eligible a minute late)"
        long = sbatch(spec, "-p", "train", "-A", "team-nlp", a, "--wrap", "sleep 900")
        jobs[long] = "train, 1 GPU, sleep 900: still running at the capture, then cancelled"
        pending = sbatch(spec, "-p", "train", "-A", "team-nlp", a, "--begin=now+3600",
                         "--wrap", "sleep 5")  # fmt: skip
        jobs[pending] = "train, held by --begin=now+3600: pending at the capture, then cancelled"
        wait_running(spec, elastic)
        time.sleep(10)
        slurm(spec, "scontrol", "requeue", elastic)
        phases: list[dict[str, Any]] = []
        load_from = time.time()
        for rates, seconds in (
            ({"busy": 10.0, "echo": 5.0}, 60),
            ({"busy": 30.0, "echo": 5.0}, 60),
        ):
            started = time.time()
            phase(server.http_url, rates, seconds)
            phases.append({"from": started, "to": time.time(), "rps": rates})
        slurm(spec, "scancel", server.job_id, check=False)
        stopped = time.time()
        while triton.job_state(spec, server.job_id)[0]:
            time.sleep(0.5)
        time.sleep(OUTAGE_S)  # no Triton: its series stop, a real gap
        server = triton.wait_ready(spec, triton.submit(spec, node=NODE, name="stb-triton-capture"))
        jobs[server.job_id] = "Triton (stb:triton), restarted: a gap in the series before it"
        phases.append({"outage": {"from": stopped, "to": time.time()}})
        started = time.time()
        phase(server.http_url, {"busy": 15.0, "echo": 5.0}, 45)
        phases.append({"from": started, "to": time.time(), "rps": {"busy": 15.0, "echo": 5.0}})
        time.sleep(15)  # the last scrapes and the last rate windows
        load_to = time.time()
        start, end = round(load_from) - 30, round(load_to)
        window = {"start": start, "end": end, "step": STEP_S}
        answers = {
            "prometheus-rate-range.json": get(
                url, "/api/v1/query_range", {"query": DEFAULT_QUERY, **window}
            ),
            "prometheus-rate-by-instance.json": get(
                url,
                "/api/v1/query_range",
                {"query": "rate(nv_inference_request_success[1m])", **window},
            ),
            "prometheus-service.json": get(
                url, "/api/v1/query", {"query": service_query(end - start), "time": end}
            ),
            "prometheus-error.json": get(
                url, "/api/v1/query_range", {"query": "sum by (model) (rate(", **window}
            ),
        }
        for name, reply in answers.items():
            (HERE / name).write_bytes(reply.content)
            print(f"saved {name} (HTTP {reply.status_code}, {len(reply.content)} bytes)")
        # the requeued elastic job's second run: Slurm lets it start ~121 s after the requeue
        deadline = time.monotonic() + 240
        while triton.job_state(spec, elastic)[0] and time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(5)
        sacct = slurm(
            spec, "sacct", "--json", "--duplicates", "-a",
            "-S", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 - 60)), "-E", "now",
        )  # fmt: skip
        (HERE / "sacct-site-22.05.json").write_text(sacct)
        print(f"saved sacct-site-22.05.json ({len(sacct)} bytes)")
        stamps = {"capture_started": t0, "window": window, "phases": phases, "jobs": jobs}
        (HERE / "captures.json").write_text(json.dumps(stamps, indent=2) + "\n")
    finally:
        for job_id in jobs:
            slurm(spec, "scancel", job_id, check=False)
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        shutil.rmtree(tsdb, ignore_errors=True)


if __name__ == "__main__":
    main()
