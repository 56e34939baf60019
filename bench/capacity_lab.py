"""The capacity model against the lab: steady Poisson loads on `busy` (one instance, 20 ms
a request) sent straight to the reserved node's baseline Triton; the p99 the requests saw (client
side) and the mean compute time Triton measured, beside the p99 the policy's capacity
model (`bridge.policy.capacity`) predicts from that rate and compute time.

Baseline in the same run: the model's prediction (ratio measured / predicted). Usage (lab
up with its baseline Triton serving, root; no daemon running):
    .venv/bin/python bench/capacity_lab.py [--rates 10,20,30,35,40] [--seconds 30]
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx
import numpy as np

from bridge.lab import lab as lab_mod
from bridge.lab.showcase import Load
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir
from bridge.policy import capacity
from bridge.triton.client import HTTP_PORT, METRICS_PORT
from bridge.triton.metrics import parse_page

SLO_S = 0.1


def compute_us(metrics: str) -> tuple[float, float]:
    """busy's (successes, compute microseconds) so far on one Triton metrics page."""
    page = parse_page(metrics)
    sample = next(s for s in page.models.values() if s.model == "busy")
    compute = sum(
        v or 0.0
        for v in (
            sample.compute_input_duration_us,
            sample.compute_infer_duration_us,
            sample.compute_output_duration_us,
        )
    )
    return sample.request_success or 0.0, compute


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10,20,30,35,40")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    node = spec.pool_nodes("infer")[0]
    metrics_url = f"http://{node.addr}:{METRICS_PORT}/metrics"
    endpoint = f"{node.addr}:{HTTP_PORT}"
    print(f"{'rate/s':>7}{'sent/s':>8}{'compute ms':>11}{'p99 ms':>9}{'predicted':>10}{'ratio':>7}")
    ratios = []
    for rate in (float(r) for r in args.rates.split(",")):
        before = compute_us(httpx.get(metrics_url, timeout=5).text)
        load = Load(endpoint, rate, args.seconds, seed=int(rate))
        load.run()
        after = compute_us(httpx.get(metrics_url, timeout=5).text)
        served = after[0] - before[0]
        service_s = (after[1] - before[1]) / served / 1e6 if served else 0.0
        latencies = [r.latency_s for r in load.records if r.ok and r.latency_s is not None]
        # the first seconds fill the queue from empty: measure the steady part
        skip = len(latencies) // 6
        measured = float(np.percentile(latencies[skip:], 99)) if latencies else float("nan")
        sent = len(load.records) / args.seconds
        demand = {"busy": capacity.Demand(sent, service_s, SLO_S, instances=1)}
        predicted = capacity.predict([capacity.Group(("busy",), 1, 1)], demand)["busy"]
        ratio = measured / predicted if predicted else float("nan")
        ratios.append((rate, ratio))
        print(
            f"{rate:>7.0f}{sent:>8.1f}{service_s * 1000:>11.1f}{measured * 1000:>9.0f}"
            f"{predicted * 1000:>10.0f}{ratio:>7.2f}",
            flush=True,
        )
        time.sleep(3)
    print("RESULT " + " ".join(f"ratio_{r:.0f}={x:.2f}" for r, x in ratios))


if __name__ == "__main__":
    main()
