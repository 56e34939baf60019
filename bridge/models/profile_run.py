"""The measuring run of `stb models profile MODEL`: a short, bounded set of token streams
to one model on a Triton server (or the bridge's nginx), at 1 .. `sequences` streams at
once and three prompt lengths, fitted into the `TokenProfile` the token capacity model
sizes the model's replicas by (`bridge.policy.tokenfit.fit_profile`), with what one replica
then carries at the model's token SLOs (`predict`).

The plan (`make_plan`, pure): for each concurrency n = 1 .. sequences, closed batches of n
streams started STAGGER_S apart (so one stream's prefill runs beside another's decode, as
under load; bench/llm_capacity.py's profile does the same), until the level has its share
of `requests`; the prompt lengths cycle through the three so every level sees each. Never
more streams than the replica's slots: no request waits in Triton's queue, so the
client's TTFT from its send is the model's own (prefill, no wait), which `fit_profile`
wants. Each batch's streams become `ProfilePoint`s (`points_of`, pure) at the batch's
concurrency. A warm-up batch (one short stream per slot, not counted) comes first: a
model's first request after its load pays for its caches.

The sending is `bridge.load.streams.run_streams` (loopback endpoints only, every stream
bounded in time). A stream that fails fails the run: nothing is written from a partial
measurement.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from bridge.load.arrivals import Schedule
from bridge.load.lengths import prompt_text
from bridge.load.runner import Endpoint, LoadConfigError, parse_endpoint
from bridge.load.streams import StreamConfig, StreamRecord, run_streams
from bridge.policy.tokenfit import ProfilePoint, fit_profile
from bridge.policy.tokens import (
    TokenDemand,
    TokenProfile,
    infeasible,
    mean_service,
    predict,
)

#: prompt lengths (tokens, as the server counts them) of a default run
PROMPT_TOKENS = (40, 120, 240)
#: output tokens asked of every measured stream
OUTPUT_TOKENS = 32
#: streams in a default run (all concurrencies together)
REQUESTS = 24
#: the most streams one run sends (warm-up not counted)
MAX_REQUESTS = 200
#: seconds between the starts of a batch's streams
STAGGER_S = 0.25
#: a stream not finished this many seconds after its send fails the run
STREAM_TIMEOUT_S = 60.0
#: the warm-up streams' output tokens
WARMUP_TOKENS = 2


class ProfileRunError(ValueError):
    """The run cannot be made or measured; the message says what and where."""


@dataclass(frozen=True)
class Batch:
    """Streams started together (STAGGER_S apart): `concurrency` of them, each its
    (prompt tokens, output tokens)."""

    concurrency: int
    lengths: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Plan:
    """A run's batches, level by level (concurrency 1 first)."""

    sequences: int
    prompt_tokens: tuple[int, ...]
    output_tokens: int
    batches: tuple[Batch, ...]

    @property
    def streams(self) -> int:
        return sum(len(b.lengths) for b in self.batches)


def make_plan(
    sequences: int,
    requests: int = REQUESTS,
    prompt_tokens: Sequence[int] = PROMPT_TOKENS,
    output_tokens: int = OUTPUT_TOKENS,
) -> Plan:
    """The batches of a run: per concurrency n = 1 .. `sequences`, ceil(share / n) batches
    of n streams, `share` = ceil(requests / sequences) (each level at least one stream per
    prompt length); prompt lengths cycling through `prompt_tokens` across a level's
    streams. `requests` is the least number of streams sent (a level rounds up to whole
    batches)."""
    if not isinstance(sequences, int) or sequences < 1:
        raise ProfileRunError(f"sequences must be a whole number >= 1, got {sequences!r}")
    prompts = tuple(prompt_tokens)
    if len(prompts) < 2 or any(p < 1 for p in prompts) or len(set(prompts)) < 2:
        raise ProfileRunError(
            f"prompt lengths must be at least two different token counts >= 1, got {prompts}"
        )
    if output_tokens < 2:
        raise ProfileRunError(f"output tokens must be >= 2 (a TPOT needs two), got {output_tokens}")
    least = sequences * len(prompts)
    if not least <= requests <= MAX_REQUESTS:
        raise ProfileRunError(
            f"--requests must be in {least}..{MAX_REQUESTS} (each of the {sequences} "
            f"concurrencies sees each of the {len(prompts)} prompt lengths), got {requests}"
        )
    share = math.ceil(requests / sequences)
    batches: list[Batch] = []
    for n in range(1, sequences + 1):
        k = 0
        for _ in range(math.ceil(share / n)):
            lengths = []
            for _ in range(n):
                lengths.append((prompts[k % len(prompts)], output_tokens))
                k += 1
            batches.append(Batch(n, tuple(lengths)))
    return Plan(sequences, prompts, output_tokens, tuple(batches))


def points_of(records: Sequence[StreamRecord], concurrency: int) -> list[ProfilePoint]:
    """One batch's measured points: each ok stream with two tokens or more, its TTFT from
    its send (no queue wait at no more streams than slots) and its mean TPOT. Raises
    ProfileRunError naming the first stream that did not end well."""
    out: list[ProfilePoint] = []
    for r in records:
        if not r.ok:
            raise ProfileRunError(
                f"stream {r.index} to {r.endpoint} {r.outcome}: {r.error or 'no reason'}"
                + (f" (HTTP {r.status})" if r.status not in (None, 200) else "")
            )
        ttft, tpot = r.service_ttft_s, r.tpot_s
        if ttft is None or tpot is None or ttft <= 0 or tpot <= 0:
            continue  # the model ended its answer after one token: no TPOT
        out.append(ProfilePoint(concurrency, float(r.prompt_tokens), ttft, tpot))
    return out


@dataclass(frozen=True)
class Capacity:
    """What one replica carries at the SLOs for a demand's lengths: requests/s and output
    tokens/s (0 with `reason` when no rate meets them)."""

    rate: float
    output_tps: float
    reason: str | None = None


def capacity(
    profile: TokenProfile,
    prompt_tokens: Sequence[float],
    output_tokens: Sequence[float],
    slo_ttft_s: float | None,
    slo_tpot_s: float | None,
) -> Capacity:
    """The highest request rate at which one replica's predicted TTFT and TPOT p99s
    (`predict`) stay within the SLOs (an SLO left out: no bound), for requests of these
    lengths; found by bisection below the rate that keeps every slot busy."""
    ttft = slo_ttft_s if slo_ttft_s is not None else math.inf
    tpot = slo_tpot_s if slo_tpot_s is not None else math.inf
    shape = TokenDemand.of(1.0, prompt_tokens, output_tokens)
    reason = infeasible(
        profile, shape, ttft if math.isfinite(ttft) else 1e9, tpot if math.isfinite(tpot) else 1e9
    )
    if reason is not None:
        return Capacity(0.0, 0.0, reason)

    def ok(rate: float) -> bool:
        return predict(profile, shape.scaled(rate), 1).within(ttft, tpot)

    hi = profile.sequences / mean_service(profile, shape, float(profile.sequences))
    lo = 0.0
    if not ok(hi * 1e-6):
        return Capacity(0.0, 0.0, "the SLOs are missed even at the lightest load")
    for _ in range(50):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-4 * hi:
            break
    return Capacity(lo, lo * shape.mean_output)


def describe(profile: TokenProfile) -> str:
    """A profile in one line, in ms."""
    return (
        f"prefill {profile.prefill_overhead_s * 1000:.0f} ms + "
        f"{profile.prefill_s_per_token * 1000:.2f} ms/prompt token; TPOT "
        + ", ".join(f"{t * 1000:.1f} ms at {i + 1}" for i, t in enumerate(profile.tpot_s))
    )


def endpoint(url: str) -> Endpoint:
    """The URL as a loopback endpoint (ProfileRunError otherwise)."""
    try:
        return parse_endpoint(url)
    except LoadConfigError as exc:
        raise ProfileRunError(str(exc)) from exc


def probe(ep: Endpoint, model: str, version: str, timeout_s: float = 60.0) -> int:
    """Check that `ep` serves `model` at `version` and answers a one-token request; the
    tokens the server adds around a prompt's text (its chat template: one word's prompt
    as counted, less one; 0 when the server does not count). ProfileRunError naming the
    URL when it does not answer or does not serve it."""
    base = ep.base_url
    m = quote(model, safe="")
    try:
        with httpx.Client(timeout=timeout_s) as client:
            ready = client.get(f"{base}/v2/models/{m}/versions/{quote(version)}/ready")
            if ready.status_code != 200:
                raise ProfileRunError(
                    f"{base} does not serve {model} version {version} "
                    f"(ready: HTTP {ready.status_code})"
                )
            body = {
                "text_input": prompt_text(1),
                "parameters": {"max_tokens": 1, "return_num_input_tokens": True},
            }
            r = client.post(f"{base}/v2/models/{m}/generate", json=body)
    except httpx.HTTPError as exc:
        raise ProfileRunError(f"no answer from {base}: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise ProfileRunError(
            f"{base}: {model} did not answer a one-token request (HTTP {r.status_code}: "
            f"{r.text[:200]})"
        )
    try:
        counted = r.json().get("num_input_tokens")
    except ValueError:
        counted = None
    if isinstance(counted, list):
        counted = counted[0] if counted else None
    return max(0, int(counted) - 1) if isinstance(counted, (int, float)) else 0


def _play(ep: Endpoint, model: str, batch: Batch, overhead: int, seed: int) -> list[StreamRecord]:
    offsets = tuple(k * STAGGER_S for k in range(len(batch.lengths)))
    schedule = Schedule(offsets=offsets, window_s=offsets[-1], source=f"batch of {len(offsets)}")
    config = StreamConfig(
        endpoints=(ep,),
        model=model,
        lengths=batch.lengths,
        prompt_overhead=overhead,
        temperature=1.0,
        seed=seed,
        max_requests=len(offsets),
        max_duration_s=offsets[-1] + 1.0,
        concurrency_cap=max(1, len(offsets)),
        timeout_s=STREAM_TIMEOUT_S,
    )
    result = asyncio.run(run_streams(schedule, config))
    return list(result.records)


@dataclass(frozen=True)
class Measured:
    """A run's fitted profile and the points it came from."""

    profile: TokenProfile
    points: tuple[ProfilePoint, ...]
    overhead: int


def measure(
    url: str,
    model: str,
    version: str,
    plan: Plan,
    say: Callable[[str], None] = lambda _m: None,
    seed: int = 5000,
) -> Measured:
    """Run `plan` against `url` and fit the profile (`fit_profile` at the plan's
    sequences). ProfileRunError on no answer, a failed stream, or too few points."""
    ep = endpoint(url)
    overhead = probe(ep, model, version)
    if min(plan.prompt_tokens) <= overhead:
        raise ProfileRunError(
            f"the shortest prompt ({min(plan.prompt_tokens)} tokens) is not longer than the "
            f"server's chat template ({overhead} tokens): give longer --prompt-tokens"
        )
    say(f"{ep}: {model} version {version} answers; chat template {overhead} tokens")
    warm = Batch(plan.sequences, ((min(plan.prompt_tokens), WARMUP_TOKENS),) * plan.sequences)
    points_of(_play(ep, model, warm, overhead, seed), plan.sequences)
    points: list[ProfilePoint] = []
    for i, batch in enumerate(plan.batches, start=1):
        seed += len(batch.lengths)
        got = points_of(_play(ep, model, batch, overhead, seed), batch.concurrency)
        points += got
        tpots = ", ".join(f"{p.tpot_s * 1000:.0f}" for p in got) or "-"
        say(
            f"batch {i}/{len(plan.batches)}: {batch.concurrency} at once, prompts "
            f"{'/'.join(str(p) for p, _ in batch.lengths)} tokens: TTFT "
            + ", ".join(f"{p.ttft_s * 1000:.0f}" for p in got)
            + f" ms, TPOT {tpots} ms"
        )
    levels = {p.concurrency for p in points}
    if 1 not in levels or len({p.prompt_tokens for p in points}) < 2:
        raise ProfileRunError(
            f"too few usable streams ({len(points)}: the model ended its answers after one "
            "token?): nothing to fit"
        )
    return Measured(fit_profile(points, sequences=plan.sequences), tuple(points), overhead)
