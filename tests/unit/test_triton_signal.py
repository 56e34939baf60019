"""bridge.triton.signal: quantiles, rates, ratio, counter resets and "no data", on pages
recorded from the lab's Triton (tests/data/triton/) and on literal pages."""

from __future__ import annotations

import dataclasses
import json
import math
from itertools import permutations
from pathlib import Path

import pytest

from bridge.triton.metrics import parse_page
from bridge.triton.signal import (
    InstanceSignal,
    ModelWindow,
    Scrape,
    Window,
    instance_signal,
    model_signals,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "triton"
STAMPS: dict[str, float] = json.loads((DATA / "captures.json").read_text())
PAGES = ("idle", "busy_a", "busy_b", "restart")


def recorded(name: str, incarnation: str = "") -> Scrape:
    text = (DATA / f"{name}.prom").read_text()
    return Scrape("n4", STAMPS[f"{name}.prom"], parse_page(text), incarnation)


def literal(
    at: float,
    *,
    success: float = 0,
    failure: float = 0,
    request_us: float = 0,
    queue_us: float = 0,
    compute_us: float = 0,
    pending: float = 0,
    quantiles: dict[str, str] | None = None,
    model: str = "m",
    instance: str = "i1",
    incarnation: str = "",
    omit: tuple[str, ...] = (),
) -> Scrape:
    """A Triton-shaped page for one model; compute time goes to compute_infer."""
    counters = {
        "nv_inference_request_success": success,
        "nv_inference_request_failure": failure,
        "nv_inference_request_duration_us": request_us,
        "nv_inference_queue_duration_us": queue_us,
        "nv_inference_compute_input_duration_us": 0,
        "nv_inference_compute_infer_duration_us": compute_us,
        "nv_inference_compute_output_duration_us": 0,
    }
    lab = f'model="{model}",version="1"'
    lines = []
    for name, v in counters.items():
        if name not in omit:
            lines += [f"# TYPE {name} counter", f"{name}{{{lab}}} {v}"]
    lines += [
        "# TYPE nv_inference_pending_request_count gauge",
        f"nv_inference_pending_request_count{{{lab}}} {pending}",
        "# TYPE nv_inference_request_summary_us summary",
        f"nv_inference_request_summary_us_count{{{lab}}} {success}",
        f"nv_inference_request_summary_us_sum{{{lab}}} {request_us}",
    ]
    for q, v in (quantiles or {}).items():
        lines.append(f'nv_inference_request_summary_us{{{lab},quantile="{q}"}} {v}')
    return Scrape(instance, at, parse_page("\n".join(lines) + "\n"), incarnation)


def only(sig: InstanceSignal, model: str = "m") -> ModelWindow:
    (w,) = [w for w in sig.models if w.model == model]
    return w


def test_under_load_rates_means_ratio_and_quantiles_from_recorded_pages() -> None:
    a, b = recorded("busy_a"), recorded("busy_b")
    w = only(instance_signal(a, b), "busy")
    seconds = b.at - a.at
    assert w.window is Window.OK
    assert w.requests == 869 - 384
    assert w.request_rate == pytest.approx(485 / seconds)
    assert w.failure_rate == 0.0
    assert w.mean_latency_ms == pytest.approx((71476321 - 31676044) / 485 / 1000)
    assert w.mean_queue_ms == pytest.approx((53481150 - 23678243) / 485 / 1000)
    # Four clients on one 20 ms instance: each request waits for about three others.
    assert w.queue_compute_ratio == pytest.approx(2.98, abs=0.01)
    assert w.pending == 3
    assert (w.p50_ms, w.p95_ms, w.p99_ms) == (82.131, 83.006, 83.668)


def test_idle_model_is_a_measured_zero_not_no_data() -> None:
    # echo got no request between busy_a and busy_b.
    w = only(instance_signal(recorded("busy_a"), recorded("busy_b")), "echo")
    assert w.window is Window.OK
    assert w.requests == 0 and w.request_rate == 0.0 and w.failure_rate == 0.0
    assert w.mean_latency_ms is None  # nothing measured: no mean, and not 0
    assert w.queue_compute_ratio is None
    assert w.p99_ms == 0.299  # Triton's 60 s window still holds earlier requests


def test_never_used_model_has_no_quantiles() -> None:
    w = only(instance_signal(recorded("idle"), recorded("idle")), "busy")
    assert w.window is Window.NO_DATA  # no time elapsed between the two
    assert (w.p50_ms, w.p95_ms, w.p99_ms) == (None, None, None)


def test_restart_window_counts_the_new_server_from_zero() -> None:
    b, r = recorded("busy_b"), recorded("restart")
    w = only(instance_signal(b, r), "busy")
    assert w.window is Window.RESET
    assert w.requests == 5  # what the new server counted, never 5 - 869
    assert w.request_rate == pytest.approx(5 / (r.at - b.at))
    assert w.mean_latency_ms == pytest.approx(127421 / 5 / 1000)
    assert w.p99_ms == 20.61


def test_restart_detected_by_incarnation_when_counters_grew_past_the_old_ones() -> None:
    a = literal(0, success=10, request_us=1000, incarnation="job-1")
    b = literal(10, success=40, request_us=4000, incarnation="job-2")
    w = only(instance_signal(a, b))
    assert w.window is Window.RESET
    assert w.requests == 40 and w.request_rate == 4.0
    same = only(instance_signal(a, literal(10, success=40, request_us=4000, incarnation="job-1")))
    assert same.window is Window.OK and same.requests == 30


def test_one_counter_going_back_resets_the_whole_model() -> None:
    # After a reload, success (12) already passed its old value but the durations did not:
    # every field must come from the same period, so all take the later values.
    a = literal(0, success=10, request_us=100_000, queue_us=50_000, compute_us=50_000)
    b = literal(5, success=12, request_us=24_000, queue_us=4_000, compute_us=20_000)
    w = only(instance_signal(a, b))
    assert w.window is Window.RESET
    assert w.requests == 12
    assert w.mean_latency_ms == pytest.approx(2.0)
    assert w.queue_compute_ratio == pytest.approx(0.2)


@pytest.mark.parametrize(("first", "second"), list(permutations(PAGES, 2)))
def test_any_pair_of_recorded_pages_gives_sane_numbers(first: str, second: str) -> None:
    """Whatever the order (a reversed pair looks like a restart), nothing is negative, and
    no rate exceeds the later page's total count over the window."""
    e = recorded(first)
    l_ = dataclasses.replace(recorded(second), at=e.at + 10)
    sig = instance_signal(e, l_)
    for w in sig.models:
        for field in ("requests", "request_rate", "failure_rate", "mean_latency_ms",
                      "mean_queue_ms", "queue_compute_ratio", "pending", "p99_ms"):  # fmt: skip
            v = getattr(w, field)
            assert v is None or (math.isfinite(v) and v >= 0), (field, v)
        if w.request_rate is not None and w.seconds:
            total = l_.page.models[(w.model, w.version)].request_success or 0
            assert w.request_rate <= total / abs(w.seconds) + 1e-9
        assert w.window is not Window.NO_DATA
    for m in model_signals([sig]).values():
        assert m.request_rate is None or m.request_rate >= 0


def test_first_sighting_has_no_counter_window_but_keeps_gauge_and_quantiles() -> None:
    later = literal(10, success=5, pending=2, quantiles={"0.5": "900", "0.99": "1500"})
    sig = instance_signal(None, later)
    w = only(sig)
    assert sig.error == "no earlier valid scrape"
    assert w.window is Window.NO_DATA
    assert w.requests is None and w.request_rate is None and w.mean_latency_ms is None
    assert w.pending == 2
    assert (w.p50_ms, w.p95_ms, w.p99_ms) == (0.9, None, 1.5)  # 0.95 not emitted: None


def test_nan_quantile_is_none() -> None:
    later = literal(10, quantiles={"0.99": "Nan", "0.5": "NaN"})
    w = only(instance_signal(literal(0), later))
    assert w.p99_ms is None and w.p50_ms is None


def test_non_positive_window_is_no_data() -> None:
    a, b = literal(10, success=1), literal(10, success=5)
    assert only(instance_signal(a, b)).window is Window.NO_DATA
    assert only(instance_signal(b, literal(5, success=9))).requests is None


def test_garbage_later_page_reports_the_known_models_as_no_data() -> None:
    earlier = recorded("busy_a")
    bad = Scrape("n4", earlier.at + 5, parse_page("<html>oops</html>"))
    sig = instance_signal(earlier, bad)
    assert sig.error is not None and "unparseable" in sig.error
    assert {(w.model, w.window) for w in sig.models} == {
        ("busy", Window.NO_DATA),
        ("echo", Window.NO_DATA),
    }
    assert all(w.p99_ms is None and w.pending is None for w in sig.models)
    agg = model_signals([sig])["busy"]
    assert agg.instances == 1 and agg.with_data == 0 and agg.p99_ms is None
    assert agg.request_rate is None and agg.pending is None


def test_garbage_earlier_page_gives_no_window() -> None:
    bad = Scrape("n4", 0, parse_page("garbage"))
    w = only(instance_signal(bad, recorded("busy_b")), "busy")
    assert w.window is Window.NO_DATA and w.requests is None
    assert w.p99_ms == 83.668


def test_missing_counter_leaves_only_what_needs_it_empty() -> None:
    a = literal(0, success=10, request_us=1000, queue_us=100, compute_us=800)
    b = literal(
        10, success=20, request_us=3000, compute_us=1600, omit=("nv_inference_queue_duration_us",)
    )
    w = only(instance_signal(a, b))
    assert w.mean_queue_ms is None and w.queue_compute_ratio is None
    assert w.mean_latency_ms == pytest.approx(0.2)
    assert w.request_rate == 1.0


def test_failures_count_in_the_request_rate_and_their_own_rate() -> None:
    w = only(instance_signal(literal(0, success=10, failure=1), literal(4, success=18, failure=5)))
    assert w.requests == 12
    assert w.request_rate == 3.0
    assert w.failure_rate == 1.0


def test_aggregate_sums_rates_weights_means_and_takes_the_worst_quantile() -> None:
    s1 = instance_signal(
        literal(0, instance="i1"),
        literal(
            10, instance="i1", success=100, request_us=100 * 10_000, queue_us=200_000,
            compute_us=800_000, pending=1, quantiles={"0.99": "20000", "0.5": "9000"},
        ),
    )  # fmt: skip
    s2 = instance_signal(
        literal(0, instance="i2"),
        literal(
            10, instance="i2", success=300, request_us=300 * 50_000, queue_us=9_000_000,
            compute_us=6_000_000, pending=4, quantiles={"0.99": "90000", "0.5": "40000"},
        ),
    )  # fmt: skip
    s3 = instance_signal(None, literal(10, instance="i3", success=7, pending=1))  # new: no data
    agg = model_signals([s1, s2, s3])["m"]
    assert (agg.instances, agg.with_data) == (3, 2)
    assert agg.requests == 400
    assert agg.request_rate == 40.0
    assert agg.mean_latency_ms == pytest.approx((1_000_000 + 15_000_000) / 400 / 1000)
    assert agg.queue_compute_ratio == pytest.approx(9_200_000 / 6_800_000)
    assert agg.pending == 6
    assert agg.p99_ms == 90.0 and agg.p50_ms == 40.0
    assert agg.p95_ms is None


def test_aggregate_keeps_models_apart() -> None:
    a = instance_signal(recorded("busy_a"), recorded("busy_b"))
    aggs = model_signals([a])
    assert set(aggs) == {"busy", "echo"}
    assert aggs["busy"].request_rate == pytest.approx(only(a, "busy").request_rate)
    assert aggs["echo"].requests == 0 and aggs["echo"].mean_latency_ms is None


def test_observations_of_two_instances_are_refused() -> None:
    with pytest.raises(ValueError, match="i1"):
        instance_signal(literal(0, instance="i1"), literal(10, instance="i2"))
