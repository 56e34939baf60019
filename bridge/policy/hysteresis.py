"""The measured-latency hysteresis of the policy: each model's recent samples say a
sustained breach, a calm, or neither (`evaluate_model`), for the backstop and the return of
`bridge.policy.decide`; the samples' depth the observer and the simulator keep
(`history_depth`). Pure.

Breach: above high_watermark x SLO for `breach_evaluations` ticks with the tick's mean
latency above the low watermark (Triton's p99 window lags a minute behind). Calm: below
low_watermark x SLO for `return_dwell_s`, a tick that served no request and had none
waiting counting as calm whatever the lagging p99 says (`idle`: a replica's first slow
answers would otherwise hold an idle model's lend for a minute). A tick without data is
neither, so missing metrics never cause a lend or a return. An LLM's TTFT and TPOT p99s
are judged the same way against their own objectives (without the mean's confirmation:
they do not lag), except that an LLM with a profile is calm by the part of its TTFT and
TPOT above what it has at no load (`calm_ratio`): its longest prompts' prefill holds its
TTFT p99 up at any load, one sequence's decode its TPOT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

from bridge.config import BridgeConfig, ModelConfig
from bridge.policy.llm import floors_ms
from bridge.policy.snapshot import ModelSample
from bridge.policy.tokens import TokenProfile


class ModelStatus(StrEnum):
    BREACH = "breach"
    CALM = "calm"
    STEADY = "steady"


def history_depth(config: BridgeConfig) -> int:
    """Samples per model the policy reads: its consecutive counts and the forecast's
    window. The observer and the simulator keep this many."""
    policy = config.policy
    span = max(policy.forecast_window_s, policy.return_dwell_s)
    return max(policy.breach_evaluations, ticks(span, config) + 1)


def ticks(seconds: float, config: BridgeConfig) -> int:
    return max(1, math.ceil(seconds / config.tick_s))


def evaluate_model(
    history: Sequence[ModelSample],
    model: ModelConfig,
    config: BridgeConfig,
    profile: TokenProfile | None = None,
) -> ModelStatus:
    """Sustained breach (`breach_evaluations` ticks), calm (quiet for `return_dwell_s`), or
    neither, from the recent samples: of the request p99 and, for an LLM, of its TTFT and
    TPOT p99s too (a breach of either is a breach; calm needs both calm). `profile`: an
    LLM's token profile, where it has one: each sample is then calm by the part of its
    p99s over their no-load floors by its own lengths (`calm_ratio`)."""
    status = _request_status(history, model, config)
    if not model.has_token_slo:
        return status
    tokens = _token_status(history, model, config, profile)
    if ModelStatus.BREACH in (status, tokens):
        return ModelStatus.BREACH
    if status == tokens == ModelStatus.CALM:
        return ModelStatus.CALM
    return ModelStatus.STEADY


def token_ratio(sample: ModelSample, model: ModelConfig) -> float | None:
    """The sample's worst token p99 over its objective (1.0: at the SLO); None when it
    measured none of the token p99s the model has an objective for."""
    worst: float | None = None
    for value, slo in (
        (sample.ttft_p99_ms, model.slo_ttft_p99_ms),
        (sample.tpot_p99_ms, model.slo_tpot_p99_ms),
    ):
        if value is not None and slo is not None and (worst is None or value / slo > worst):
            worst = value / slo
    return worst


def calm_ratio(
    sample: ModelSample,
    model: ModelConfig,
    floors: tuple[float | None, float | None] = (None, None),
) -> float | None:
    """`token_ratio` as the calm reads it. With `floors` (the TTFT and TPOT p99s, ms, the
    model has at no load: the prefill of its longest prompts, the decode of one sequence,
    `bridge.policy.llm.floors_ms`), each p99 under its objective is read as its share of
    the room load can use, (p99 - floor) / (objective - floor), 0 at or under the floor.
    A model whose longest prompts alone take most of its TTFT objective is never under
    low_watermark x objective however many replicas it has; the part load adds can be."""
    worst: float | None = None
    for value, slo, floor in (
        (sample.ttft_p99_ms, model.slo_ttft_p99_ms, floors[0]),
        (sample.tpot_p99_ms, model.slo_tpot_p99_ms, floors[1]),
    ):
        if value is None or slo is None:
            continue
        if floor is not None and floor < slo:
            ratio = max(0.0, value - floor) / (slo - floor)
        else:
            ratio = value / slo
        if worst is None or ratio > worst:
            worst = ratio
    return worst


def _token_status(
    history: Sequence[ModelSample],
    model: ModelConfig,
    config: BridgeConfig,
    profile: TokenProfile | None = None,
) -> ModelStatus:
    """An LLM's breach and calm by its TTFT and TPOT p99s. They are measured over each
    tick's own window (the histograms' deltas, `bridge.triton.llm_metrics`), so unlike
    Triton's 60 s summary they do not lag: a breach needs no confirmation by the mean.
    Calm reads `calm_ratio`, with each sample's no-load floor where `profile` is given
    (`bridge.policy.llm.floors_ms`)."""
    policy = config.policy
    n = len(history)
    k = policy.breach_evaluations
    if n >= k:
        ratios = [token_ratio(s, model) for s in history[n - k :]]
        if all(r is not None and r > policy.high_watermark for r in ratios):
            return ModelStatus.BREACH
    k = ticks(policy.return_dwell_s, config)
    if n >= k and all(
        s.request_rate is not None
        and (
            (r := calm_ratio(s, model, (None, None) if profile is None else floors_ms(profile, s)))
            is None
            or r < policy.low_watermark
        )
        for s in history[n - k :]
    ):
        return ModelStatus.CALM
    return ModelStatus.STEADY


def _request_status(
    history: Sequence[ModelSample], model: ModelConfig, config: BridgeConfig
) -> ModelStatus:
    """`evaluate_model` by the request p99 alone (an LLM without a request objective:
    never a breach, calm while it has requests)."""
    policy = config.policy
    high = policy.high_watermark * model.slo_p99_ms
    low = policy.low_watermark * model.slo_p99_ms
    last = history[-1] if history else None
    if last is None or not (
        (last.p99_ms is not None and last.p99_ms > high)
        or (last.request_rate is not None and (last.p99_ms is None or last.p99_ms < low))
        or idle(last)
    ):
        return ModelStatus.STEADY
    n = len(history)
    # Triton's p99 covers its last 60 s, so it lags: after a burst it stays high for a
    # minute. A breach counts only while the tick's own mean latency confirms that
    # requests are slow now (above the low watermark). Each run is checked newest first
    # (the first sample that breaks it ends the check).
    k = policy.breach_evaluations
    if n >= k:
        for i in range(n - 1, n - k - 1, -1):
            s = history[i]
            p99, mean = s.p99_ms, s.mean_ms
            if p99 is None or not p99 > high or mean is None or not mean > low:
                break
        else:
            return ModelStatus.BREACH
    k = ticks(policy.return_dwell_s, config)
    if n >= k:
        for i in range(n - 1, n - k - 1, -1):
            s = history[i]
            if s.request_rate is None:
                break
            p99 = s.p99_ms
            if p99 is not None and not p99 < low and not idle(s):
                break
        else:
            return ModelStatus.CALM
    return ModelStatus.STEADY


def idle(sample: ModelSample) -> bool:
    """The tick served no request and had none waiting: its p99 (Triton's, over the last
    60 s) speaks of requests before it, not of this tick."""
    return sample.request_rate == 0 and not sample.pending


def service_s(history: Sequence[ModelSample]) -> float | None:
    """The model's latest measured compute time per request, in seconds."""
    for s in reversed(history):
        if s.compute_ms is not None and s.compute_ms > 0:
            return s.compute_ms / 1000.0
    return None


def severity(history: Sequence[ModelSample], model: ModelConfig) -> float:
    """How far over its objectives the newest sample is (1.0: at the SLO; 0 without
    data): its request p99 and, for an LLM, its TTFT and TPOT p99s."""
    if not history:
        return 0.0
    p99 = history[-1].p99_ms
    worst = (p99 or 0.0) / model.slo_p99_ms
    if model.has_token_slo:
        worst = max(worst, token_ratio(history[-1], model) or 0.0)
    return worst
