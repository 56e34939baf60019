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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

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

    def __post_init__(self) -> None:
        for name, value in (("slo_ttft_s", self.slo_ttft_s), ("slo_tpot_s", self.slo_tpot_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.demand(0.0)  # checks the lengths
        p = self.profile
        base = [p.prefill(x) for x in self.prompt_tokens]
        per_n = tuple(tuple(b * p.slowdown(n) for b in base) for n in range(1, p.sequences + 1))
        object.__setattr__(self, "_prefills", per_n)

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
        c = self.profile.sequences
        backlog = max(delay_lo_s, delay_hi_s) > 0.0 or a >= c
        slo = self.slo_ttft_s
        if backlog:  # every request starts beside a full replica
            ttft = ttft_within(self._prefills[c - 1], wait_p, tail, slo, delay_lo_s, delay_hi_s)
        else:  # the prefill slowed by the sequences each request runs beside
            ttft, below = 0.0, 0.0
            for n, cum in enumerate(busy_cdf(c, a), start=1):
                if cum - below > 1e-6:
                    share = ttft_within(self._prefills[n - 1], wait_p, tail, slo)
                    ttft += (cum - below) * share
                below = cum
        return ttft, tpot_within(self.profile, a, self.slo_tpot_s, backlog)

    def predicted(self, rate: float, replicas: int) -> tuple[float, float]:
        """Predicted (TTFT p99, TPOT p99) in seconds (`bridge.policy.tokens.predict`)."""
        p = predict(self.profile, self.demand(rate), replicas)
        return p.ttft_p99_s, p.tpot_p99_s


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
