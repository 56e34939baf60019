"""How a replica's token profile (`bridge.policy.tokens.TokenProfile`) is measured: fitted
from measured streams (`fit_profile`: `stb models profile`, `bridge.models.profile_run`,
and the benches) and corrected by the replica's own counters while it serves
(`calibrate`: the daemon's `bridge.policy.llm.calibrated`). Pure; the capacity model
that reads the profile is `bridge.policy.tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from bridge.policy.capacity import Q
from bridge.policy.tokens import (
    TokenDemand,
    TokenProfile,
    check_non_negative,
    check_positive,
    concurrency,
    sample_quantile,
)


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """One measured request (or an aggregate of like requests): the sequences running at
    once while it ran, its prompt tokens, its TTFT without queue wait (the model's own
    clock) and its mean TPOT, in seconds."""

    concurrency: int
    prompt_tokens: float
    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {self.concurrency!r}")
        check_non_negative("prompt_tokens", self.prompt_tokens)
        check_positive("ttft_s", self.ttft_s)
        check_positive("tpot_s", self.tpot_s)


def fit_profile(points: Iterable[ProfilePoint], sequences: int | None = None) -> TokenProfile:
    """A profile from measured points: TPOT per concurrency the median of its points
    (a concurrency without points linear between its neighbours, the last one held; made
    non-decreasing); the prefill a least-squares line of TTFT over prompt tokens, each
    TTFT first divided by its concurrency's slowdown. `sequences` defaults to the
    largest concurrency measured. The TTFTs must exclude queue wait (the model's clock,
    or a client's at no more requests than slots)."""
    pts = list(points)
    if not pts:
        raise ValueError("fit_profile needs at least one measured point")
    seqs = sequences if sequences is not None else max(p.concurrency for p in pts)
    if not isinstance(seqs, int) or seqs < 1:
        raise ValueError(f"sequences must be an integer >= 1, got {seqs!r}")
    by_n: dict[int, list[float]] = {}
    for p in pts:
        if p.concurrency <= seqs:
            by_n.setdefault(p.concurrency, []).append(p.tpot_s)
    if 1 not in by_n and not by_n:
        raise ValueError(f"no point has a concurrency within sequences={seqs}")
    known = {n: _median(v) for n, v in by_n.items()}
    table: list[float] = []
    ns = sorted(known)
    for n in range(1, seqs + 1):
        if n in known:
            table.append(known[n])
            continue
        below = [k for k in ns if k < n]
        above = [k for k in ns if k > n]
        if below and above:
            lo, hi = below[-1], above[0]
            table.append(known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo))
        else:
            table.append(known[below[-1]] if below else known[above[0]])
    for i in range(1, len(table)):
        table[i] = max(table[i], table[i - 1])
    base = table[0]
    xs = [p.prompt_tokens for p in pts]
    ys = [p.ttft_s / (table[min(p.concurrency, seqs) - 1] / base) for p in pts]
    per_token, overhead = _line(xs, ys)
    # the tail of each point's TPOT over its concurrency's typical one
    ratios = [p.tpot_s / table[min(p.concurrency, seqs) - 1] for p in pts]
    spread = max(1.0, sample_quantile(ratios, Q))
    return TokenProfile(seqs, max(0.0, per_token), max(0.0, overhead), tuple(table), 0.0, spread)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line with both >= 0: slope 0 when every x
    is the same or the line falls; a line that would cross below the origin is fitted
    through it instead (least squares with the intercept held at 0), not cut at 0 with
    its slope kept, which would put every prediction above the points by the cut."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return 0.0, my
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if slope < 0:
        return 0.0, my
    intercept = my - slope * mx
    if intercept < 0:
        through = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
        return max(0.0, through), 0.0
    return slope, intercept


#: the furthest `calibrate` moves a profile's prefill or decode times from their profile
#: (a factor, either way): a counter off by more than this is a broken reading, not drift
CALIBRATE_LIMIT = 3.0


def calibrate(
    profile: TokenProfile,
    demand: TokenDemand,
    mean_ttft_s: float | None,
    mean_tpot_s: float | None,
) -> TokenProfile:
    """`profile` corrected by what one replica measured while it served `demand` (its
    `rate` the replica's own): the mean of its own TTFT clock (`mean_ttft_s`, from a
    slot's pick-up: the prefill, no queue wait) and of its token gaps (`mean_tpot_s`),
    the backend's histograms' sum / count over a window.

    The profile is taken on a quiet replica in a short run; on shared compute its
    per-token times drift (10-25% on the lab's two cores, run to run) and near
    saturation the queue's tail follows the service time steeply, so the capacity
    model sizes on the replica's own counters where it has them. The prefill (overhead
    and per token) is scaled by measured / predicted mean prefill at the load's mean
    concurrency (`concurrency`), the TPOT table by measured / predicted TPOT there; the
    concurrency moves with the times, so the two are solved together (fixed-point steps
    to a standstill). Slowdown with concurrency keeps the profile's shape. A figure that is None
    or not positive leaves its part as profiled; each factor is kept within
    1/CALIBRATE_LIMIT .. CALIBRATE_LIMIT."""
    if demand.rate <= 0:
        return profile
    use_pre = mean_ttft_s is not None and math.isfinite(mean_ttft_s) and mean_ttft_s > 0
    use_dec = mean_tpot_s is not None and math.isfinite(mean_tpot_s) and mean_tpot_s > 0
    if not (use_pre or use_dec):
        return profile
    base_pre = sum(profile.prefill(p) for p in demand.prompt_tokens) / len(demand.prompt_tokens)
    k_pre = k_dec = 1.0
    out = profile
    for _ in range(50):
        n, a = concurrency(out, demand.rate, demand)
        if a >= out.sequences:  # saturated as corrected: every slot always busy
            n = float(out.sequences)
        if use_dec:
            assert mean_tpot_s is not None
            k_dec = _clamp(mean_tpot_s / profile.tpot(n))
        if use_pre:
            assert mean_ttft_s is not None
            k_pre = _clamp(mean_ttft_s / (profile.slowdown(n) * base_pre))
        nxt = replace(
            profile,
            prefill_s_per_token=profile.prefill_s_per_token * k_pre,
            prefill_overhead_s=profile.prefill_overhead_s * k_pre,
            tpot_s=tuple(t * k_dec for t in profile.tpot_s),
        )
        moved = abs(nxt.tpot_s[0] - out.tpot_s[0]) / out.tpot_s[0] + abs(
            nxt.prefill(1.0) - out.prefill(1.0)
        ) / max(out.prefill(1.0), 1e-12)
        out = nxt
        if moved < 1e-12:
            break
    return out


def _clamp(k: float) -> float:
    return min(CALIBRATE_LIMIT, max(1.0 / CALIBRATE_LIMIT, k))


__all__ = ["CALIBRATE_LIMIT", "ProfilePoint", "calibrate", "fit_profile"]
