"""bridge.triton.metrics on pages recorded from the lab's Triton 2.51 (tests/data/triton/,
see capture.py there) and on literal pages: values, quantiles, NaN, garbage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridge.triton.metrics import COUNTERS, MetricsPage, parse_page

DATA = Path(__file__).resolve().parent.parent / "data" / "triton"


def recorded(name: str) -> MetricsPage:
    return parse_page((DATA / f"{name}.prom").read_text())


def test_busy_page_gives_every_family_for_both_models() -> None:
    page = recorded("busy_a")
    assert page.ok
    assert set(page.models) == {("busy", "1"), ("echo", "1")}
    busy = page.models[("busy", "1")]
    for field in COUNTERS.values():
        assert getattr(busy, field) is not None, field
    assert busy.request_success == 384
    assert busy.request_failure == 0  # eight series (reason x model), all zero
    assert busy.request_duration_us == 31676044
    assert busy.queue_duration_us == 23678243
    assert busy.compute_infer_duration_us == 7910468
    assert busy.pending_requests == 3
    assert busy.request_summary is not None and busy.queue_summary is not None
    assert busy.request_summary.count == 384
    assert busy.request_summary.sum_us == 31676044


def test_quantiles_are_the_ones_triton_emitted() -> None:
    s = recorded("busy_a").models[("busy", "1")].request_summary
    assert s is not None
    # Triton 2.51 emits 0.5, 0.9, 0.95, 0.99 and 0.999.
    assert [q for q, _ in s.quantiles] == [0.5, 0.9, 0.95, 0.99, 0.999]
    assert s.quantile(0.5) == 82390
    assert s.quantile(0.95) == 83144
    assert s.quantile(0.99) == 83428
    assert s.quantile(0.75) is None  # never interpolated


def test_nan_quantiles_of_an_unused_model_are_absent_not_zero() -> None:
    busy = recorded("idle").models[("busy", "1")]
    assert busy.request_summary is not None
    assert busy.request_summary.quantiles == ()  # Triton wrote "Nan" for each
    assert busy.request_summary.quantile(0.99) is None
    assert busy.request_summary.count == 0  # the count is a real zero
    assert busy.request_success == 0


def test_restart_page_counts_from_zero_again() -> None:
    busy = recorded("restart").models[("busy", "1")]
    assert busy.request_success == 5
    assert busy.request_success < recorded("busy_b").models[("busy", "1")].request_success


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        "<html><body>502 Bad Gateway</body></html>",
        'nv_inference_count{model="m",version="1"} abc',
        'nv_inference_count{model="m",version="1" 3',
        "\x00\x01\x02",
    ],
)
def test_garbage_is_no_data_with_the_reason(text: str) -> None:
    page = parse_page(text)
    assert not page.ok
    assert page.models == {}
    assert page.error is not None and "unparseable" in page.error


def test_empty_page_is_an_error() -> None:
    assert parse_page("").error == "empty page"
    assert parse_page("\n  \n").error == "empty page"


def test_truncated_page_keeps_what_arrived_and_leaves_the_rest_none() -> None:
    text = (DATA / "busy_a.prom").read_text()
    cut = text[: text.index("# HELP nv_inference_queue_duration_us")]
    busy = parse_page(cut).models[("busy", "1")]
    assert busy.request_duration_us == 31676044
    assert busy.queue_duration_us is None
    assert busy.pending_requests is None
    assert busy.request_summary is None


def test_nan_negative_and_infinite_values_are_none() -> None:
    page = parse_page(
        "# TYPE nv_inference_request_success counter\n"
        'nv_inference_request_success{model="m",version="1"} NaN\n'
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="m",version="1"} -4\n'
        "# TYPE nv_inference_exec_count counter\n"
        'nv_inference_exec_count{model="m",version="1"} +Inf\n'
        "# TYPE nv_inference_pending_request_count gauge\n"
        'nv_inference_pending_request_count{model="m",version="1"} 2\n'
    )
    m = page.models[("m", "1")]
    assert m.request_success is None
    assert m.inference_count is None
    assert m.exec_count is None
    assert m.pending_requests == 2


def test_series_of_one_model_are_added_and_quantiles_take_the_largest() -> None:
    page = parse_page(
        "# TYPE nv_inference_request_failure counter\n"
        'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2\n'
        'nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 3\n'
        "# TYPE nv_inference_request_summary_us summary\n"
        'nv_inference_request_summary_us_count{gpu_uuid="A",model="m",version="1"} 10\n'
        'nv_inference_request_summary_us_count{gpu_uuid="B",model="m",version="1"} 5\n'
        'nv_inference_request_summary_us{gpu_uuid="A",model="m",version="1",quantile="0.99"} 70\n'
        'nv_inference_request_summary_us{gpu_uuid="B",model="m",version="1",quantile="0.99"} 90\n'
        'nv_inference_request_summary_us{gpu_uuid="B",model="m",version="1",quantile="x"} 1\n'
    )
    m = page.models[("m", "1")]
    assert m.request_failure == 5
    assert m.request_summary is not None
    assert m.request_summary.count == 15
    assert m.request_summary.quantiles == ((0.99, 90),)


def test_one_invalid_series_makes_the_sum_unknown() -> None:
    page = parse_page(
        "# TYPE nv_inference_request_failure counter\n"
        'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2\n'
        'nv_inference_request_failure{model="m",reason="OTHER",version="1"} NaN\n'
    )
    assert page.models[("m", "1")].request_failure is None


def test_bad_value_in_a_family_the_signal_does_not_read_spoils_nothing() -> None:
    page = parse_page(
        "# TYPE nv_cpu_utilization gauge\n"
        "nv_cpu_utilization oops\n"
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="m",version="1"} 4\n'
    )
    assert page.ok and page.models[("m", "1")].inference_count == 4


def test_server_wide_metrics_without_a_model_label_are_ignored() -> None:
    page = parse_page("# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization 0.5\n")
    assert page.ok and page.models == {}


def test_samples_are_immutable() -> None:
    page = recorded("busy_a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        page.models[("busy", "1")].request_success = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        page.models[("x", "1")] = page.models[("busy", "1")]  # type: ignore[index]
