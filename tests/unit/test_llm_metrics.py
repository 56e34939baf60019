"""An LLM's token metrics (bridge.triton.llm_metrics, through bridge.triton.metrics and
bridge.triton.signal) on recorded pages: the lab's smol (the vLLM backend's families,
tests/data/triton/llm/smol_*.prom), the TensorRT-LLM backend's (trtllm_*.prom, from its
README and custom metrics reporter) and Triton core's first-response histogram
(first_response.prom); Prometheus' histogram_quantile on literal buckets; the drain's
in-flight count of a page with one stream open."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bridge.daemon.observation import TritonServer
from bridge.daemon.observe import in_flight
from bridge.lifecycle import LeaseState
from bridge.policy.leasesync import LeaseWorld, ModelledJob, modelled_settings, sync_lease
from bridge.policy.snapshot import LeaseView
from bridge.policy.steps import Unload
from bridge.slurm.model import Job
from bridge.triton.llm_metrics import Histogram, LlmWindow, aggregate, histogram_quantile
from bridge.triton.metrics import parse_page
from bridge.triton.signal import Scrape, instance_signal, model_signals

DATA = Path(__file__).resolve().parents[1] / "data" / "triton" / "llm"
AT = json.loads((DATA / "captures.json").read_text())
INF = math.inf


def page(name: str):  # type: ignore[no-untyped-def]
    return parse_page((DATA / name).read_text())


def scrape(name: str, at: float | None = None, job: str = "7") -> Scrape:
    return Scrape("127.0.1.4:8000", AT.get(name, 0.0) if at is None else at, page(name), job)


def test_the_quantile_interpolates_in_its_bucket_as_prometheus_does() -> None:
    buckets = [(0.1, 4.0), (0.5, 9.0), (2.0, 10.0), (INF, 10.0)]
    # rank 9.9 falls in (0.5, 2.0], which holds 1 of it: 0.5 + 1.5 * 0.9
    assert histogram_quantile(0.99, buckets) == pytest.approx(1.85)
    # rank 5 in (0.1, 0.5] holding 5: 0.1 + 0.4 * (5 - 4) / 5
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.18)
    # the first bucket interpolates from 0
    assert histogram_quantile(0.2, buckets) == pytest.approx(0.05)
    # a rank in the +Inf bucket: the largest finite bound
    assert histogram_quantile(0.99, [(1.0, 1.0), (INF, 3.0)]) == 1.0
    # no observation, no +Inf bucket, q out of range: no data, never 0
    assert histogram_quantile(0.99, [(1.0, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.99, [(1.0, 3.0), (2.0, 3.0)]) is None
    assert histogram_quantile(1.5, buckets) is None
    # a torn read (a count falling with the bound) is raised as Prometheus does
    assert histogram_quantile(0.5, [(1.0, 4.0), (2.0, 3.0), (INF, 4.0)]) == pytest.approx(0.5)


def test_the_smol_page_gives_the_vllm_backends_families_per_model_and_version() -> None:
    sample = page("smol_a.prom").models[("smol", "1")]
    llm = sample.llm
    assert llm is not None and llm.ttft_s is not None and llm.tpot_s is not None
    assert (llm.prompt_tokens, llm.generation_tokens) == (70.0, 48.0)
    assert (llm.ttft_s.count, llm.e2e_s.count if llm.e2e_s else None) == (2.0, 2.0)
    assert llm.ttft_s.buckets[-1] == (INF, 2.0) and len(llm.ttft_s.buckets) == 17
    assert llm.running is None and llm.waiting is None  # the vLLM backend has no gauge
    assert llm.open_streams == 0.0
    # a model with no token family has none: not zeros
    busy = parse_page((DATA.parent / "busy_a.prom").read_text()).models[("busy", "1")]
    assert busy.llm is None


def test_ttft_and_tpot_p99_and_token_rates_over_the_window_between_two_scrapes() -> None:
    a, b = scrape("smol_a.prom"), scrape("smol_b.prom")
    sig = model_signals([instance_signal(a, b)])["smol"]
    # 3 first tokens in the window, all in (0.25, 0.5] s: 250 + 250 * 2.97 / 3
    assert sig.ttft_p99_ms == pytest.approx(497.5)
    # 243 gaps, rank 240.57 in (0.1, 0.15] s, which holds 235..243: 100 + 50 * 5.57 / 8
    assert sig.tpot_p99_ms == pytest.approx(134.8125)
    seconds = AT["smol_b.prom"] - AT["smol_a.prom"]
    assert sig.prompt_tps == pytest.approx(109 / seconds)
    assert sig.output_tps == pytest.approx(246 / seconds)
    assert sig.running == 0.0 and sig.waiting is None
    # the first sighting has no window: the gauges stand, the p99s and rates are no data
    first = model_signals([instance_signal(None, a)])["smol"]
    assert (first.ttft_p99_ms, first.tpot_p99_ms, first.output_tps) == (None, None, None)
    assert first.running == 0.0
    # a window with no request: None, never 0
    idle = model_signals([instance_signal(b, scrape("smol_b.prom", AT["smol_b.prom"] + 5))])
    assert idle["smol"].ttft_p99_ms is None and idle["smol"].output_tps == 0.0


def test_a_restart_takes_the_later_counts_as_the_windows() -> None:
    # smol_b's counts before smol_a's on a new job: a reset, the later values are deltas
    later = scrape("smol_a.prom", AT["smol_b.prom"] + 10, job="8")
    sig = model_signals([instance_signal(scrape("smol_b.prom"), later)])["smol"]
    assert sig.output_tps == pytest.approx(48 / 10)  # smol_a's 48 tokens over 10 s
    assert sig.ttft_p99_ms is not None and 0 < sig.ttft_p99_ms <= 500


def test_the_tensorrt_llm_page_gives_tokens_and_its_active_and_waiting_requests() -> None:
    a, b = scrape("trtllm_a.prom", 100.0), scrape("trtllm_b.prom", 110.0)
    sig = model_signals([instance_signal(a, b)])["tensorrt_llm"]
    assert sig.prompt_tps == pytest.approx(250.0) and sig.output_tps == pytest.approx(100.0)
    assert (sig.running, sig.waiting) == (4.0, 2.0)
    # no time-to-first-token or per-token histogram in that backend: no data
    assert sig.ttft_p99_ms is None and sig.tpot_p99_ms is None


def test_tritons_first_response_histogram_stands_in_for_ttft() -> None:
    llm = page("first_response.prom").models[("llm", "1")].llm
    assert llm is not None and llm.first_response_ms is not None
    window = LlmWindow(seconds=10.0, first_response_ms=llm.first_response_ms)
    tokens = aggregate([window])
    # rank 9.9 in (500, 2000] ms holding 1: 500 + 1500 * 0.9
    assert tokens is not None and tokens.ttft_p99_ms == pytest.approx(1850.0)


def test_replicas_p99_is_the_quantile_of_their_summed_buckets() -> None:
    fast = Histogram(((0.1, 99.0), (1.0, 99.0), (INF, 99.0)), 99.0)
    slow = Histogram(((0.1, 0.0), (1.0, 1.0), (INF, 1.0)), 1.0)
    tokens = aggregate([LlmWindow(seconds=5.0, ttft_s=fast), LlmWindow(seconds=5.0, ttft_s=slow)])
    # 100 requests, rank 99 reached in the first bucket: 100 ms (the slow replica's own
    # p99 would say 1000 ms)
    assert tokens is not None and tokens.ttft_p99_ms == pytest.approx(100.0)


def test_an_open_stream_is_in_flight_and_the_drain_waits_for_it() -> None:
    open_ = page("smol_open.prom").models[("smol", "1")]
    # Triton's queue gauge says nothing of a stream being generated
    assert open_.pending_requests == 0.0
    assert in_flight(open_) == 1.0
    done = page("smol_b.prom").models[("smol", "1")]
    assert in_flight(done) == 0.0

    t0 = 1_800_000_000.0
    lease = LeaseView(3, "n3", "elastic", "preempt", LeaseState.DRAINING, ("smol",), t0, t0, "41")
    job = Job("41", "stb-triton", "elastic", "bridge", "slurm", "RUNNING", "None", ("n3",),
              "stb:triton", 0, 0, None, None)  # fmt: skip

    def world(sample_in_flight: float) -> LeaseWorld:
        server = TritonServer(
            job, "n3", "127.0.1.3:8000", True, ("smol",), {"smol": sample_in_flight}
        )
        return LeaseWorld(True, ModelledJob("41", "RUNNING"), server)

    settings = modelled_settings()
    assert sync_lease(lease, world(in_flight(open_)), t0 + 5, settings) is None
    step = sync_lease(lease, world(in_flight(done)), t0 + 10, settings)
    assert step is not None and step.commands[0] == Unload("127.0.1.3:8000", ("smol",))
    assert step.move is not None and "no request in flight" in step.move.reason
