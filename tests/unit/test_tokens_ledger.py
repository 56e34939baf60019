"""An LLM's token counters from a Triton page into the ledger's serving samples (the
daemon's feed, `LedgerFeed.record_page`), read back as increases (`accounting.serving`):
Triton's vLLM backend (`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
triton-inference-server/vllm_backend src/utils/metrics.py) and the TensorRT-LLM backend
(the `_sum` of `nv_llm_input_token_len` / `nv_llm_output_token_len`, one observation per
request of its token count: tensorrtllm_backend custom_metrics_reporter.cc, whose own test
reads the counts from those `_sum` lines). A model without token counters stores None,
never zero; a reload's reset counts from zero again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from accounting.db import open_ledger
from accounting.serving import increases, read_samples, window_increases
from accounting.tables import SAMPLES
from bridge.config import BridgeConfig
from bridge.ledger.feed import LedgerFeed
from bridge.triton.metrics import parse_page

NOW = datetime(2026, 11, 3, 12, tzinfo=UTC)


def nv(model: str, compute_us: float, requests: int) -> str:
    labels = f'model="{model}",version="1"'
    return (
        "# TYPE nv_inference_request_success counter\n"
        f"nv_inference_request_success{{{labels}}} {requests}\n"
        "# TYPE nv_inference_compute_infer_duration_us counter\n"
        f"nv_inference_compute_infer_duration_us{{{labels}}} {compute_us}\n"
    )


def vllm_page(prompt: int, generated: int, compute_us: float = 1e6) -> str:
    """A vLLM-backend model's page (`smol`) beside a model with no token counters
    (`busy`)."""
    labels = 'model="smol",version="1"'
    return (
        nv("smol", compute_us, 3)
        + nv("busy", 5e5, 10)
        + "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        f"vllm:prompt_tokens_total{{{labels}}} {prompt}\n"
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        f"vllm:generation_tokens_total{{{labels}}} {generated}\n"
    )


def trt_page(prompt: int, generated: int, requests: int) -> str:
    """The TensorRT-LLM backend's token histograms: one observation per request."""
    out = nv("tensorrt_llm", 2e6, requests)
    for family, kind, total in (
        ("nv_llm_input_token_len", "total_input_tokens", prompt),
        ("nv_llm_output_token_len", "total_output_tokens", generated),
    ):
        labels = f'model="tensorrt_llm",response_metric_type="{kind}",version="1"'
        out += (
            f"# HELP {family} TRT LLM response metrics\n# TYPE {family} histogram\n"
            f'{family}_bucket{{{labels},le="10"}} 0\n'
            f'{family}_bucket{{{labels},le="+Inf"}} {requests}\n'
            f"{family}_count{{{labels}}} {requests}\n{family}_sum{{{labels}}} {total}\n"
        )
    return out


def feed(tmp_path: Path) -> LedgerFeed:
    config = BridgeConfig.model_validate(
        {"accounting": {"ledger_url": f"sqlite:///{tmp_path / 'l.db'}", "sample_interval_s": 0}}
    )
    return LedgerFeed(config, open_ledger(config.accounting.ledger_url))


def test_the_feed_stores_the_vllm_token_counters_and_none_for_other_models(
    tmp_path: Path,
) -> None:
    f = feed(tmp_path)
    t = NOW.timestamp()
    pages = [(0, vllm_page(0, 0)), (30, vllm_page(120, 80)), (60, vllm_page(300, 250))]
    for offset, text in pages:
        f.record_page("12", "127.0.1.4:8000", t + offset, parse_page(text))
    with f.ledger.connect() as conn:
        rows = conn.execute(
            select(SAMPLES.c.model, SAMPLES.c.prompt_tokens, SAMPLES.c.generation_tokens)
        ).all()
    smol = sorted((p, g) for m, p, g in rows if m == "smol")
    assert smol == [(0.0, 0.0), (120.0, 80.0), (300.0, 250.0)]
    assert {(p, g) for m, p, g in rows if m == "busy"} == {(None, None)}
    got = window_increases(f.ledger, NOW, NOW + timedelta(minutes=2))
    smol_inc = [i for i in got if i.model == "smol"]
    assert sum(i.prompt_tokens or 0 for i in smol_inc) == 300
    assert sum(i.generation_tokens or 0 for i in smol_inc) == 250
    assert all(i.generation_tokens is None for i in got if i.model == "busy")


def test_the_tensorrt_llm_backends_token_histograms_are_its_counters(tmp_path: Path) -> None:
    f = feed(tmp_path)
    t = NOW.timestamp()
    f.record_page("9", "127.0.1.4:8000", t, parse_page(trt_page(40, 100, 2)))
    f.record_page("9", "127.0.1.4:8000", t + 30, parse_page(trt_page(95, 260, 5)))
    (inc,) = window_increases(f.ledger, NOW, NOW + timedelta(minutes=1))
    assert (inc.model, inc.requests) == ("tensorrt_llm", 3)
    assert (inc.prompt_tokens, inc.generation_tokens) == (55, 160)


def test_a_reset_counts_from_zero_and_a_missing_end_is_unknown(tmp_path: Path) -> None:
    f = feed(tmp_path)
    t = NOW.timestamp()
    f.record_page("12", "i", t, parse_page(vllm_page(100, 90)))
    f.record_page("12", "i", t + 30, parse_page(vllm_page(20, 15, compute_us=1e5)))  # reload
    f.record_page("12", "i", t + 60, parse_page(nv("smol", 2e5, 4)))  # an old page: no tokens
    samples = read_samples(f.ledger, NOW, NOW + timedelta(minutes=2))
    got = sorted((i for i in increases(samples) if i.model == "smol"), key=lambda i: i.start)
    assert [(i.prompt_tokens, i.generation_tokens) for i in got] == [(20, 15), (None, None)]
