"""The latency and load signal from a Prometheus server: the scale path of the observe step.

The site's Prometheus scrapes every Triton server (discovered through the bridge's /sd)
and evaluates `deploy/prometheus/rules.yml`: per (replica, model) the success and failure
rates, the request, queue and compute time per second, the pending requests and Triton's
p99. Each tick the bridge asks two instant queries, whatever the fleet's size:

- `{__name__=~"stb:triton_.+"}`: every recording rule's series;
- `timestamp(up{job="triton"}) and on(instance) (up{job="triton"} == 1)`: when each
  replica was last scraped, for those whose last scrape succeeded.

A replica counts only when its last good scrape is at most `max_staleness_s` old: a
replica that is down, or that Prometheus stopped scraping, gives no data (never a calm
reading), as an unreachable page does on the direct path. Its rule series would go on for
a while from the samples still inside their 20 s window; the `up` check cuts them off.

The result is the direct path's own types (`bridge.triton.signal`): one `InstanceSignal`
per replica whose windows carry per-second rates (a one-second window), so
`model_signals` aggregates both paths the same way (sums of rates, ratios of sums, the
largest p99). Errors (Prometheus unreachable, a bad answer) raise `PrometheusError`; the
observe step then has no data for any model this tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from bridge.triton.signal import InstanceSignal, ModelWindow, Window

RULES = "stb:triton_.+"
# timestamp() of the selector itself: the scrape's time (of an operator's result it would be
# the evaluation's); `and` keeps only the replicas whose last scrape succeeded
FRESHNESS = 'timestamp(up{job="triton"}) and on(instance) (up{job="triton"} == 1)'
#: recording rule -> the ModelWindow field it fills (per second)
_FIELDS = {
    "stb:triton_success:rate20s": "success_delta",
    "stb:triton_failure:rate20s": "failure_delta",
    "stb:triton_request_us:rate20s": "request_us_delta",
    "stb:triton_queue_us:rate20s": "queue_us_delta",
    "stb:triton_compute_us:rate20s": "compute_us_delta",
    "stb:triton_pending:sum": "pending",
    "stb:triton_p99_us:max": "p99_us",
}
#: the largest answer read (bytes): some 150 bytes a series, 7 series per (replica, model)
MAX_ANSWER_BYTES = 256 * 1024 * 1024


class PrometheusError(RuntimeError):
    """Prometheus did not answer, or answered something this module cannot read."""


@dataclass(frozen=True)
class Reading:
    """One tick's answer: per replica (Slurm job id) its signal, and the replicas left out
    because their last good scrape was too old or missing."""

    at: float
    instances: Mapping[str, InstanceSignal]
    stale: frozenset[str]


class PrometheusSignal:
    """Reads the signal from `url` (the Prometheus server's base URL)."""

    def __init__(self, url: str, max_staleness_s: float = 15.0, timeout_s: float = 3.0) -> None:
        self.url = url.rstrip("/")
        self.max_staleness_s = max_staleness_s
        self._http = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def _query(self, promql: str) -> tuple[float, list[dict[str, object]]]:
        try:
            reply = self._http.post(f"{self.url}/api/v1/query", data={"query": promql})
        except httpx.HTTPError as exc:
            raise PrometheusError(f"{self.url}: {exc!r}") from exc
        if len(reply.content) > MAX_ANSWER_BYTES:
            raise PrometheusError(f"{self.url}: answer over {MAX_ANSWER_BYTES} bytes")
        try:
            doc = reply.json()
        except ValueError as exc:
            raise PrometheusError(f"{self.url}: HTTP {reply.status_code}, not JSON") from exc
        if reply.status_code != 200 or doc.get("status") != "success":
            raise PrometheusError(
                f"{self.url}: HTTP {reply.status_code}: {doc.get('error', doc)!s:.200}"
            )
        data = doc.get("data") or {}
        if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
            raise PrometheusError(f"{self.url}: {promql!r} did not give an instant vector")
        result = data["result"]
        at = max((float(r["value"][0]) for r in result), default=math.nan)
        return at, result

    def read(self) -> Reading:
        """The signal of every replica Prometheus scraped recently enough."""
        _, scraped = self._query(FRESHNESS)
        _, series = self._query(f'{{__name__=~"{RULES}"}}')
        return fold(scraped, series, self.max_staleness_s)


def _value(raw: object) -> float | None:
    try:
        v = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def fold(
    scraped: list[dict[str, object]], series: list[dict[str, object]], max_staleness_s: float
) -> Reading:
    """Pure: the two queries' results -> per-replica signals (see the module)."""
    last_scrape: dict[str, float] = {}
    at = 0.0
    for r in scraped:
        labels = r["metric"]
        assert isinstance(labels, dict)
        sample = r["value"]
        assert isinstance(sample, list) and len(sample) == 2
        when, value = sample
        at = max(at, float(when))
        job = labels.get("slurm_job_id")
        scraped_at = _value(value)
        if job and scraped_at is not None:
            last_scrape[str(job)] = max(last_scrape.get(str(job), 0.0), scraped_at)
    fields: dict[tuple[str, str], dict[str, float | None]] = {}
    seen: set[str] = set()
    for r in series:
        labels = r["metric"]
        assert isinstance(labels, dict)
        field = _FIELDS.get(str(labels.get("__name__")))
        job, model = labels.get("slurm_job_id"), labels.get("model")
        if field is None or not job or not model:
            continue
        seen.add(str(job))
        fields.setdefault((str(job), str(model)), {})[field] = _value(r["value"][1])  # type: ignore[index]
    fresh = {job for job, t in last_scrape.items() if at - t <= max_staleness_s}
    windows: dict[str, list[ModelWindow]] = {}
    for (job, model), f in sorted(fields.items()):
        if job not in fresh:
            continue
        windows.setdefault(job, []).append(_window(job, model, f))
    instances = {job: InstanceSignal(job, at, tuple(ws)) for job, ws in windows.items()}
    return Reading(at, instances, frozenset((seen | set(last_scrape)) - fresh))


def _window(job: str, model: str, f: Mapping[str, float | None]) -> ModelWindow:
    success, failure = f.get("success_delta"), f.get("failure_delta")
    request_us, queue_us = f.get("request_us_delta"), f.get("queue_us_delta")
    compute_us = f.get("compute_us_delta")
    p99_us = f.get("p99_us")
    if success is None:  # no rate yet (a replica scraped once): its gauges still stand
        return ModelWindow(
            job, model, "", Window.NO_DATA,
            pending=f.get("pending"), p99_ms=None if p99_us is None else p99_us / 1000,
        )  # fmt: skip
    requests = success + failure if failure is not None else None

    def per_success(us: float | None) -> float | None:
        return None if us is None or not success > 0 else us / success / 1000

    return ModelWindow(
        instance=job,
        model=model,
        version="",
        window=Window.OK,
        seconds=1.0,
        success_delta=success,
        failure_delta=failure,
        request_us_delta=request_us,
        queue_us_delta=queue_us,
        compute_us_delta=compute_us,
        requests=requests,
        request_rate=requests,
        failure_rate=failure,
        mean_latency_ms=per_success(request_us),
        mean_queue_ms=per_success(queue_us),
        queue_compute_ratio=None if queue_us is None or not compute_us else queue_us / compute_us,
        pending=f.get("pending"),
        p99_ms=None if p99_us is None else p99_us / 1000,
    )


__all__ = ["PrometheusError", "PrometheusSignal", "Reading", "fold"]
