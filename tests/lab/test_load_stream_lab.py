"""`stb load --stream` against the lab's LLM (smol, from the lab's model repository, on a
Triton job of its own on an inference node): a few open-loop streams, every one ending
cleanly, and the tokens the client counted equal to what the model says it generated
(`vllm:generation_tokens_total`'s delta), the prompts' tokens to `vllm:prompt_tokens_total`'s.

Lean: one short server start (smol loads in about 2 s) and about six streams of 12
tokens; the module takes about 15 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from bridge.cli import app
from bridge.lab import triton
from bridge.lab.spec import LabSpec

from .helpers import triton_serving

pytestmark = pytest.mark.lab

MODEL = "smol"
OVERHEAD = 30  # SmolLM2-Instruct's chat template around the prompt, in tokens
PROMPT, OUTPUT = 40, 12


@pytest.fixture(scope="module")
def served(lab: LabSpec) -> Iterator[triton.TritonJob]:
    """A Triton job on the first inference node serving the LLM."""
    with triton_serving(lab, MODEL, "stb-triton-llm-load") as job:
        yield job


def counters(metrics_url: str) -> dict[str, float]:
    """smol's vLLM token counters on the metrics page."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=5).text):
        for s in family.samples:
            if s.name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
                assert s.labels.get("model") == MODEL, s
                out[s.name] = s.value
    return out


def test_client_token_counts_equal_the_models_counters(served: triton.TritonJob) -> None:
    before = counters(served.metrics_url)
    res = CliRunner().invoke(
        app,
        [
            *["load", "--stream", "-e", served.http_url, "--model", MODEL],
            *["--rate", "2", "--duration", "3", "--seed", "5"],
            *["--prompt-tokens", str(PROMPT), "--output-tokens", str(OUTPUT)],
            *["--prompt-overhead", str(OVERHEAD), "--json", "--quiet"],
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["due"] >= 2 and rep["ok"] == rep["due"], rep
    assert rep["broken"] == 0 and rep["failed"] == 0 and rep["dropped"] == 0
    # the prompt lands on its target exactly: the template plus one token per word
    assert rep["prompt_counted_mean"] == PROMPT
    # the model ends an answer at max_tokens or at its end of sequence, never after
    assert 0 < rep["tokens_out"] <= OUTPUT * rep["ok"]
    want = {
        "vllm:generation_tokens_total": rep["tokens_out"],
        "vllm:prompt_tokens_total": rep["tokens_in"],
    }
    deadline = time.monotonic() + 5  # the last token is counted just after it is sent
    while True:
        after = counters(served.metrics_url)
        delta = {k: after[k] - before.get(k, 0.0) for k in want}
        if delta == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta == want
    ttft, tpot = rep["ttft"], rep["tpot"]
    print(
        f"\n{rep['ok']} streams on {served.node}: {rep['tokens_out']} tokens out "
        f"({rep['short_answers']} answers ended before {OUTPUT}), TTFT p50 "
        f"{ttft['p50_ms']:.0f} ms p99 {ttft['p99_ms']:.0f} ms, TPOT p50 {tpot['p50_ms']:.1f} ms"
    )
