"""The policy's token rules: how many replicas an LLM needs by the token capacity model,
for `bridge.policy.decide` to lend for it and to return its lent replicas. Pure.

An LLM here is a model with a token objective (`ModelConfig.has_token_slo`: a TTFT or
TPOT p99) and a measured profile of its replica (`Snapshot.token_profiles`, from the
model version's `stb_profile.json`: `bridge.models.profile`). Its demand on a tick is
its request rate with the length distributions its backend's histograms hold
(`ModelSample.prompt_lengths`, `output_lengths`; where it has none, the token rates it
counted: every request the mean lengths, `TokenDemand.from_rates`), raised to the rate the caller
wants covered (`decide`'s lend demand: capacity_headroom x the larger of now and the
forecast; its return demand: return_headroom x the larger of the dwell's highest and the
forecast). Its need is `bridge.policy.tokens.replicas_needed` of that demand under its
SLOs (an SLO it does not have does not bind), within its `max_replicas`.

No need is known (the model is left to its measured TTFT and TPOT, which lend through
the backstop: `bridge.policy.hysteresis`) for a model without a profile, without a
request and token rates in its newest sample (nothing says how long its requests are),
or whose SLOs no count of replicas meets (`InfeasibleSLO`: more replicas cannot help).

The profile is corrected on every tick by what the model's replicas measure of
themselves (`calibrated`: the backend's TTFT clock and token gaps over the history, at
the rate each replica took): on shared compute the per-token times drift from the
profile's, and near saturation the predicted queue follows them steeply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from bridge.config import ModelConfig
from bridge.policy import capacity
from bridge.policy.snapshot import ModelSample, Snapshot
from bridge.policy.tokenfit import calibrate
from bridge.policy.tokens import (
    InfeasibleSLO,
    TokenDemand,
    TokenProfile,
    replicas_needed,
    ttft_floor_s,
)

#: an SLO the model does not have, in seconds: it never binds
UNBOUNDED_S = 1e9


def slos_s(model: ModelConfig) -> tuple[float, float]:
    """The model's TTFT and TPOT p99 objectives in seconds (`UNBOUNDED_S` where unset)."""
    ttft, tpot = model.slo_ttft_p99_ms, model.slo_tpot_p99_ms
    return (
        UNBOUNDED_S if ttft is None else ttft / 1000.0,
        UNBOUNDED_S if tpot is None else tpot / 1000.0,
    )


def token_demand(sample: ModelSample, rate: float) -> TokenDemand | None:
    """The sample's token demand at `rate` requests/s (its own lengths: the length
    distributions where the sample has them, else the means of its token rates); None
    when the sample has no request or token rates."""
    now, prompt, output = sample.request_rate, sample.prompt_tps, sample.output_tps
    if now is None or prompt is None or output is None or not now > 0 or not output > 0:
        return None
    rate = max(rate, 0.0)
    prompts, outputs = sample.prompt_lengths, sample.output_lengths
    if prompts or outputs:
        return TokenDemand(rate, prompts or (prompt / now,), outputs or (output / now,))
    return TokenDemand.from_rates(now, prompt, output).scaled(rate / now)


def floors_ms(profile: TokenProfile, sample: ModelSample) -> tuple[float | None, float]:
    """The TTFT and TPOT p99s (ms) the model has at no load: one sequence, no queue (the
    prefill of its longest prompts by the sample's lengths, `tokens.ttft_floor_s`: None
    when the sample has no request or token rates; the profile's TPOT at one sequence).
    No count of replicas gives less: the part of a measured p99 above its floor is what
    load adds (`bridge.policy.hysteresis.calm_ratio`)."""
    demand = token_demand(sample, 0.0)
    ttft = None if demand is None else _floor_s(profile, demand.prompt_tokens) * 1000.0
    return ttft, profile.tpot_s[0] * 1000.0


@lru_cache(maxsize=256)
def _floor_s(profile: TokenProfile, prompts: tuple[float, ...]) -> float:
    return ttft_floor_s(profile, prompts)


def need(model: ModelConfig, profile: TokenProfile, sample: ModelSample, rate: float) -> int | None:
    """Replicas the model needs at `rate` requests/s (None: not known, see the module)."""
    demand = token_demand(sample, rate)
    if demand is None:
        return None
    try:
        return min(replicas_needed(profile, demand, *slos_s(model)), model.max_replicas)
    except InfeasibleSLO:
        return None


#: the fewest requests the backend must have timed over the history before
#: `calibrated` corrects a profile by its means (fewer: the profile as measured)
CALIBRATE_MIN_REQUESTS = 20


def calibrated(
    profile: TokenProfile, history: Sequence[ModelSample], replicas: int
) -> TokenProfile:
    """`profile` corrected by the replicas' own TTFT clock and token gaps over the samples
    of `history` that have them (`tokenfit.calibrate`): their means pooled by the
    requests each timed, at the pooled request rate spread over `replicas` and the newest
    sample's lengths. The profile as measured with no replica, no means, or fewer than
    CALIBRATE_MIN_REQUESTS timed requests."""
    timed = [s for s in history if s.timed and s.request_rate is not None]
    count = sum(s.timed or 0.0 for s in timed)
    if replicas <= 0 or count < CALIBRATE_MIN_REQUESTS:
        return profile

    def pooled(values: Sequence[tuple[float | None, float]]) -> float | None:
        vs = [(v, w) for v, w in values if v is not None]
        weight = sum(w for _, w in vs)
        return sum(v * w for v, w in vs) / weight if weight > 0 else None

    rate = pooled([(s.request_rate, s.timed or 0.0) for s in timed]) or 0.0
    demand = token_demand(history[-1], rate / replicas)
    ttft = pooled([(s.ttft_mean_ms, s.timed or 0.0) for s in timed])
    tpot = pooled([(s.tpot_mean_ms, s.timed or 0.0) for s in timed])
    if demand is None:
        return profile
    return calibrate(
        profile,
        demand,
        None if ttft is None else ttft / 1000.0,
        None if tpot is None else tpot / 1000.0,
    )


def needs(snapshot: Snapshot, rates: Mapping[str, float]) -> dict[str, int]:
    """Per LLM with a profile, a rate in `rates` and a known need: its replicas needed,
    by its profile corrected by its replicas' own counters (`calibrated`)."""
    out: dict[str, int] = {}
    serving: dict[str, int] = {}
    for replica in snapshot.replicas:
        for m in replica.models:
            serving[m] = serving.get(m, 0) + 1
    for name, profile in snapshot.token_profiles.items():
        model = snapshot.models.get(name)
        history = snapshot.history.get(name)
        if model is None or not model.has_token_slo or not history or name not in rates:
            continue
        profile = calibrated(profile, history, serving.get(name, 0))
        n = need(model, profile, history[-1], rates[name])
        if n is not None:
            out[name] = n
    return out


def deficits(groups: Iterable[capacity.Group], need_of: Mapping[str, int]) -> dict[str, int]:
    """Per LLM, the replicas it needs beyond those the groups hold (ready and in flight)."""
    have = capacity.replicas_of(groups)
    return {m: n - have.get(m, 0) for m, n in need_of.items() if n > have.get(m, 0)}


def carried(groups: Iterable[capacity.Group], need_of: Mapping[str, int]) -> bool:
    """Whether the groups hold at least the replicas each LLM needs."""
    return not deficits(groups, need_of)
