"""The latency and load signal: pure functions from two scrapes of an instance to numbers.

Called by the daemon's observe step (which scrapes, stamps each page with its own clock,
and keeps the previous `Scrape` per instance) and by bench/observe.py; the policy
reads the result. No I/O and no clock: the times are in the observations.

Per (instance, model, version) over the window between two scrapes:
- p50/p95/p99 in ms: Triton's request-latency summary on the later page (its own 60 s
  sliding window). None when Triton did not emit that quantile or emitted NaN (no request
  in its window): never invented, never interpolated.
- mean latency and mean queue time (ms per successful request), and the queue/compute
  ratio, from counter deltas; request and failure rates per second; pending requests (the
  later page's gauge).

"No data" is None, always distinct from a measured zero: an idle model has `requests == 0`
and rates 0.0, while its mean latency and ratio are None (nothing was measured, so nothing
to average); a model with no usable window has `requests is None`. Missing, NaN, negative or
garbage values, an unparseable page, a first sighting and a non-positive window all give
None, so they can never read as a breach (or as a calm).

Counter resets. Triton's counters restart from zero when the server restarts (a new Slurm
job on the node) or the model is reloaded. A window is a reset when any counter of the
model is smaller than before, or the observations' `incarnation` differs. Then the later
values are taken as the window's deltas (what Prometheus' `increase()` does): everything
the new server counted happened after it started, which is after the earlier scrape, so
the deltas are a true lower bound of the window's traffic. Rates are non-negative and never
above the real rate (the window is longer than the server's uptime in it), means and the
ratio are exact for the requests since the restart. The window is marked `RESET` so the
policy may discount it. The alternative, no data for that window, would blind the loop for
a tick exactly when capacity changed, and would disagree with a Prometheus server reading
the same counters at scale.

Aggregate per model over instances (and versions): sums of deltas, rates and pending, means
and the ratio weighted by requests (ratios of summed deltas), and for each quantile the
largest over instances: an upper bound of the fleet's quantile (if every replica's p99 is at
most X, at least 99% of all requests took at most X), exact when one replica serves.

An LLM's token signal (`bridge.triton.llm_metrics`): per window the TTFT and TPOT
histograms' bucket increases (their p99 as Prometheus' `histogram_quantile` reads the
replicas' summed increases: None when no request is in the window), prompt and output
tokens per second, running streams and waiting requests, and the prompt and output
lengths (the replicas' length histograms cumulative since their load, not the window's:
101 equally weighted quantiles, `llm_metrics.length_quantiles`); on `ModelSignal` beside
the request figures, all None for a model that reports no token family.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from bridge.triton.llm_metrics import LlmWindow, ModelKey, TokenSignal, aggregate, llm_window
from bridge.triton.metrics import MetricsPage, ModelSample


class Window(StrEnum):
    """How the counter window of one (instance, model) was read."""

    OK = "ok"
    """Both scrapes valid, every counter moved forward or stayed."""
    RESET = "reset"
    """A counter went backwards or the instance changed: later values taken as deltas."""
    NO_DATA = "no_data"
    """No earlier sample of this model, a page that did not parse, or no time elapsed."""


@dataclass(frozen=True, slots=True)
class Scrape:
    """One scrape of one instance.

    `at`: seconds on the caller's clock (monotonic is best) when the page was read.
    `incarnation`: who served the page, e.g. the Triton job's Slurm id ("" if unknown);
    a change means a restart even when the new counters already exceed the old ones.
    """

    instance: str
    at: float
    page: MetricsPage
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """One (instance, model, version) over one window. None is "no data" (see module).

    `*_delta` fields are the counter increases over the window (requests, microseconds),
    kept so aggregates weight by requests and accounting can read compute time.
    """

    instance: str
    model: str
    version: str
    window: Window
    seconds: float | None = None
    success_delta: float | None = None
    failure_delta: float | None = None
    request_us_delta: float | None = None
    queue_us_delta: float | None = None
    compute_us_delta: float | None = None
    requests: float | None = None
    request_rate: float | None = None
    failure_rate: float | None = None
    mean_latency_ms: float | None = None
    mean_queue_ms: float | None = None
    queue_compute_ratio: float | None = None
    pending: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    #: the token metrics' window; None: the model reports no token family
    llm: LlmWindow | None = None


@dataclass(frozen=True, slots=True)
class InstanceSignal:
    """Every model of one instance over one window; `error` says why the page gave nothing."""

    instance: str
    at: float
    models: tuple[ModelWindow, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSignal(TokenSignal):
    """One model over all instances that serve it (all versions). `instances` counts the
    instances that reported the model, `with_data` those whose counter window was usable.

    Its token figures are an LLM's token signal (`TokenSignal`, its fields): p99 time to
    first token and per output token, ms, over the window's requests (None: none in it),
    tokens per second in and out, streams running, requests waiting, prompt and output
    lengths as quantiles of every request since the replicas' load; all None for a model
    that reports no token family."""

    model: str
    instances: int
    with_data: int
    requests: float | None
    request_rate: float | None
    failure_rate: float | None
    mean_latency_ms: float | None
    mean_queue_ms: float | None
    #: compute time per successful request (input + infer + output), the capacity
    #: model's service time
    mean_compute_ms: float | None
    queue_compute_ratio: float | None
    pending: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


_COUNTER_FIELDS = (
    "request_success",
    "request_failure",
    "request_duration_us",
    "queue_duration_us",
    "compute_input_duration_us",
    "compute_infer_duration_us",
    "compute_output_duration_us",
    "inference_count",
    "exec_count",
)


def instance_signal(earlier: Scrape | None, later: Scrape) -> InstanceSignal:
    """The signal of one instance between two of its scrapes (earlier may be None).

    Raises ValueError if the two observations are of different instances (a caller bug).
    """
    if earlier is not None and earlier.instance != later.instance:
        raise ValueError(f"observations of {earlier.instance!r} and {later.instance!r}")
    before = earlier.page if earlier is not None and earlier.page.ok else None
    if not later.page.ok:
        # The models the earlier page showed are still expected: report them as no data.
        keys = before.models.keys() if before is not None else ()
        empty = tuple(_no_data(later.instance, k) for k in sorted(keys))
        return InstanceSignal(later.instance, later.at, empty, later.page.error)
    seconds = later.at - earlier.at if earlier is not None else 0.0
    restarted = earlier is not None and earlier.incarnation != later.incarnation
    models = tuple(
        _model_window(
            later.instance,
            before.models.get(key) if before is not None else None,
            sample,
            seconds,
            restarted,
        )
        for key, sample in sorted(later.page.models.items())
    )
    error = None if before is not None else "no earlier valid scrape"
    return InstanceSignal(later.instance, later.at, models, error)


def _no_data(instance: str, key: ModelKey) -> ModelWindow:
    return ModelWindow(instance, key[0], key[1], Window.NO_DATA)


def _model_window(
    instance: str,
    before: ModelSample | None,
    after: ModelSample,
    seconds: float,
    restarted: bool,
) -> ModelWindow:
    summary = after.request_summary
    p50, p95, p99 = (_ms(summary.quantile(q)) if summary else None for q in (0.5, 0.95, 0.99))
    pending = after.pending_requests
    if before is None or not (seconds > 0 and math.isfinite(seconds)):
        # No counter window, but the gauge and Triton's own quantiles still stand.
        return ModelWindow(
            instance, after.model, after.version, Window.NO_DATA,
            pending=pending, p50_ms=p50, p95_ms=p95, p99_ms=p99,
            llm=llm_window(None, after.llm, None, False) if after.llm else None,
        )  # fmt: skip
    reset = restarted or any(
        b is not None and a is not None and a < b
        for b, a in ((getattr(before, f), getattr(after, f)) for f in _COUNTER_FIELDS)
    )

    def delta(field: str) -> float | None:
        a: float | None = getattr(after, field)
        if reset or a is None:
            return a
        b: float | None = getattr(before, field)
        return None if b is None else a - b

    success = delta("request_success")
    failure = delta("request_failure")
    request_us = delta("request_duration_us")
    queue_us = delta("queue_duration_us")
    compute_us = _sum(
        delta("compute_input_duration_us"),
        delta("compute_infer_duration_us"),
        delta("compute_output_duration_us"),
    )
    requests = _sum(success, failure)
    return ModelWindow(
        instance=instance,
        model=after.model,
        version=after.version,
        window=Window.RESET if reset else Window.OK,
        seconds=seconds,
        success_delta=success,
        failure_delta=failure,
        request_us_delta=request_us,
        queue_us_delta=queue_us,
        compute_us_delta=compute_us,
        requests=requests,
        request_rate=_div(requests, seconds),
        failure_rate=_div(failure, seconds),
        mean_latency_ms=_ms(_div(request_us, success)),
        mean_queue_ms=_ms(_div(queue_us, success)),
        queue_compute_ratio=_div(queue_us, compute_us),
        pending=pending,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        llm=llm_window(before.llm, after.llm, seconds, reset) if after.llm else None,
    )


def model_signals(instances: Iterable[InstanceSignal]) -> Mapping[str, ModelSignal]:
    """Aggregate per model over instances and versions (see the module docstring)."""
    groups: dict[str, list[ModelWindow]] = {}
    for inst in instances:
        for w in inst.models:
            groups.setdefault(w.model, []).append(w)
    return {name: _aggregate(name, ws) for name, ws in sorted(groups.items())}


def _aggregate(model: str, ws: list[ModelWindow]) -> ModelSignal:
    data = [w for w in ws if w.window is not Window.NO_DATA]

    def total(field: str, of: list[ModelWindow]) -> float | None:
        vals = [v for w in of if (v := getattr(w, field)) is not None]
        return math.fsum(vals) if vals else None

    def worst(field: str) -> float | None:
        vals = [v for w in ws if (v := getattr(w, field)) is not None]
        return max(vals) if vals else None

    # Means and the ratio: only windows that have both numerator and denominator.
    def ratio(num: str, den: str) -> float | None:
        both = [w for w in data if getattr(w, num) is not None and getattr(w, den) is not None]
        return _div(total(num, both), total(den, both))

    tokens = aggregate(w.llm for w in ws if w.llm is not None)
    return ModelSignal(
        model=model,
        instances=len(ws),
        with_data=len(data),
        requests=total("requests", data),
        request_rate=total("request_rate", data),
        failure_rate=total("failure_rate", data),
        mean_latency_ms=_ms(ratio("request_us_delta", "success_delta")),
        mean_queue_ms=_ms(ratio("queue_us_delta", "success_delta")),
        mean_compute_ms=_ms(ratio("compute_us_delta", "success_delta")),
        queue_compute_ratio=ratio("queue_us_delta", "compute_us_delta"),
        pending=total("pending", ws),
        p50_ms=worst("p50_ms"),
        p95_ms=worst("p95_ms"),
        p99_ms=worst("p99_ms"),
        **(_token_fields(tokens) if tokens is not None else {}),
    )


def _token_fields(tokens: TokenSignal) -> dict[str, Any]:
    return {f.name: getattr(tokens, f.name) for f in fields(TokenSignal)}


def _sum(*vals: float | None) -> float | None:
    return None if any(v is None for v in vals) else math.fsum(v for v in vals if v is not None)


def _div(num: float | None, den: float | None) -> float | None:
    """num/den, or None when either is missing or den is not positive (nothing measured)."""
    if num is None or den is None or not den > 0:
        return None
    return num / den


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0
