"""`stb load`'s sender against a real Triton job on the lab: the `busy` model (one
instance, 20 ms per request, so at most 50 requests/s) answers a rate below its capacity
quickly and without errors, and a rate above it makes p99 climb far above 20 ms while the
open-loop sender keeps offering the full rate."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import httpx
import pytest

from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.load.arrivals import poisson
from bridge.load.report import Report, summarize
from bridge.load.runner import RunConfig, parse_endpoint, run

pytestmark = pytest.mark.lab

SERVICE_MS = 20.0  # triton_repo/busy/config.pbtxt: service_time_ms


@pytest.fixture(scope="module")
def served(lab: LabSpec) -> Iterator[triton.TritonJob]:
    node = lab.pool_nodes("elastic")[0].name
    job_id = triton.submit(lab, node=node, models="busy", name="stb-triton-load")
    try:
        job = triton.wait_ready(lab, job_id, timeout_s=120)
        body = {
            "inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [1.0] * 16}]
        }
        for _ in range(3):  # warm the Python backend before timing it
            r = httpx.post(f"http://{job.http_url}/v2/models/busy/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text
        yield job
    finally:
        slurm(lab, "scancel", job_id, check=False)


def _load(job: triton.TritonJob, rate: float, duration_s: float, seed: int) -> Report:
    config = RunConfig(
        endpoints=(parse_endpoint(job.http_url),),
        model="busy",
        shape=(16,),
        max_requests=2_000,
        max_duration_s=duration_s,
        concurrency_cap=1_000,  # never hit: drops would hide the queue we want to see
        timeout_s=30.0,
    )
    schedule = poisson(rate, duration_s, seed)
    return summarize(asyncio.run(run(schedule, config, target_rate=rate)))


def test_below_capacity_latency_stays_low_and_rate_is_met(served: triton.TritonJob) -> None:
    rate, duration = 20.0, 10.0  # 40% of busy's capacity
    rep = _load(served, rate, duration, seed=1)
    t = rep.total
    print(
        f"\nbelow capacity: {t.sent_rate:.1f}/s sent of {rate:g}/s, ok {t.ok_rate:.1f}/s, "
        f"p50 {t.latency.p50_ms:.1f} ms, p99 {t.latency.p99_ms:.1f} ms"
    )
    assert t.errors == {} and t.dropped == 0 and t.ok == t.due > 0
    # Every due request went out: the achieved rate is the Poisson schedule's, within
    # 5 sd of the target (count ~ Poisson(200), sd 14, so +-7/s over 10 s).
    assert t.sent_rate == t.offered_rate
    assert abs(t.sent_rate - rate) <= 5 * math.sqrt(rate * duration) / duration
    # M/D/1 at 40% load waits on average 6.7 ms; p95 a few service times. p95, not p99:
    # of ~200 requests p99 is the second slowest, and one stall of the shared 2-core
    # machine (CI saw 311 ms with p95 at 84 ms) sets it. 250 ms is still far below the
    # overload figure, where the queue holds most requests for seconds.
    assert t.latency.p50_ms is not None and t.latency.p95_ms is not None
    assert SERVICE_MS <= t.latency.p50_ms < 100
    assert t.latency.p95_ms < 250


def test_above_capacity_p99_rises_far_above_service_time(served: triton.TritonJob) -> None:
    rate, duration = 80.0, 4.0  # 160% of capacity
    rep = _load(served, rate, duration, seed=2)
    t = rep.total
    print(
        f"\nabove capacity: {t.sent_rate:.1f}/s sent of {rate:g}/s, ok {t.ok_rate:.1f}/s, "
        f"p50 {t.latency.p50_ms:.1f} ms, p99 {t.latency.p99_ms:.1f} ms"
    )
    assert t.errors == {} and t.dropped == 0 and t.ok == t.due
    # Open loop: the full rate was offered although the server could not keep up...
    assert abs(t.sent_rate - rate) <= 5 * math.sqrt(rate * duration) / duration
    # ...and it could not: one instance at 20 ms serves at most 50/s.
    assert t.ok_rate < 1000 / SERVICE_MS * 1.1
    # The queue grows by about 30 requests/s, 120 by the end, 2.4 s of work: p99 is
    # seconds. 500 ms (25 service times) is a bound that only a keeping-up server meets.
    assert t.latency.p99_ms is not None and t.latency.p99_ms > 500
