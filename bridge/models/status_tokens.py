"""An LLM version's token figures for its status (`bridge.models.status.gather`): TTFT and
TPOT p99 against the model's token SLOs, prompt and output tokens.

Live (`live_tokens`, pure): from the servers' metrics pages as `bridge.triton.metrics`
parses them (`ModelSample.llm`, the vLLM backend's families read by
`bridge.triton.llm_metrics`): the histograms and counters are cumulative since each
server loaded the version, so the p99s are over every request since then (the servers'
buckets summed, `histogram_quantile` as Prometheus reads them), not a recent window; the
labels say "since start". A page without the first-token histogram of the vLLM backend
falls back to Triton's own first-response histogram (ms), as the signal does.

The last hour (`last_hour_tokens`): instant queries to the site's Prometheus on the raw
series of the Triton servers (`job="triton"`), per version: `histogram_quantile(0.99,
sum by (version, le) (increase(<bucket>[1h])))` for TTFT and TPOT, and `increase` of the
prompt and generation token counters, divided by the hour for tokens/s. The recording
rules of deploy/prometheus/rules.yml (stb:model_ttft_p99_s:q20s, stb:model_tpot_p99_s:q20s,
stb:model_prompt_tps:rate20s, stb:model_output_tps:rate20s) sum over the versions over 20 s
windows, so they cannot give a version's hour. A Prometheus that does not answer is a
note, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from bridge.models.status_views import Tokens
from bridge.triton.llm_metrics import summed_p99
from bridge.triton.metrics import ModelSample
from bridge.triton.prometheus import PrometheusError, PrometheusSignal

#: the window of the last hour's queries, as PromQL writes it, and in seconds
WINDOW, WINDOW_S = "1h", 3600.0
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:time_per_output_token_seconds"
PROMPT = "vllm:prompt_tokens_total"
OUTPUT = "vllm:generation_tokens_total"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _total(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return math.fsum(vals) if vals else None


def _over(ms: float | None, slo_ms: float | None) -> bool:
    return ms is not None and slo_ms is not None and ms > slo_ms


def live_tokens(
    samples: Sequence[ModelSample], slo_ttft_ms: float | None, slo_tpot_ms: float | None
) -> Tokens | None:
    """One version's token figures since each server loaded it (None: no server's page
    has token metrics for it)."""
    llms = [s.llm for s in samples if s.llm is not None]
    if not llms:
        return None
    ttft_ms = _ms(summed_p99([x.ttft_s for x in llms if x.ttft_s is not None]))
    first = [x.ttft_s.count for x in llms if x.ttft_s is not None]
    if ttft_ms is None:  # Triton's own first-response histogram, in ms
        ttft_ms = summed_p99([x.first_response_ms for x in llms if x.first_response_ms])
        first = [x.first_response_ms.count for x in llms if x.first_response_ms is not None]
    tpot_ms = _ms(summed_p99([x.tpot_s for x in llms if x.tpot_s is not None]))
    return Tokens(
        requests=_total(first),
        ttft_p99_ms=ttft_ms,
        tpot_p99_ms=tpot_ms,
        prompt_tokens=_total([x.prompt_tokens for x in llms]),
        output_tokens=_total([x.generation_tokens for x in llms]),
        ttft_breach=_over(ttft_ms, slo_ttft_ms),
        tpot_breach=_over(tpot_ms, slo_tpot_ms),
    )


def token_hour_queries(model: str) -> dict[str, str]:
    """The instant queries of `model`'s token hour, per version (the model name is
    validated already; quotes and backslashes escaped all the same)."""
    name = model.replace("\\", "\\\\").replace('"', '\\"')
    sel = f'job="triton",model="{name}"'

    def p99(family: str) -> str:
        return (
            "histogram_quantile(0.99, sum by (version, le) "
            f"(increase({family}_bucket{{{sel}}}[{WINDOW}])))"
        )

    def increase(counter: str) -> str:
        return f"sum by (version) (increase({counter}{{{sel}}}[{WINDOW}]))"

    return {
        "ttft_s": p99(TTFT),
        "tpot_s": p99(TPOT),
        "requests": increase(f"{TTFT}_count"),
        "prompt": increase(PROMPT),
        "output": increase(OUTPUT),
    }


def last_hour_tokens(
    model: str,
    url: str | None,
    now: datetime,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    *,
    timeout_s: float = 3.0,
) -> tuple[dict[int, Tokens], str]:
    """Each version's token hour as of `now` from the Prometheus at `url`, and a note
    ("" when it answered; no Prometheus at all: {} and "")."""
    if not url:
        return {}, ""
    answers: dict[str, dict[int, float | None]] = {}
    signal = PrometheusSignal(url, timeout_s=timeout_s)
    try:
        for what, query in token_hour_queries(model).items():
            answers[what] = {
                int(labels["version"]): value
                for labels, value in signal.instant(query, now.timestamp())
                if labels.get("version", "").isdigit()
            }
    except PrometheusError as exc:
        return {}, f"Prometheus did not answer the token queries: {exc}"
    finally:
        signal.close()
    out: dict[int, Tokens] = {}
    for v in sorted({k for a in answers.values() for k in a}):
        ttft, tpot = answers["ttft_s"].get(v), answers["tpot_s"].get(v)
        ttft_ms = _ms(ttft if ttft is not None and math.isfinite(ttft) else None)
        tpot_ms = _ms(tpot if tpot is not None and math.isfinite(tpot) else None)
        prompt, output = answers["prompt"].get(v), answers["output"].get(v)
        out[v] = Tokens(
            requests=answers["requests"].get(v),
            ttft_p99_ms=ttft_ms,
            tpot_p99_ms=tpot_ms,
            prompt_tokens=prompt,
            output_tokens=output,
            ttft_breach=_over(ttft_ms, slo_ttft_ms),
            tpot_breach=_over(tpot_ms, slo_tpot_ms),
            prompt_tps=None if prompt is None else prompt / WINDOW_S,
            output_tps=None if output is None else output / WINDOW_S,
        )
    return out, ""
