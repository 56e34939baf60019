"""An LLM's token metrics on a Triton page: parsing and the token signal, pure.

`bridge.triton.metrics.parse_page` hands this module the families below (`wants`,
`LlmAccumulator`) and puts each (model, version)'s `LlmSample` on its `ModelSample.llm`;
`bridge.triton.signal` reads two samples into an `LlmWindow` (`llm_window`) and the
windows of a model's replicas into its token signal (`aggregate`); a model's status
(`bridge.models.status_tokens`) sums its servers' histograms as that does (`summed_p99`).
No I/O, no clock.

Sources, each name, type and label set read from the backend's own code:

- Triton's vLLM backend (triton-inference-server/vllm_backend src/utils/metrics.py,
  class TritonMetrics, at 8de0c148bda1da25de1e05ffaaf67116dacc7264; labels model and
  version as src/model.py sets them): histograms `vllm:time_to_first_token_seconds`,
  `vllm:time_per_output_token_seconds`, `vllm:e2e_request_latency_seconds`, and the
  per-request length histograms `vllm:request_prompt_tokens` and
  `vllm:request_generation_tokens` (one observation per request of its prompt and its
  generated token count, buckets `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20,
  50, ... up to the context length); counters `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`. That backend reports no
  gauge: `vllm:num_requests_running` and `vllm:num_requests_waiting` are vLLM's own
  server's (vllm/v1/metrics/loggers.py), read here when a page has them (a custom backend
  may report them under the model and version labels). The lab's LLM
  (triton_repo/smol) reports the backend's families, same names, kinds and buckets.
- The TensorRT-LLM backend (triton-inference-server/tensorrtllm_backend
  inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc at
  15cb989, the last commit before the backend moved into NVIDIA/TensorRT-LLM; its README
  at 0b9d7d5 shows the page): gauge `nv_trt_llm_request_metrics` with `request_type`
  "active" (requests in flight: running) and "waiting"; histograms
  `nv_llm_input_token_len` and `nv_llm_output_token_len` (`response_metric_type`
  "total_input_tokens" / "total_output_tokens", one observation per request of its
  token count, buckets 10, 50, 100, 500, 1000): their `_sum` is the prompt and the
  generated token count, their buckets the prompt and output length histograms as
  vLLM's are (every length above 1000 tokens in the +Inf bucket, see `length_quantiles`).
  It has no time-to-first-token or per-token histogram; its
  `nv_trt_llm_inflight_batcher_metrics` token figures are per-iteration gauges, not
  counts, and are not read.
- Triton core (triton-inference-server/core src/metrics.cc and
  src/metric_model_reporter.cc at 73aad7c3348d040c7087d57837d75822c488495e; since
  c815a13, release 24.11): histogram `nv_inference_first_response_histogram_ms`
  (model, version; buckets 100, 500, 2000, 5000 ms by default), only under
  `--metrics-config histogram_latencies=true`. The lab's 2.51 server has none. It is the
  time to first token where the backend reports none (TensorRT-LLM).

`nv_inference_pending_request_count` counts a request from its enqueue until an instance
takes it (core src/infer_request.cc: PENDING -> EXECUTING decrements it), so a stream being
generated is not in it. Running is the backend's gauge where there is one (vLLM's
`num_requests_running`, TensorRT-LLM's active requests); on a vLLM-backend page without
it, the streams past their first token and not finished: the time-to-first-token count
less the end-to-end count (both cumulative since the load; a request still in its prefill
is in neither). "No data" is None, never zero, everywhere.

The length histograms are read cumulative since the load, never as a window's increase
(`LlmWindow`): a 15 s window holds a handful of requests, too few for the tail of the
prompt lengths the token capacity model needs. A model's lengths are its replicas'
histograms summed (`length_quantiles`), as 101 equally weighted quantiles.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ModelKey = tuple[str, str]
"""(model name, version) as Triton labels them."""

# ---- the families --------------------------------------------------------------------

#: histogram family (as prometheus_client names it) -> `LlmSample` field
HISTOGRAMS: Mapping[str, str] = {
    "vllm:time_to_first_token_seconds": "ttft_s",
    "vllm:time_per_output_token_seconds": "tpot_s",
    "vllm:e2e_request_latency_seconds": "e2e_s",
    "nv_inference_first_response_histogram_ms": "first_response_ms",
    # per-request lengths in tokens (cumulative since the load, also in a window)
    "vllm:request_prompt_tokens": "prompt_len",
    "vllm:request_generation_tokens": "output_len",
    # TensorRT-LLM's, whose `_sum` is also the token counter (`TRT_TOKENS`)
    "nv_llm_input_token_len": "prompt_len",
    "nv_llm_output_token_len": "output_len",
}
#: the `LlmFigures` fields that are histograms, each once
_HIST_FIELDS = tuple(dict.fromkeys(HISTOGRAMS.values()))
#: the histogram fields carried cumulative into a window (`llm_window`)
LENGTH_FIELDS = ("prompt_len", "output_len")
#: counter family -> field, each by both names: prometheus_client strips a declared
#: counter's `_total`, an undeclared one keeps it
COUNTERS: Mapping[str, str] = {
    family + suffix: field
    for family, field in (
        ("vllm:prompt_tokens", "prompt_tokens"),
        ("vllm:generation_tokens", "generation_tokens"),
    )
    for suffix in ("", "_total")
}
#: gauge family -> field
GAUGES: Mapping[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}
TRT_REQUESTS = "nv_trt_llm_request_metrics"
#: TensorRT-LLM's `request_type` label -> field
TRT_REQUEST_TYPES: Mapping[str, str] = {"active": "running", "waiting": "waiting"}
#: TensorRT-LLM's per-request token histograms -> the counter field their `_sum` is
TRT_TOKENS: Mapping[str, str] = {
    "nv_llm_input_token_len": "prompt_tokens",
    "nv_llm_output_token_len": "generation_tokens",
}
#: every family read here, by the name a page's lines carry (for the parser's line filter)
LINE_NAMES = frozenset(
    [*HISTOGRAMS, *COUNTERS, *GAUGES, TRT_REQUESTS, *TRT_TOKENS]
    + [f"{h}{s}" for h in [*HISTOGRAMS, *TRT_TOKENS] for s in ("_bucket", "_count", "_sum")]
)
_FAMILIES = frozenset([*HISTOGRAMS, *COUNTERS, *GAUGES, TRT_REQUESTS, *TRT_TOKENS])


def wants(family: str) -> bool:
    """Whether a parsed family (prometheus_client's name) is one this module reads."""
    return family in _FAMILIES


# ---- values --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative buckets as (upper bound, count) sorted by bound, the +Inf bucket last
    when the page had it; count and sum as the page gave them (None: absent or invalid)."""

    buckets: tuple[tuple[float, float], ...]
    count: float | None = None
    sum: float | None = None

    def quantile(self, q: float) -> float | None:
        """`histogram_quantile(q)` over these buckets (see `histogram_quantile`)."""
        return histogram_quantile(q, self.buckets)


@dataclass(frozen=True, slots=True)
class LlmFigures:
    """One (model, version)'s token figures, a field per family read here: a scrape's
    (`LlmSample`) or a window's (`LlmWindow`)."""

    ttft_s: Histogram | None = None
    tpot_s: Histogram | None = None
    e2e_s: Histogram | None = None
    #: Triton core's time to first response, in ms
    first_response_ms: Histogram | None = None
    #: each request's prompt and generated length, tokens (always cumulative since the
    #: load, in a window too)
    prompt_len: Histogram | None = None
    output_len: Histogram | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    #: the backend's own gauges (vLLM, TensorRT-LLM)
    running: float | None = None
    waiting: float | None = None


@dataclass(frozen=True, slots=True)
class LlmSample(LlmFigures):
    """One (model, version)'s token metrics at one scrape. Histograms and token counts
    are cumulative since the load; running and waiting are gauges. None: not on the page."""

    @property
    def open_streams(self) -> float | None:
        """Requests being generated: the backend's running gauge, else the streams past
        their first token and not finished (see the module docstring); None: unknown."""
        if self.running is not None:
            return self.running
        first = self.ttft_s.count if self.ttft_s is not None else None
        done = self.e2e_s.count if self.e2e_s is not None else None
        if first is None or done is None:
            return None
        return max(0.0, first - done)


def _valid(v: float) -> bool:
    return math.isfinite(v) and v >= 0


class _HistAcc:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets: dict[float, float] = {}
        self.count: float | None = None
        self.sum: float | None = None

    def freeze(self) -> Histogram:
        return Histogram(tuple(sorted(self.buckets.items())), _clean(self.count), _clean(self.sum))


def _add(old: float | None, v: float) -> float:
    """Series of one (model, version) are added; one invalid value spoils the field."""
    if not _valid(v):
        return math.nan
    return float(v) if old is None else old + v


def _clean(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else v


class LlmAccumulator:
    """Collects the families of one page (`take`), then `freeze`s them per model."""

    def __init__(self) -> None:
        self._values: dict[ModelKey, dict[str, float]] = {}
        self._hists: dict[tuple[ModelKey, str], _HistAcc] = {}

    def take(self, family: Any, key_of: Any) -> None:
        """One parsed family (prometheus_client's `Metric`); `key_of(labels)` gives the
        (model, version) of a sample or None."""
        name: str = family.name
        hist = HISTOGRAMS.get(name)
        tokens = TRT_TOKENS.get(name)
        for s in family.samples:
            key = key_of(s.labels)
            if key is None or s.name.endswith("_created"):
                continue
            values = self._values.setdefault(key, {})
            if hist is not None:
                self._histogram(key, hist, name, s.name, s.labels, s.value)
            if tokens is not None:
                if s.name == f"{name}_sum":
                    values[tokens] = _add(values.get(tokens), s.value)
            elif name == TRT_REQUESTS:
                field = TRT_REQUEST_TYPES.get(s.labels.get("request_type", ""))
                if field is not None:
                    values[field] = _add(values.get(field), s.value)
            elif hist is None:
                field = COUNTERS.get(name) or GAUGES[name]
                values[field] = _add(values.get(field), s.value)

    def _histogram(
        self, key: ModelKey, field: str, family: str, sample: str, labels: Any, value: float
    ) -> None:
        acc = self._hists.get((key, field))
        if acc is None:
            acc = self._hists[(key, field)] = _HistAcc()
        if sample == f"{family}_bucket":
            try:
                le = float(labels["le"])
            except (KeyError, ValueError):
                return
            acc.buckets[le] = _add(acc.buckets.get(le), value)
        elif sample == f"{family}_count":
            acc.count = _add(acc.count, value)
        elif sample == f"{family}_sum":
            acc.sum = _add(acc.sum, value)

    def freeze(self) -> dict[ModelKey, LlmSample]:
        out: dict[ModelKey, LlmSample] = {}
        for key, values in self._values.items():
            hists: dict[str, Histogram | None] = {}
            for field in _HIST_FIELDS:
                acc = self._hists.get((key, field))
                if acc is None:
                    continue
                frozen = acc.freeze()
                bad = any(math.isnan(c) for _, c in frozen.buckets)
                hists[field] = None if bad or not frozen.buckets else frozen
            fields: dict[str, Any] = {**hists, **{f: _clean(v) for f, v in values.items()}}
            out[key] = LlmSample(**fields)
        return out


# ---- the quantile --------------------------------------------------------------------


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets as Prometheus' `histogram_quantile` reads them
    (promql/quantile.go, bucketQuantile): the rank q x the +Inf bucket's count, found in
    the first bucket whose count reaches it, interpolated linearly between that bucket's
    lower and upper bound (lower 0 for the first bucket); a rank in the +Inf bucket gives
    the largest finite bound. None when there is no +Inf bucket, no observation, or q is
    outside [0, 1]. Counts that fall with the bound (a torn read) are raised to the
    largest before them, as Prometheus does."""
    if not 0 <= q <= 1:
        return None
    ordered = sorted(buckets)
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return None
    fixed: list[tuple[float, float]] = []
    top = 0.0
    for le, count in ordered:
        top = max(top, count)
        fixed.append((le, top))
    total = fixed[-1][1]
    if not total > 0:
        return None
    rank = q * total
    b = next(i for i, (_, c) in enumerate(fixed) if c >= rank)
    if b == len(fixed) - 1:
        return fixed[-2][0]
    if b == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start = 0.0 if b == 0 else fixed[b - 1][0]
    end, count = fixed[b]
    if b > 0:
        count -= fixed[b - 1][1]
        rank -= fixed[b - 1][1]
    return start + (end - start) * (rank / count) if count > 0 else end


# ---- the window ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlmWindow(LlmFigures):
    """One (instance, model, version)'s token metrics over a window of `seconds` between
    two scrapes: the histograms' bucket increases, the token counts' increases, and the
    later gauges (running: the later sample's `open_streams`). None: no data (no earlier
    sample, no such family, or a family that went invalid).

    The length histograms (`prompt_len`, `output_len`) are the exception: the later
    sample's, unchanged, cumulative since the server loaded the version (a window holds
    too few requests for a tail; a reset only means they restarted with the load). Like
    the gauges they stand without an earlier sample or a usable window."""

    seconds: float | None = None


def _hist_delta(before: Histogram | None, after: Histogram | None, reset: bool) -> Histogram | None:
    if after is None:
        return None
    if reset:
        return after
    if before is None:
        return None
    old = dict(before.buckets)
    if set(old) != {le for le, _ in after.buckets}:
        return after  # new buckets: the model was reloaded with other bounds
    return Histogram(
        tuple((le, c - old[le]) for le, c in after.buckets),
        None if after.count is None or before.count is None else after.count - before.count,
        None if after.sum is None or before.sum is None else after.sum - before.sum,
    )


def went_back(before: LlmSample | None, after: LlmSample) -> bool:
    """Whether any cumulative value fell between the two samples (a reload or restart)."""
    if before is None:
        return False
    pairs = [(before.prompt_tokens, after.prompt_tokens),
             (before.generation_tokens, after.generation_tokens)]  # fmt: skip
    for field in _HIST_FIELDS:
        b, a = getattr(before, field), getattr(after, field)
        if b is not None and a is not None:
            pairs.append((b.count, a.count))
    return any(b is not None and a is not None and a < b for b, a in pairs)


def llm_window(
    before: LlmSample | None, after: LlmSample, seconds: float | None, reset: bool
) -> LlmWindow:
    """The window between two samples of one (instance, model, version). `reset`: the
    caller's counter reset (a restart); a token count or histogram count that fell is one
    too. On a reset the later values are the window's increases (Prometheus' `increase()`,
    as `bridge.triton.signal` does); with no earlier sample or no usable `seconds`, only
    the gauges stand. The length histograms are the later sample's in every case."""
    open_streams = after.open_streams
    lengths = {f: getattr(after, f) for f in LENGTH_FIELDS}
    if (before is None and not reset) or not (seconds is not None and seconds > 0):
        return LlmWindow(running=open_streams, waiting=after.waiting, **lengths)
    reset = reset or went_back(before, after)

    def delta(field: str) -> float | None:
        a: float | None = getattr(after, field)
        if reset or a is None:
            return a
        b: float | None = getattr(before, field) if before is not None else None
        return None if b is None else a - b

    return LlmWindow(
        seconds=seconds,
        ttft_s=_hist_delta(before.ttft_s if before else None, after.ttft_s, reset),
        tpot_s=_hist_delta(before.tpot_s if before else None, after.tpot_s, reset),
        e2e_s=_hist_delta(before.e2e_s if before else None, after.e2e_s, reset),
        first_response_ms=_hist_delta(
            before.first_response_ms if before else None, after.first_response_ms, reset
        ),
        prompt_tokens=delta("prompt_tokens"),
        generation_tokens=delta("generation_tokens"),
        running=open_streams,
        waiting=after.waiting,
        **lengths,
    )


# ---- one model over its replicas -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenSignal:
    """One model's token signal over its replicas for one window (None: no data).

    p99s in ms from the summed bucket increases of every replica (Prometheus'
    `histogram_quantile(0.99, sum by (le) (increase(...)))`; replicas with other bounds:
    the largest of their own p99s). TTFT from the backend's histogram, else Triton's
    first-response histogram. Token rates per second over the windows with data;
    running and waiting summed over the replicas that report them. Prompt and output
    lengths (tokens): `LENGTH_QUANTILES` equally weighted quantiles of every request the
    replicas have seen since their load (`length_quantiles`). The means of the backend's
    own TTFT clock (from an instance's pick-up: the prefill, no queue wait; never
    Triton's first response, which holds the queue) and of its token gaps over the
    window, with the requests it timed (`timed`): what the token capacity model corrects
    its profile by (`bridge.policy.tokenfit.calibrate`)."""

    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    prompt_tps: float | None = None
    output_tps: float | None = None
    running: float | None = None
    waiting: float | None = None
    prompt_lengths: tuple[float, ...] | None = None
    output_lengths: tuple[float, ...] | None = None
    ttft_mean_ms: float | None = None
    tpot_mean_ms: float | None = None
    timed: float | None = None


def aggregate(windows: Iterable[LlmWindow]) -> TokenSignal | None:
    """A model's token signal from its replicas' windows; None when none reports an LLM
    family (a model that is not an LLM)."""
    ws = list(windows)
    if not ws:
        return None
    ttft = [w.ttft_s if w.ttft_s is not None else _ms_to_s(w.first_response_ms) for w in ws]
    return TokenSignal(
        ttft_p99_ms=_ms(summed_p99([h for h in ttft if h is not None])),
        tpot_p99_ms=_ms(summed_p99([w.tpot_s for w in ws if w.tpot_s is not None])),
        e2e_p99_ms=_ms(summed_p99([w.e2e_s for w in ws if w.e2e_s is not None])),
        prompt_tps=_rate(ws, "prompt_tokens"),
        output_tps=_rate(ws, "generation_tokens"),
        running=_total(w.running for w in ws),
        waiting=_total(w.waiting for w in ws),
        prompt_lengths=length_quantiles([w.prompt_len for w in ws if w.prompt_len is not None]),
        output_lengths=length_quantiles([w.output_len for w in ws if w.output_len is not None]),
        ttft_mean_ms=_ms(_mean([w.ttft_s for w in ws])),
        tpot_mean_ms=_ms(_mean([w.tpot_s for w in ws])),
        timed=_total(w.ttft_s.count for w in ws if w.ttft_s is not None),
    )


def _mean(hists: Iterable[Histogram | None]) -> float | None:
    """The mean of the observations of several windows' histograms: their sums over
    their counts (None without an observation or where a sum is missing)."""
    total = count = 0.0
    for h in hists:
        if h is None or not h.count:
            continue
        if h.sum is None:
            return None
        total += h.sum
        count += h.count
    return total / count if count > 0 else None


def summed_p99(hists: Sequence[Histogram]) -> float | None:
    """The p99 of several servers' histograms together: their buckets summed where the
    bounds agree, else the highest of their own p99s; None without an observation."""
    if not hists:
        return None
    bounds = {tuple(le for le, _ in h.buckets) for h in hists}
    if len(bounds) == 1:
        summed: dict[float, float] = {}
        for h in hists:
            for le, c in h.buckets:
                summed[le] = summed.get(le, 0.0) + c
        return histogram_quantile(0.99, summed.items())
    own = [v for h in hists if (v := h.quantile(0.99)) is not None]
    return max(own) if own else None


#: how many quantiles stand for a length distribution (`length_quantiles`)
LENGTH_QUANTILES = 101


def length_quantiles(hists: Sequence[Histogram]) -> tuple[float, ...] | None:
    """A length distribution from several servers' cumulative histograms, as
    `LENGTH_QUANTILES` equally weighted representatives: `histogram_quantile` at
    q = (k + 0.5) / LENGTH_QUANTILES for k = 0 .. LENGTH_QUANTILES - 1 (the middle of
    each of as many equal slices: neither 0 nor 1), ascending. None when no histogram
    has an observation (no data, never zeros).

    The histograms whose bounds agree are summed by bucket; where the servers' bounds
    differ (models loaded with other context lengths) the group with the most
    observations (its +Inf bucket's count) stands alone, the first of equals.

    As Prometheus reads them, a representative whose rank falls in the +Inf bucket is
    the largest finite bound: every length above it reads as that bound. The vLLM
    backend's last bound is the largest 1-2-5 value not above the context length (up to
    2.5 times below it, 2000 for a context of 4096); TensorRT-LLM's is 1000 tokens, so
    its tail above that is cut there. Within a bucket the lengths are spread evenly
    (linear interpolation; from 0 in the first)."""
    groups: dict[tuple[float, ...], dict[float, float]] = {}
    for h in hists:
        summed = groups.setdefault(tuple(le for le, _ in h.buckets), {})
        for le, c in h.buckets:
            summed[le] = summed.get(le, 0.0) + c
    best = max(groups.values(), key=_observations, default=None)
    if best is None or not _observations(best) > 0:
        return None
    out = [
        histogram_quantile((k + 0.5) / LENGTH_QUANTILES, best.items())
        for k in range(LENGTH_QUANTILES)
    ]
    return tuple(v for v in out if v is not None) if None not in out else None


def _observations(buckets: Mapping[float, float]) -> float:
    """The observations of cumulative buckets: the largest count, 0 without +Inf."""
    return max(buckets.values()) if math.inf in buckets else 0.0


def _rate(ws: list[LlmWindow], field: str) -> float | None:
    rates = [
        v / w.seconds
        for w in ws
        if (v := getattr(w, field)) is not None and w.seconds is not None and w.seconds > 0
    ]
    return math.fsum(rates) if rates else None


def _total(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return math.fsum(vals) if vals else None


def _ms_to_s(h: Histogram | None) -> Histogram | None:
    if h is None:
        return None
    return Histogram(
        tuple((le / 1000.0, c) for le, c in h.buckets),
        h.count,
        None if h.sum is None else h.sum / 1000.0,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
