"""The token capacity model: what time to first token (TTFT) and time per output token
(TPOT) a model's replicas give to a token stream, and so how many replicas it needs. Pure
math, one implementation for the policy, the simulator (`bridge.sim.tokens`) and the
benches; the queueing pieces are `bridge.policy.capacity`'s (Erlang C, Allen-Cunneen).

A replica runs `sequences` requests at once (its model instances: one slot each). A
request holds a slot for its prefill and then its decode:

    service = slowdown(n) x prefill(prompt) + output x tpot(n)
    prefill(prompt) = overhead + per_prompt_token x prompt x (1 - prefix_hit)
    slowdown(n) = tpot(n) / tpot(1)

where `n` is the sequences decoding at once on the replica (itself included): the slots
share the replica's compute, so both the decode and the prefill slow down as `n` grows (on
the lab's CPU, two instances share two cores). A request waits in Triton's queue while
every slot is busy; the model's own TTFT clock starts when a slot picks it up, so the
client's TTFT is the queue wait plus the prefill.

Per replica, with `rate` requests/s spread evenly over the replicas:

- the mean concurrency `n` is the fixed point of `n = 1 + (sequences - 1) x min(1, a /
  sequences)` with `a = rate x mean service(n)` (busy slots): it climbs from 1 (alone) to
  `sequences` (every slot busy);
- the waiting time is M/G/c with c = sequences (`capacity.queue`): Erlang C for the chance
  to wait, an exponential tail (Allen-Cunneen, cv2 the service time's squared coefficient
  of variation from the length distributions);
- TTFT's p99 is the 0.99 quantile of wait + slowdown x prefill over the prompt lengths,
  solved exactly for that mixture (no sum of quantiles);
- TPOT's p99 is `tpot(n99)`, `n99` the 0.99 quantile of the sequences a request runs
  beside (those busy when it arrives, by PASTA, plus itself; `sequences` if it waited):
  the busy slots of M/M/c, truncated Poisson below `sequences`, Erlang C at it.

Offered load is prompt tokens/s and output tokens/s (`TokenDemand.prompt_tps`,
`output_tps`). At or past saturation (a >= sequences) both p99s are infinite.
`replicas_needed` is the fewest replicas keeping both p99s under their SLOs with headroom.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bridge.policy.capacity import Q, queue, smallest

#: the most replicas `replicas_needed` looks at before it calls the demand unservable
MAX_REPLICAS = 100_000

#: quantile points a `TokenDemand` keeps of each length distribution
LENGTH_POINTS = 101


class InfeasibleSLO(ValueError):
    """No number of replicas meets the SLO: the reason names the SLO and the figures."""


def check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_non_negative(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class TokenProfile:
    """What one replica of a model does with tokens.

    sequences: requests a replica runs at once (its instance count, or a vLLM engine's
        max_num_seqs); the number of slots of its queue.
    prefill_s_per_token: seconds of prefill per prompt token at one sequence.
    prefill_overhead_s: fixed seconds from a slot picking the request up to its first
        token beyond the per-token part (tokenising, the first decode step).
    tpot_s: seconds per output token with 1, 2, ... `sequences` sequences decoding at once
        (`tpot_s[n - 1]` for n sequences; non-decreasing, one entry per sequence).
    prefix_hit: the share of prompt tokens a prefix cache spares the prefill (0 to < 1).
    tpot_spread: how far a request's TPOT at the tail (its 0.99 quantile) lies above the
        table's typical TPOT at the same concurrency (>= 1; 1: no spread): on shared
        compute a decode beside another's prefill runs slower than beside a decode.
        `predict`'s TPOT p99 is the table's TPOT at the tail's concurrency times it;
        the service time (the mean) is not.
    """

    sequences: int
    prefill_s_per_token: float
    prefill_overhead_s: float
    tpot_s: tuple[float, ...]
    prefix_hit: float = 0.0
    tpot_spread: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.sequences, int) or self.sequences < 1:
            raise ValueError(f"sequences must be an integer >= 1, got {self.sequences!r}")
        check_non_negative("prefill_s_per_token", self.prefill_s_per_token)
        check_non_negative("prefill_overhead_s", self.prefill_overhead_s)
        if len(self.tpot_s) != self.sequences:
            raise ValueError(
                f"tpot_s needs one entry per sequence (sequences={self.sequences}), "
                f"got {len(self.tpot_s)}"
            )
        for i, t in enumerate(self.tpot_s):
            check_positive(f"tpot_s[{i}]", t)
        if any(b < a for a, b in zip(self.tpot_s, self.tpot_s[1:], strict=False)):
            raise ValueError(f"tpot_s must be non-decreasing in sequences, got {self.tpot_s}")
        if not (0.0 <= self.prefix_hit < 1.0):
            raise ValueError(f"prefix_hit must be in [0, 1), got {self.prefix_hit!r}")
        check_positive("tpot_spread", self.tpot_spread)
        if self.tpot_spread < 1.0:
            raise ValueError(f"tpot_spread must be >= 1, got {self.tpot_spread!r}")

    def tpot(self, n: float) -> float:
        """Seconds per output token with `n` sequences decoding at once (linear between
        the table's whole counts; clipped to 1..sequences)."""
        n = min(max(n, 1.0), float(self.sequences))
        i = int(n)
        if i >= self.sequences:
            return self.tpot_s[-1]
        lo, hi = self.tpot_s[i - 1], self.tpot_s[i]
        return lo + (hi - lo) * (n - i)

    def slowdown(self, n: float) -> float:
        """How much slower a slot works with `n` sequences at once than alone."""
        return self.tpot(n) / self.tpot_s[0]

    def prefill(self, prompt_tokens: float) -> float:
        """Seconds from pick-up to the first token for a prompt, at one sequence."""
        return self.prefill_overhead_s + self.prefill_s_per_token * prompt_tokens * (
            1.0 - self.prefix_hit
        )


def _quantiles(values: Sequence[float], points: int) -> tuple[float, ...]:
    """`points` evenly spaced quantiles of `values` (both ends included): equally weighted
    representatives of the distribution, its tail kept."""
    s = sorted(values)
    if len(s) <= points:
        return tuple(float(v) for v in s)
    last = len(s) - 1
    out = []
    for k in range(points):
        pos = last * k / (points - 1)
        i = int(pos)
        j = min(i + 1, last)
        out.append(s[i] + (s[j] - s[i]) * (pos - i))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class TokenDemand:
    """What one model asks of its replicas: `rate` requests/s, and its prompt and output
    lengths in tokens as equally weighted samples (or quantiles) of their distributions.
    Build from raw samples with `TokenDemand.of` (it keeps LENGTH_POINTS quantiles), or
    from token rates alone with `TokenDemand.from_rates` (every request the mean)."""

    rate: float
    prompt_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]

    def __post_init__(self) -> None:
        check_non_negative("rate", self.rate)
        for name, values in (
            ("prompt_tokens", self.prompt_tokens),
            ("output_tokens", self.output_tokens),
        ):
            if not values:
                raise ValueError(f"{name} needs at least one length")
            for v in values:
                check_non_negative(name, v)

    @classmethod
    def of(
        cls,
        rate: float,
        prompt_tokens: Iterable[float],
        output_tokens: Iterable[float],
        points: int = LENGTH_POINTS,
    ) -> TokenDemand:
        """A demand from raw length samples, kept as `points` quantiles each."""
        return cls(
            rate,
            _quantiles(list(prompt_tokens), points),
            _quantiles(list(output_tokens), points),
        )

    @classmethod
    def from_rates(cls, rate: float, prompt_tps: float, output_tps: float) -> TokenDemand:
        """A demand from a request rate and its token rates (what a model's counters
        give: every request the mean lengths; no spread, so cv2 = 0)."""
        check_non_negative("prompt_tps", prompt_tps)
        check_non_negative("output_tps", output_tps)
        if rate <= 0:
            return cls(0.0, (0.0,), (1.0,))
        return cls(rate, (prompt_tps / rate,), (output_tps / rate,))

    def scaled(self, factor: float) -> TokenDemand:
        """The same lengths at `factor` times the rate (a headroom, a forecast)."""
        check_non_negative("factor", factor)
        return TokenDemand(self.rate * factor, self.prompt_tokens, self.output_tokens)

    @property
    def mean_prompt(self) -> float:
        return sum(self.prompt_tokens) / len(self.prompt_tokens)

    @property
    def mean_output(self) -> float:
        return sum(self.output_tokens) / len(self.output_tokens)

    @property
    def prompt_tps(self) -> float:
        """Offered prompt tokens/s."""
        return self.rate * self.mean_prompt

    @property
    def output_tps(self) -> float:
        """Offered output tokens/s."""
        return self.rate * self.mean_output


@dataclass(frozen=True, slots=True)
class TokenPrediction:
    """The predicted p99s (s) of one model's requests on its replicas, the busy share of
    their slots (`utilisation`, a / sequences), the mean sequences running at once, and
    whether the queue is stable (if not, both p99s are inf)."""

    ttft_p99_s: float
    tpot_p99_s: float
    utilisation: float
    concurrency: float
    stable: bool

    def within(self, slo_ttft_s: float, slo_tpot_s: float) -> bool:
        """Both p99s within their SLOs."""
        return self.ttft_p99_s <= slo_ttft_s and self.tpot_p99_s <= slo_tpot_s


def mean_service(profile: TokenProfile, demand: TokenDemand, n: float) -> float:
    """Mean seconds a request holds a slot with `n` sequences at once."""
    return profile.slowdown(n) * profile.prefill(demand.mean_prompt) + (
        demand.mean_output * profile.tpot(n)
    )


def service_cv2(profile: TokenProfile, demand: TokenDemand, n: float) -> float:
    """Squared coefficient of variation of the service time, prompt and output lengths
    taken as independent."""
    slow, tpot = profile.slowdown(n), profile.tpot(n)
    pre = [slow * profile.prefill(p) for p in demand.prompt_tokens]
    dec = [o * tpot for o in demand.output_tokens]
    mean = sum(pre) / len(pre) + sum(dec) / len(dec)
    if mean <= 0:
        return 0.0
    var = _variance(pre) + _variance(dec)
    return var / (mean * mean)


def _variance(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def concurrency(profile: TokenProfile, rate: float, demand: TokenDemand) -> tuple[float, float]:
    """(mean sequences at once, busy slots `a`) on one replica taking `rate` requests/s:
    the fixed point of `n = 1 + (c - 1) min(1, rate x service(n) / c)`, climbing from 1
    (the service time grows with n, so the iteration is monotone)."""
    c = profile.sequences
    n = 1.0
    a = rate * mean_service(profile, demand, n)
    for _ in range(60):
        nxt = 1.0 + (c - 1) * min(1.0, a / c)
        a = rate * mean_service(profile, demand, nxt)
        if abs(nxt - n) < 1e-9:
            n = nxt
            break
        n = nxt
    return n, a


def busy_cdf(sequences: int, a: float) -> list[float]:
    """P(a request runs beside at most n sequences, itself included) for n = 1 ..
    `sequences`: the slots busy when it arrives plus one (M/M/c's busy count, by PASTA:
    truncated Poisson below `sequences`, Erlang C's chance at it, where it waits and
    then starts beside `sequences` - 1 others). The last entry is 1."""
    if a <= 0:
        return [1.0] * sequences
    if a >= sequences:
        return [0.0] * (sequences - 1) + [1.0]
    waits = queue(sequences, a, 1.0)
    assert waits is not None
    terms = [1.0]
    for k in range(1, sequences):
        terms.append(terms[-1] * a / k)
    total = sum(terms)
    out: list[float] = []
    cum = 0.0
    for k in range(sequences - 1):  # k busy seen: the request runs with k + 1
        cum += (1.0 - waits.wait_p) * terms[k] / total
        out.append(min(1.0, cum))
    out.append(1.0)
    return out


def busy_quantile(sequences: int, a: float, q: float = Q) -> int:
    """The `q` quantile of the sequences a request runs beside (`busy_cdf`)."""
    for n, p in enumerate(busy_cdf(sequences, a), start=1):
        if p >= q:
            return n
    return sequences


def tpot_within(profile: TokenProfile, a: float, slo_tpot_s: float, backlog: bool = False) -> float:
    """Share of requests whose TPOT is within `slo_tpot_s` on a replica with `a` busy
    slots: those running beside few enough sequences (`busy_cdf`); with a `backlog`
    (saturated) every request runs beside a full replica."""
    fits = 0
    for n in range(1, profile.sequences + 1):
        if profile.tpot_s[n - 1] <= slo_tpot_s:
            fits = n
    if fits == 0:
        return 0.0
    if fits >= profile.sequences:
        return 1.0
    if backlog or a >= profile.sequences:
        return 0.0
    return busy_cdf(profile.sequences, a)[fits - 1]


def ttft_within(
    prefills: Sequence[float],
    wait_p: float,
    tail: float,
    budget_s: float,
    delay_lo_s: float = 0.0,
    delay_hi_s: float = 0.0,
) -> float:
    """Share of requests whose TTFT (a delay uniform on [delay_lo_s, delay_hi_s], a
    backlog's, + the queue's wait: 0 with chance 1 - wait_p, else exponential at `tail`
    + a prefill, each of `prefills` alike) is within `budget_s`."""
    lo, hi = min(delay_lo_s, delay_hi_s), max(delay_lo_s, delay_hi_s)
    waits = wait_p > 0 and math.isfinite(tail) and tail > 0
    total = 0.0
    for p in prefills:
        x2 = budget_s - p - lo  # room for the wait at the smallest delay
        if x2 < 0:
            continue
        if hi - lo < 1e-12:
            total += 1.0 - (wait_p * math.exp(-tail * x2) if waits else 0.0)
            continue
        x1 = max(0.0, budget_s - p - hi)
        covered = x2 - x1
        if waits:
            covered -= (wait_p / tail) * (math.exp(-tail * x1) - math.exp(-tail * x2))
        total += max(0.0, min(1.0, covered / (hi - lo)))
    return total / len(prefills)


def _ttft_quantile(prefills: Sequence[float], wait_p: float, tail: float, q: float = Q) -> float:
    """The `q` quantile of wait + prefill: the wait 0 with chance 1 - wait_p, else
    exponential with rate `tail`; the prefill each of `prefills` with equal weight."""
    hi_pre = max(prefills)
    if wait_p <= 0 or not math.isfinite(tail) or tail <= 0:
        return sample_quantile(prefills, q)

    def exceed(t: float) -> float:
        total = 0.0
        for p in prefills:
            total += 1.0 if t < p else wait_p * math.exp(-tail * (t - p))
        return total / len(prefills)

    lo = sample_quantile(prefills, q)
    if exceed(lo) <= 1.0 - q:
        return lo
    # past the longest prefill, a wait over log(wait_p / (1 - q)) / tail is rarer than
    # 1 - q (none needed when wait_p < 1 - q: the longest prefill alone bounds it)
    hi = hi_pre + max(0.0, math.log(wait_p / (1.0 - q))) / tail + 1e-9
    for _ in range(60):
        mid = (lo + hi) / 2
        if exceed(mid) > 1.0 - q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-6 * hi:
            break
    return hi


def sample_quantile(values: Sequence[float], q: float) -> float:
    """The smallest value with at least a share `q` of `values` at or below it."""
    s = sorted(values)
    k = max(0, math.ceil(q * len(s)) - 1)
    return s[min(k, len(s) - 1)]


def predict(profile: TokenProfile, demand: TokenDemand, replicas: int) -> TokenPrediction:
    """The predicted TTFT and TPOT p99s of `demand` spread evenly over `replicas`."""
    if not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")
    c = profile.sequences
    if demand.rate <= 0:
        ttft = ttft_floor_s(profile, demand.prompt_tokens)
        return TokenPrediction(ttft, profile.tpot_s[0], 0.0, 1.0, True)
    if replicas == 0:
        return TokenPrediction(math.inf, math.inf, math.inf, float(c), False)
    rate = demand.rate / replicas
    n, a = concurrency(profile, rate, demand)
    if a >= c:
        return TokenPrediction(math.inf, math.inf, a / c, float(c), False)
    cv2 = service_cv2(profile, demand, n)
    qu = queue(c, a, rate, cv2)
    assert qu is not None  # a < c
    n99 = busy_quantile(c, a)
    slow = profile.slowdown(n99)
    prefills = [slow * profile.prefill(p) for p in demand.prompt_tokens]
    ttft = _ttft_quantile(prefills, qu.wait_p, qu.tail)
    return TokenPrediction(ttft, profile.tpot(n99) * profile.tpot_spread, a / c, n, True)


def ttft_floor_s(profile: TokenProfile, prompt_tokens: Sequence[float]) -> float:
    """The TTFT p99 at no load: the 0.99 quantile of the prefills of these prompt lengths
    at one sequence, no queue wait. No count of replicas gives less."""
    return sample_quantile([profile.prefill(p) for p in prompt_tokens], Q)


def infeasible(
    profile: TokenProfile, demand: TokenDemand, slo_ttft_s: float, slo_tpot_s: float
) -> str | None:
    """Why no number of replicas meets the SLOs (None: enough replicas do): a TPOT at one
    sequence over the TPOT SLO, or a p99 prefill alone (no wait, one sequence) over the
    TTFT SLO."""
    check_positive("slo_ttft_s", slo_ttft_s)
    check_positive("slo_tpot_s", slo_tpot_s)
    if profile.tpot_s[0] > slo_tpot_s:
        return (
            f"TPOT SLO {slo_tpot_s * 1000:.1f} ms is below the model's "
            f"{profile.tpot_s[0] * 1000:.1f} ms per token at one sequence"
        )
    pre = ttft_floor_s(profile, demand.prompt_tokens)
    if pre > slo_ttft_s:
        return (
            f"TTFT SLO {slo_ttft_s * 1000:.0f} ms is below the p99 prefill alone "
            f"({pre * 1000:.0f} ms at one sequence, no wait)"
        )
    return None


def replicas_needed(
    profile: TokenProfile,
    demand: TokenDemand,
    slo_ttft_s: float,
    slo_tpot_s: float,
    headroom: float = 1.0,
) -> int:
    """The fewest replicas keeping both predicted p99s within their SLOs for `demand` at
    `headroom` times its rate (0 for no requests). Raises InfeasibleSLO when no count
    does (see `infeasible`), or when more than MAX_REPLICAS would be needed."""
    check_positive("headroom", headroom)
    reason = infeasible(profile, demand, slo_ttft_s, slo_tpot_s)
    if reason is not None:
        raise InfeasibleSLO(reason)
    if demand.rate <= 0:
        return 0
    d = demand.scaled(headroom)

    def ok(r: int) -> bool:
        return predict(profile, d, r).within(slo_ttft_s, slo_tpot_s)

    # below this many replicas every slot would be busy even at the lightest service
    floor = max(1, math.ceil(d.rate * mean_service(profile, d, 1.0) / profile.sequences))
    if ok(floor):
        return floor
    hi = floor * 2
    while not ok(hi):
        if hi > MAX_REPLICAS:
            raise InfeasibleSLO(
                f"more than {MAX_REPLICAS} replicas would be needed for {d.rate:.1f} req/s"
            )
        hi *= 2
    return smallest(floor, hi, ok)


#: SmolLM2-135M-Instruct (Q4_1, llama-cpp-python, one thread per instance) on the lab's
#: two cores, two instances, measured on an idle development machine: the first token
#: after about 130 ms for a short prompt and 2.2 s for about 500 tokens (about 4.2 ms per
#: prompt token beyond 0.11 s), 16 ms per token alone and about 22 ms with both instances
#: decoding (docs/lab.md: a token every 15 to 22 ms, the two cores shared). A site's own
#: figures come from `stb models profile`.
SMOL_LAB = TokenProfile(
    sequences=2,
    prefill_s_per_token=0.0042,
    prefill_overhead_s=0.11,
    tpot_s=(0.016, 0.022),
)
