"""The simulator's token workloads: each LLM model's prompt and output lengths (from the
Azure LLM trace's `ContextTokens` and `GeneratedTokens` columns, or given), its token
profile and its TTFT and TPOT objectives (`TokenModel`), and each tick's share of its
requests within them (`tick_shares`), from the same token capacity model the policy sizes
replicas with (`bridge.policy.tokens`).

The simulator's queue is per replica (`bridge.sim.serving`, `bridge.sim.latency`): a
replica of an LLM has `sequences` slots (`Setup.replica_servers`), each request holds one
for its `TokenModel.service_s`, and the queue's wait and backlog delay come from there.
Here a request's TTFT is that delay + wait + its prefill (slowed by the sequences running
beside it), its TPOT the profile's at the sequences it runs beside (`busy_cdf`); with a
backlog (the replica saturated) every request runs beside a full replica.

Lengths are kept as LENGTH_POINTS quantiles of the trace's: a simulated request's prompt
and output are drawn from those (each equally likely), so the share within an objective
is the mean over them. Called by `bridge.sim.policies` (sizing), `bridge.sim.serving`
(attainment) and `bench/llm_sim.py`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bridge.policy.capacity import Q
from bridge.policy.tokens import (
    LENGTH_POINTS,
    SMOL_LAB,
    TokenDemand,
    TokenProfile,
    busy_cdf,
    mean_service,
    predict,
    replicas_needed,
    service_cv2,
    tpot_within,
    ttft_within,
)

#: a part's prefills (s), ascending
Prefills = Sequence[float] | npt.NDArray[np.float64]

#: the lab LLM's context window (docs/lab.md: `n_ctx` 2048): prompt + output fit in it
SMOL_CONTEXT = 2048


@dataclass(frozen=True)
class TokenModel:
    """One LLM model as the simulator serves it: its profile, its objectives (p99 TTFT
    and TPOT, seconds) and its length distributions (tokens, equally weighted quantiles)."""

    profile: TokenProfile
    slo_ttft_s: float
    slo_tpot_s: float
    prompt_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    #: prefills (s) of the prompt quantiles at one sequence, then at each count
    _prefills: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)
    #: the same, each ascending, as arrays (`mixture_quantile`'s); and all of them in one
    #: ascending array, with each one's sequences - 1 and the count per sequences
    _sorted: tuple[npt.NDArray[np.float64], ...] = field(init=False, repr=False, compare=False)
    _every: tuple[npt.NDArray[np.float64], npt.NDArray[np.int_], float] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for name, value in (("slo_ttft_s", self.slo_ttft_s), ("slo_tpot_s", self.slo_tpot_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.demand(0.0)  # checks the lengths
        p = self.profile
        base = [p.prefill(x) for x in self.prompt_tokens]
        per_n = tuple(tuple(b * p.slowdown(n) for b in base) for n in range(1, p.sequences + 1))
        object.__setattr__(self, "_prefills", per_n)
        ordered = tuple(np.sort(np.asarray(x, dtype=float)) for x in per_n)
        object.__setattr__(self, "_sorted", ordered)
        # every count's prefills in one ascending array, with each one's count - 1
        every = np.concatenate(ordered)
        order = np.argsort(every, kind="stable")
        counts = np.repeat(np.arange(p.sequences), [len(x) for x in ordered])[order]
        object.__setattr__(self, "_every", (every[order], counts, float(len(base))))

    def demand(self, rate: float) -> TokenDemand:
        return TokenDemand(rate, self.prompt_tokens, self.output_tokens)

    def service_s(self) -> float:
        """Mean seconds a request holds a slot, every slot busy (the simulator's service
        time: conservative below saturation, exact at it)."""
        return mean_service(self.profile, self.demand(1.0), float(self.profile.sequences))

    def service_cv2(self) -> float:
        """The service time's squared coefficient of variation, every slot busy."""
        return service_cv2(self.profile, self.demand(1.0), float(self.profile.sequences))

    @property
    def slo_e2e_ms(self) -> float:
        """The end-to-end p99 a request within both objectives stays under: TTFT + the
        p99 output length x TPOT (the request SLO the policy's request model reads)."""
        outs = sorted(self.output_tokens)
        p99 = outs[min(len(outs) - 1, math.ceil(0.99 * len(outs)) - 1)]
        return (self.slo_ttft_s + p99 * self.slo_tpot_s) * 1000.0

    def replicas(self, rate: float, headroom: float = 1.0) -> int:
        """`bridge.policy.tokens.replicas_needed` for this model at `rate` req/s."""
        return replicas_needed(
            self.profile, self.demand(rate), self.slo_ttft_s, self.slo_tpot_s, headroom
        )

    def shares(
        self, a: float, delay_lo_s: float, delay_hi_s: float, wait_p: float, tail: float
    ) -> tuple[float, float]:
        """(TTFT share, TPOT share) of one tick's requests within the objectives on a
        replica with `a` busy slots, a backlog delay from `delay_lo_s` to `delay_hi_s` and
        the stationary queue's (wait_p, tail) (`bridge.sim.latency.advance`)."""
        ttft, tpot, _, _ = self.tick(a, delay_lo_s, delay_hi_s, wait_p, tail, p99s=False)
        return ttft, tpot

    def tick(
        self,
        a: float,
        delay_lo_s: float,
        delay_hi_s: float,
        wait_p: float,
        tail: float,
        p99s: bool = True,
    ) -> tuple[float, float, float, float]:
        """One tick of a replica as `shares` has it: (TTFT share, TPOT share, TTFT p99 s,
        TPOT p99 s), the p99s of the same distributions the shares are read from (what
        the model's TTFT and TPOT histograms would say of the tick: the policy's token
        signal); `p99s` False: the shares alone (the p99s nan)."""
        c = self.profile.sequences
        backlog = max(delay_lo_s, delay_hi_s) > 0.0 or a >= c
        slo = self.slo_ttft_s
        ttft_p99 = tpot_p99 = math.nan
        if backlog:  # every request starts beside a full replica
            prefills = self._prefills[c - 1]
            ttft = ttft_within(prefills, wait_p, tail, slo, delay_lo_s, delay_hi_s)
            if p99s:
                ttft_p99 = _delayed_quantile(
                    self._sorted[c - 1], wait_p, tail, delay_lo_s, delay_hi_s
                )
                tpot_p99 = self.profile.tpot_s[c - 1]
        else:  # the prefill slowed by the sequences each request runs beside
            ttft, below = 0.0, 0.0
            weights = [0.0] * c
            busy = busy_cdf(c, a)
            for n, cum in enumerate(busy, start=1):
                if cum - below > 1e-6:
                    share = ttft_within(self._prefills[n - 1], wait_p, tail, slo)
                    ttft += (cum - below) * share
                    weights[n - 1] = cum - below
                below = cum
            if p99s:
                every, counts, size = self._every
                total = sum(weights)  # (the parts left out weigh under 1e-6 each)
                each = np.asarray(weights) / (total * size)
                ttft_p99 = _quantile_of(every, each[counts], wait_p, tail, Q)
                n99 = next((n for n, cum in enumerate(busy, start=1) if cum >= Q), c)
                tpot_p99 = self.profile.tpot_s[n99 - 1]
        return ttft, tpot_within(self.profile, a, self.slo_tpot_s, backlog), ttft_p99, tpot_p99

    def predicted(self, rate: float, replicas: int) -> tuple[float, float]:
        """Predicted (TTFT p99, TPOT p99) in seconds (`bridge.policy.tokens.predict`)."""
        p = predict(self.profile, self.demand(rate), replicas)
        return p.ttft_p99_s, p.tpot_p99_s


def mixture_quantile(
    mix: Sequence[tuple[float, Prefills]], wait_p: float, tail: float, q: float = Q
) -> float:
    """The `q` quantile (s) of wait + prefill, the wait 0 with chance 1 - wait_p, else
    exponential at rate `tail`, the prefill each of a part's `prefills` with an equal
    share of that part's weight (`mix`: (weight, prefills) per part, the weights summing
    to 1): `bridge.policy.tokens`' TTFT quantile, for a mixture, solved in closed form.
    Between two neighbouring prefills the chance to exceed t is (the weight above) +
    wait_p x e^(-tail t) x (the sum of w e^(tail x) over the prefills below), a sum kept
    in logs (no overflow, no cancellation): the answer is on the interval past the last
    prefill at which the chance still exceeds 1 - q."""
    parts = [(w, np.asarray(xs, dtype=float)) for w, xs in mix if w > 0 and len(xs)]
    if not parts:
        raise ValueError("mixture_quantile needs at least one prefill of positive weight")
    xs = np.concatenate([x for _, x in parts])
    ws = np.concatenate([np.full(len(x), w / len(x)) for w, x in parts])
    order = np.argsort(xs, kind="stable")
    return _quantile_of(xs[order], ws[order], wait_p, tail, q)


def _quantile_of(
    xs: npt.NDArray[np.float64],
    ws: npt.NDArray[np.float64],
    wait_p: float,
    tail: float,
    q: float,
) -> float:
    """`mixture_quantile` of the prefills `xs` (ascending) of weights `ws` (summing to
    1; a weight 0 is a prefill left out)."""
    above = ws.sum() - np.cumsum(ws)  # the weight of the prefills past each
    over = 1.0 - q
    if wait_p <= 0 or not math.isfinite(tail) or tail <= 0:  # no wait: the prefills alone
        return float(xs[int(np.argmax(above <= over + 1e-12))])
    logw = np.log(np.maximum(ws, 1e-300))  # (a prefill of no weight: e^-690, nothing)
    logs = np.logaddexp.accumulate(tail * xs + logw)  # log sum w e^(tail x), <= x
    exceed = above + np.exp(math.log(wait_p) + logs - tail * xs)  # at each prefill
    i = int(np.count_nonzero(exceed > over)) - 1  # (non-increasing: the last past it)
    if i < 0:
        return float(xs[0])
    upper = float(xs[i + 1]) if i + 1 < len(xs) else math.inf
    rest = float(above[i])
    if rest >= over:
        return upper  # every t below it exceeds
    t = (math.log(wait_p) + float(logs[i]) - math.log(over - rest)) / tail
    return min(max(t, float(xs[i])), upper)


def _delayed_quantile(
    prefills: npt.NDArray[np.float64],
    wait_p: float,
    tail: float,
    lo: float,
    hi: float,
    q: float = Q,
) -> float:
    """The `q` quantile (s) of a backlog's delay (uniform on [lo, hi]) + wait + prefill:
    between lo and hi past the quantile without the delay (the delay moves every request
    by lo at least, hi at most), bisected to 1e-4 s on the share within (`ttft_within`'s
    sum, over the prefills at once)."""
    lo, hi = min(lo, hi), max(lo, hi)
    base = mixture_quantile([(1.0, prefills)], wait_p, tail, q)
    if hi - lo < 1e-12:
        return base + lo
    waits = wait_p > 0 and math.isfinite(tail) and tail > 0
    span = hi - lo

    def share(budget: float) -> float:
        x2 = budget - prefills - lo
        x1 = np.maximum(0.0, budget - prefills - hi)
        covered = x2 - x1
        if waits:
            covered -= (wait_p / tail) * (np.exp(-tail * x1) - np.exp(-tail * np.maximum(x2, 0)))
        return float(np.where(x2 < 0, 0.0, np.clip(covered / span, 0.0, 1.0)).mean())

    a, b = base + lo, base + hi
    while b - a > 1e-4 * max(1.0, b):
        mid = (a + b) / 2.0
        if share(mid) >= q:
            b = mid
        else:
            a = mid
    return b


def read_token_lengths(path: Path) -> tuple[list[float], list[float]]:
    """(prompt tokens, output tokens) of each request of an Azure LLM trace
    (`TIMESTAMP,ContextTokens,GeneratedTokens`). ValueError naming the file and line for
    a missing column or a length that is not a whole number >= 0, or no rows."""
    prompts: list[float] = []
    outputs: list[float] = []
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next((r for r in reader if any(c.strip() for c in r)), None)
            names = [c.strip() for c in header or []]
            missing = [c for c in ("ContextTokens", "GeneratedTokens") if c not in names]
            if missing:
                raise ValueError(f"{path}: no column {', '.join(missing)} in header {names}")
            cp, co = names.index("ContextTokens"), names.index("GeneratedTokens")
            for row in reader:
                if not any(c.strip() for c in row):
                    continue
                columns = ((cp, prompts, "ContextTokens"), (co, outputs, "GeneratedTokens"))
                for col, out, name in columns:
                    raw = row[col].strip() if col < len(row) else ""
                    if not raw.isdigit():
                        raise ValueError(
                            f"{path}: line {reader.line_num}: {name} {raw!r} is not a "
                            "whole number >= 0"
                        )
                    out.append(float(raw))
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if not prompts:
        raise ValueError(f"{path}: no request rows")
    return prompts, outputs


def fit_context(
    prompts: Iterable[float], outputs: Iterable[float], context: int | None
) -> tuple[list[float], list[float]]:
    """The lengths clipped to a model's context window: the output to at most half of
    it, the prompt to what is left (a server truncates longer prompts). None: as given."""
    ps, os_ = list(prompts), list(outputs)
    if context is None:
        return ps, os_
    if context < 2:
        raise ValueError(f"context must be at least 2 tokens, got {context}")
    clipped_out = [min(o, context // 2) for o in os_]
    clipped_in = [min(p, context - o) for p, o in zip(ps, clipped_out, strict=True)]
    return clipped_in, clipped_out


def trace_token_models(
    path: Path,
    models: Iterable[str],
    slo_ttft_s: float,
    slo_tpot_s: float,
    profile: TokenProfile = SMOL_LAB,
    context: int | None = SMOL_CONTEXT,
    points: int = LENGTH_POINTS,
) -> dict[str, TokenModel]:
    """Each of `models` an LLM with the trace's length distributions (clipped to
    `context`), `profile` (default: the lab's SmolLM2, `bridge.policy.tokens.SMOL_LAB`)
    and the objectives given."""
    prompts, outputs = fit_context(*read_token_lengths(path), context)
    d = TokenDemand.of(0.0, prompts, outputs, points)
    return {
        m: TokenModel(profile, slo_ttft_s, slo_tpot_s, d.prompt_tokens, d.output_tokens)
        for m in models
    }


def nodes_for_tokens(tokens: Mapping[str, TokenModel], rates: Mapping[str, float]) -> int:
    """Nodes the LLM models need at these rates: each model's `replicas`, summed (as if
    each had nodes of its own: exact for one model, an upper bound for several, which
    share a node's slots); 0 without LLM models."""
    return sum(tm.replicas(rates.get(m, 0.0)) for m, tm in tokens.items())
