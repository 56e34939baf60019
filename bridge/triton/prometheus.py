"""The latency and load signal from a Prometheus server: the scale path of the observe step.

The site's Prometheus scrapes every Triton server (discovered through the bridge's /sd)
and evaluates `deploy/prometheus/rules.yml`: per (replica, model) the success and failure
rates, the request, queue and compute time per second, the pending requests and Triton's
p99. Each tick the bridge asks ONE instant query, whatever the fleet's size: per model,
over the replicas that are fresh, the sums of those rates, the largest p99, and how many
replicas report the model and how many of them are fresh. Prometheus does the work over
its series; the bridge reads a few dozen numbers.

Fresh: the replica's last scrape succeeded (`up == 1`) and is at most `max_staleness_s`
old (`time() - timestamp(up)`). A replica that is down, or that Prometheus stopped
scraping, gives no data (never a calm reading), as an unreachable page does on the direct
path; its rule series would go on for a while from the samples still inside their 20 s
window, and the freshness join cuts them off. A model none of whose replicas is fresh has
no sample.

The result is the direct path's own type (`bridge.triton.signal.ModelSignal`), made the
same way: sums of rates, means and the queue/compute ratio as ratios of sums, the largest
p99. Errors (Prometheus unreachable, a bad answer) raise `PrometheusError`; the observe
step then has no data for any model this tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from bridge.triton.signal import ModelSignal

#: the replicas whose last scrape succeeded and is recent; `{stale}` is filled in
FRESH = (
    '((time() - timestamp(up{{job="triton"}})) <= {stale}) '
    'and on(instance) (up{{job="triton"}} == 1)'
)
#: statistic -> PromQL over the recording rules, per model
_STATS = {
    "success": "sum by (model) (stb:triton_success:rate20s and on(instance) ({fresh}))",
    "failure": "sum by (model) (stb:triton_failure:rate20s and on(instance) ({fresh}))",
    "request_us": "sum by (model) (stb:triton_request_us:rate20s and on(instance) ({fresh}))",
    "queue_us": "sum by (model) (stb:triton_queue_us:rate20s and on(instance) ({fresh}))",
    "compute_us": "sum by (model) (stb:triton_compute_us:rate20s and on(instance) ({fresh}))",
    "pending": "sum by (model) (stb:triton_pending:sum and on(instance) ({fresh}))",
    "p99_us": "max by (model) (stb:triton_p99_us:max and on(instance) ({fresh}))",
    "with_data": "count by (model) (stb:triton_success:rate20s and on(instance) ({fresh}))",
    "fresh": "count by (model) (stb:triton_pending:sum and on(instance) ({fresh}))",
    "replicas": "count by (model) (stb:triton_pending:sum)",
}
#: the largest answer read (bytes)
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class PrometheusError(RuntimeError):
    """Prometheus did not answer, or answered something this module cannot read."""


def query(max_staleness_s: float) -> str:
    """The one instant query of a tick (every statistic, labelled `stb_stat`)."""
    fresh = FRESH.format(stale=f"{max_staleness_s:g}")
    return " or ".join(
        f'label_replace({expr.format(fresh=fresh)}, "stb_stat", "{name}", "", "")'
        for name, expr in _STATS.items()
    )


@dataclass(frozen=True)
class Reading:
    """One tick's answer: each model's signal over its fresh replicas, and how many of
    the replicas reporting it were left out as stale."""

    at: float
    models: Mapping[str, ModelSignal]
    stale: Mapping[str, int]


class PrometheusSignal:
    """Reads the signal from `url` (the Prometheus server's base URL)."""

    def __init__(self, url: str, max_staleness_s: float = 15.0, timeout_s: float = 3.0) -> None:
        self.url = url.rstrip("/")
        self.max_staleness_s = max_staleness_s
        self._query = query(max_staleness_s)
        self._http = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def read(self) -> Reading:
        """Every model's signal over the replicas Prometheus scraped recently enough."""
        try:
            reply = self._http.post(f"{self.url}/api/v1/query", data={"query": self._query})
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
            raise PrometheusError(f"{self.url}: the signal query did not give an instant vector")
        return fold(data["result"])


def _value(raw: object) -> float | None:
    try:
        v = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def fold(result: list[dict[str, object]]) -> Reading:
    """Pure: the query's series -> each model's `ModelSignal` (see the module)."""
    stats: dict[str, dict[str, float | None]] = {}
    at = 0.0
    for r in result:
        labels, sample = r.get("metric"), r.get("value")
        if not isinstance(labels, dict) or not isinstance(sample, list) or len(sample) != 2:
            continue
        model, stat = labels.get("model"), labels.get("stb_stat")
        if not model or stat not in _STATS:
            continue
        at = max(at, float(sample[0]))
        stats.setdefault(str(model), {})[str(stat)] = _value(sample[1])
    models = {}
    stale = {}
    for model, s in sorted(stats.items()):
        replicas = int(s.get("replicas") or 0)
        fresh = int(s.get("fresh") or 0)
        stale[model] = max(0, replicas - fresh)
        if fresh == 0:
            continue  # every replica stale: no sample, never a calm one
        models[model] = _signal(model, fresh, s)
    return Reading(at, models, stale)


def _signal(model: str, fresh: int, s: Mapping[str, float | None]) -> ModelSignal:
    success, failure = s.get("success"), s.get("failure")
    request_us, queue_us, compute_us = s.get("request_us"), s.get("queue_us"), s.get("compute_us")
    p99_us = s.get("p99_us")
    requests = None if success is None or failure is None else success + failure

    def per_success(us: float | None) -> float | None:
        return None if us is None or success is None or not success > 0 else us / success / 1000

    return ModelSignal(
        model=model,
        instances=fresh,
        with_data=int(s.get("with_data") or 0),
        requests=requests,
        request_rate=requests,
        failure_rate=failure,
        mean_latency_ms=per_success(request_us),
        mean_queue_ms=per_success(queue_us),
        mean_compute_ms=per_success(compute_us),
        queue_compute_ratio=None
        if queue_us is None or compute_us is None or not compute_us > 0
        else queue_us / compute_us,
        pending=s.get("pending"),
        p50_ms=None,
        p95_ms=None,
        p99_ms=None if p99_us is None else p99_us / 1000,
    )


__all__ = ["PrometheusError", "PrometheusSignal", "Reading", "fold", "query"]
