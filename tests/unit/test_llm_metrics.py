"""An LLM's token metrics (bridge.triton.llm_metrics, through bridge.triton.metrics and
bridge.triton.signal) on recorded pages: the lab's smol (the vLLM backend's families,
tests/data/triton/llm/smol_*.prom), the TensorRT-LLM backend's (trtllm_*.prom, from its
README and custom metrics reporter) and Triton core's first-response histogram
(first_response.prom); Prometheus' histogram_quantile on literal buckets; the prompt and
output length distributions (cumulative since the load, as quantiles), through to the
observer's sample; the drain's in-flight count of a page with one stream open."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bridge.config import ModelConfig
from bridge.daemon.observation import TritonServer
from bridge.daemon.observe import Observer, in_flight
from bridge.lifecycle import LeaseState
from bridge.policy.leasesync import LeaseWorld, ModelledJob, modelled_settings, sync_lease
from bridge.policy.snapshot import LeaseView
from bridge.policy.steps import Unload
from bridge.slurm.model import Job
from bridge.triton.llm_metrics import (
    LENGTH_QUANTILES,
    Histogram,
    LlmWindow,
    aggregate,
    histogram_quantile,
    length_quantiles,
)
from bridge.triton.metrics import parse_page
from bridge.triton.protocol import RepositoryModel
from bridge.triton.signal import Scrape, instance_signal, model_signals
from tests.unit.fakes import BASELINE_JOB, N1, FakeSlurm, make_config

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


def test_the_means_are_the_windows_sums_over_their_counts_not_the_first_response() -> None:
    one = Histogram(((0.1, 3.0), (INF, 4.0)), 4.0, 0.8)  # 4 requests, 200 ms each
    two = Histogram(((0.1, 0.0), (INF, 6.0)), 6.0, 3.0)  # 6 requests, 500 ms each
    gaps = Histogram(((0.05, 90.0), (INF, 100.0)), 100.0, 3.0)
    # Triton's first response holds the queue's wait: never the TTFT clock's mean
    queued = Histogram(((500.0, 0.0), (INF, 5.0)), 5.0, 9000.0)
    tokens = aggregate(
        [
            LlmWindow(seconds=5.0, ttft_s=one, tpot_s=gaps),
            LlmWindow(seconds=5.0, ttft_s=two),
            LlmWindow(seconds=5.0, first_response_ms=queued),
        ]
    )
    assert tokens is not None
    assert tokens.ttft_mean_ms == pytest.approx(380.0)  # (0.8 + 3.0) / 10 s
    assert tokens.tpot_mean_ms == pytest.approx(30.0)
    assert tokens.timed == 10.0
    # a window without an observation says nothing, never zero
    empty = aggregate([LlmWindow(seconds=5.0, ttft_s=Histogram(((INF, 0.0),), 0.0, 0.0))])
    assert empty is not None and empty.ttft_mean_ms is None and empty.tpot_mean_ms is None


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


# ---- the length distributions --------------------------------------------------------


def mid(k: int) -> float:
    """The k-th representative's q: the middle of the k-th of 101 equal slices."""
    return (k + 0.5) / LENGTH_QUANTILES


def test_length_quantiles_are_101_equally_weighted_quantiles_of_a_known_distribution() -> None:
    # 50 requests of at most 10 tokens, 50 of 10 to 20: spread evenly within each bucket
    hist = Histogram(((10.0, 50.0), (20.0, 100.0), (INF, 100.0)), 100.0)
    lengths = length_quantiles([hist])
    assert lengths is not None and len(lengths) == LENGTH_QUANTILES == 101
    assert list(lengths) == sorted(lengths)
    assert lengths[0] == pytest.approx(10 * mid(0) / 0.5)  # neither q = 0 ...
    assert lengths[50] == pytest.approx(10.0)  # the median: the first bucket's bound
    assert lengths[100] == pytest.approx(10 + 10 * (mid(100) - 0.5) / 0.5)  # ... nor 1
    assert sum(lengths) / len(lengths) == pytest.approx(10.0)  # the distribution's mean
    # ranks in the +Inf bucket read as the largest finite bound (Prometheus' reading):
    # 10 of 100 requests above 10 tokens, the 10 representatives past q = 0.9 read 10
    tail = length_quantiles([Histogram(((10.0, 90.0), (INF, 100.0)), 100.0)])
    assert tail is not None and tail[-10:] == (10.0,) * 10 and tail[-11] < 10.0


def test_length_quantiles_sum_replicas_with_the_same_bounds() -> None:
    short = Histogram(((10.0, 30.0), (100.0, 30.0), (INF, 30.0)), 30.0)
    long = Histogram(((10.0, 0.0), (100.0, 70.0), (INF, 70.0)), 70.0)
    lengths = length_quantiles([short, long])
    together = Histogram(((10.0, 30.0), (100.0, 100.0), (INF, 100.0)), 100.0)
    assert lengths is not None and lengths == length_quantiles([together])
    # 30% short: representatives 0..29 below 10 tokens, the rest above
    assert max(lengths[:30]) < 10.0 < min(lengths[30:])


def test_length_quantiles_of_mismatched_bounds_take_the_most_observed() -> None:
    few = Histogram(((5.0, 3.0), (INF, 3.0)), 3.0)
    many = Histogram(((10.0, 0.0), (100.0, 40.0), (INF, 40.0)), 40.0)
    also = Histogram(((10.0, 0.0), (100.0, 10.0), (INF, 10.0)), 10.0)
    assert length_quantiles([few, many]) == length_quantiles([many])
    # replicas whose bounds agree are summed first: 50 together against the 45 others
    more = Histogram(((5.0, 45.0), (INF, 45.0)), 45.0)
    assert length_quantiles([more, many, also]) == length_quantiles([many, also])


def test_length_quantiles_without_an_observation_are_none_never_zero() -> None:
    assert length_quantiles([]) is None
    assert length_quantiles([Histogram(((10.0, 0.0), (INF, 0.0)), 0.0)]) is None
    assert length_quantiles([Histogram(((10.0, 5.0), (20.0, 5.0)))]) is None  # no +Inf
    tokens = aggregate([LlmWindow(seconds=5.0)])
    assert tokens is not None and (tokens.prompt_lengths, tokens.output_lengths) == (None, None)


def test_the_pages_length_histograms_are_read_from_both_backends() -> None:
    llm = page("smol_a.prom").models[("smol", "1")].llm
    assert llm is not None and llm.prompt_len is not None and llm.output_len is not None
    assert (llm.prompt_len.count, llm.prompt_len.sum) == (2.0, 70.0)
    assert (llm.output_len.count, llm.output_len.sum) == (2.0, 48.0)
    bounds = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, INF)  # 1-2-5 to the context
    assert tuple(le for le, _ in llm.prompt_len.buckets) == bounds
    assert llm.prompt_len.buckets[4:6] == ((20.0, 0.0), (50.0, 2.0))
    # TensorRT-LLM's token histograms: the lengths, and their _sum still the token count
    trt = page("trtllm_b.prom").models[("tensorrt_llm", "1")].llm
    assert trt is not None and trt.prompt_len is not None and trt.output_len is not None
    assert trt.prompt_len.buckets[-3:] == ((500.0, 50.0), (1000.0, 50.0), (INF, 50.0))
    assert trt.output_len.count == 50.0 and trt.generation_tokens == 5000.0
    assert trt.prompt_tokens == 10500.0


def test_the_signals_lengths_are_cumulative_since_the_load_not_the_windows() -> None:
    a, b = scrape("smol_a.prom"), scrape("smol_b.prom")
    (window,) = instance_signal(a, b).models
    earlier, later = a.page.models[("smol", "1")].llm, b.page.models[("smol", "1")].llm
    assert window.llm is not None and earlier is not None and later is not None
    assert earlier.prompt_len is not None and later.prompt_len is not None
    assert window.llm.prompt_len == later.prompt_len  # smol_b's 5 requests, not the 3 new
    assert window.llm.ttft_s is not None and window.llm.ttft_s.count == 3.0  # a delta
    sig = model_signals([instance_signal(a, b)])["smol"]
    assert sig.prompt_lengths == length_quantiles([later.prompt_len])
    assert sig.output_lengths is not None and len(sig.output_lengths) == LENGTH_QUANTILES
    # 5 prompts in (20, 50]: spread over that bucket
    assert sig.prompt_lengths is not None
    assert sig.prompt_lengths[0] == pytest.approx(20 + 30 * mid(0))
    # 4 outputs in (20, 50], 1 in (100, 200]: the top fifth above 100 tokens
    assert sig.output_lengths[80] < 100.0 < sig.output_lengths[81]
    # the first sighting (no window) has them too, as it has the gauges
    first = model_signals([instance_signal(None, a)])["smol"]
    assert first.output_tps is None and first.prompt_lengths is not None
    assert first.prompt_lengths == length_quantiles([earlier.prompt_len])
    # two replicas' pages: the buckets summed (smol_a's 2 and smol_b's 5 prompts)
    other = Scrape("127.0.1.5:8000", b.at, b.page, "9")
    both = model_signals([instance_signal(a, b), instance_signal(None, other)])["smol"]
    summed = Histogram(tuple((le, 2 * c) for le, c in later.prompt_len.buckets))
    assert both.prompt_lengths == length_quantiles([summed])


class _SmolReplica:
    """A ready server holding smol whose page is the next recorded one."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages

    def is_ready(self) -> bool:
        return True

    def repository_index(self) -> tuple[RepositoryModel, ...]:
        return (RepositoryModel("smol", "1", "READY", ""),)

    def metrics_text(self) -> str:
        return (DATA / self.pages.pop(0)).read_text()


def test_the_observers_sample_carries_the_length_distributions(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config = config.model_copy(update={"models": {"smol": ModelConfig(slo_p99_ms=5000)}})
    replica = _SmolReplica(["smol_a.prom", "smol_b.prom"])
    clock = iter([0.0, 5.0])
    observer = Observer(
        FakeSlurm([N1], [BASELINE_JOB]),
        config,
        lambda address: replica,  # type: ignore[arg-type, return-value]
        clock=lambda: next(clock),
    )
    observer.observe(0.0)
    first = observer.latest("smol")
    assert first is not None and first.prompt_lengths is not None
    observer.observe(5.0)
    sample = observer.latest("smol")
    later = page("smol_b.prom").models[("smol", "1")].llm
    assert sample is not None and later is not None
    assert later.prompt_len is not None and later.output_len is not None
    assert sample.prompt_lengths == length_quantiles([later.prompt_len])
    assert sample.output_lengths == length_quantiles([later.output_len])
    assert sample.output_tps is not None and sample.output_tps > 0
    # the backend's own TTFT clock and token gaps over the window, as the capacity
    # model's correction reads them
    earlier = page("smol_a.prom").models[("smol", "1")].llm
    assert earlier is not None and earlier.ttft_s is not None and later.ttft_s is not None
    assert later.ttft_s.sum is not None and earlier.ttft_s.sum is not None
    assert later.ttft_s.count is not None and earlier.ttft_s.count is not None
    timed = later.ttft_s.count - earlier.ttft_s.count
    assert sample.timed == timed
    if timed:
        want = (later.ttft_s.sum - earlier.ttft_s.sum) / timed * 1000.0
        assert sample.ttft_mean_ms == pytest.approx(want)
