"""The latency and load signal from a Prometheus server: the scale path of the observe step.

The site's Prometheus scrapes every Triton server (discovered through the bridge's /sd)
and evaluates `deploy/prometheus/rules.yml`: per (replica, model) the success and failure
rates, the request, queue and compute time per second, the pending requests and Triton's
p99; then per model, over the replicas that are fresh, the sums of those rates, the
largest p99, and how many replicas report the model and how many of them are fresh. Each
tick the bridge asks ONE instant query for those per-model series (about ten a model,
whatever the fleet's size) and how old their last evaluation is. Prometheus does the
work as it evaluates its rules; the tick reads a few dozen numbers.

Fresh (in the rules): the replica's last scrape succeeded (`up == 1`) and is at most
15 s old (`time() - timestamp(up)`). A replica that is down, or that Prometheus stopped
scraping, gives no data (never a calm reading), as an unreachable page does on the direct
path; its rule series would go on for a while from the samples still inside their 20 s
window, and the freshness join cuts them off. A model none of whose replicas is fresh has
no sample, and so has every model whose rules were last evaluated longer ago than
`max_staleness_s`.

The result is the direct path's own type (`bridge.triton.signal.ModelSignal`), made the
same way: sums of rates, means and the queue/compute ratio as ratios of sums, the largest
p99. An LLM's prompt and output lengths (`TokenSignal.prompt_lengths`, `output_lengths`)
are not recorded by the rules: None on this path (the capacity model then takes every
request at the mean lengths of the token rates). Errors (Prometheus unreachable, a bad
answer) raise `PrometheusError`; the observe step then has no data for any model this
tick.

`PrometheusSignal.instant` asks any other instant query through the same client, timeout
and checks, as of a given time: each series' labels and value (`stb models status`'s
last-hour figures, `bridge.models.status_hour`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from bridge.triton.signal import ModelSignal

#: the bridge's statistics per model (`stb:model_<stat>:...` in rules.yml)
_STATS = (
    "success", "failure", "request_us", "queue_us", "compute_us", "pending", "p99_us",
    "with_data", "fresh", "replicas",
    # an LLM's token signal, where the rules record it (`stb:model_ttft_p99_s:...`: the
    # p99 of the fresh replicas' summed bucket rates; see docs/operators/prometheus.md)
    "ttft_p99_s", "tpot_p99_s", "prompt_tps", "output_tps", "running",
)  # fmt: skip
#: the one query of a tick: every per-model rule series, labelled with its statistic, and
#: how old the rules' last evaluation is (Prometheus stopped evaluating: no data)
QUERY = (
    'label_replace({__name__=~"stb:model_.+"}, "stb_stat", "$1", "__name__", '
    '"stb:model_([a-z0-9_]+):.*") '
    'or label_replace(time() - timestamp(stb:model_replicas:count), "stb_stat", "age", "", "")'
)
#: the largest answer read (bytes)
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class PrometheusError(RuntimeError):
    """Prometheus did not answer, or answered something this module cannot read."""


def shown_url(url: str) -> str:
    """The URL without a password or query, for messages and reports."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class PrometheusAPI:
    """The one HTTP client of Prometheus' query API in the project: the daemon's signal
    (`PrometheusSignal`), `stb models status` and the simulator's site inputs
    (`bridge.sim.inputs.prometheus`) all ask through it. `call` gives an answer whose
    `status` is success, else raises `PrometheusError` saying what happened, quoting the
    server's error and its type; answers over `max_answer_bytes` are refused."""

    def __init__(
        self, url: str, timeout_s: float = 3.0, max_answer_bytes: int = MAX_ANSWER_BYTES
    ) -> None:
        self.url = url.strip().rstrip("/")
        self.shown = shown_url(self.url)
        self._timeout_s = timeout_s
        self._max = max_answer_bytes
        self._http = httpx.Client(timeout=timeout_s)

    def __enter__(self) -> PrometheusAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(self, path: str, params: Mapping[str, str], *, post: bool = False) -> dict[str, Any]:
        """One request of the API (`post`: the form-encoded POST Prometheus takes for long
        queries, else GET): its JSON answer once its status is success."""
        try:
            if post:
                reply = self._http.post(self.url + path, data=dict(params))
            else:
                reply = self._http.get(self.url + path, params=params)
        except httpx.TimeoutException:
            raise PrometheusError(f"{self.shown}: no answer within {self._timeout_s}s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise PrometheusError(f"{self.shown}: {exc}") from None
        if len(reply.content) > self._max:
            raise PrometheusError(f"{self.shown}{path}: answer over {self._max} bytes")
        try:
            doc = reply.json()
        except ValueError:
            raise PrometheusError(
                f"{self.shown}{path}: HTTP {reply.status_code}, not JSON: {reply.text[:200]!r}"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success" or reply.status_code != 200:
            said = doc if not isinstance(doc, dict) else doc.get("error", doc)
            kind = doc.get("errorType", "") if isinstance(doc, dict) else ""
            raise PrometheusError(
                f"{self.shown}{path}: HTTP {reply.status_code}: "
                f"{kind + ': ' if kind else ''}{str(said)[:500]}"
            )
        return doc


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
        self._api = PrometheusAPI(self.url, timeout_s)

    def close(self) -> None:
        self._api.close()

    def read(self) -> Reading:
        """Every model's signal over the replicas Prometheus scraped recently enough."""
        return fold(self._vector(QUERY, None, "the signal query"), self.max_staleness_s)

    def instant(
        self, query: str, at: float | None = None
    ) -> list[tuple[dict[str, str], float | None]]:
        """One instant query as of `at` (Unix seconds; None: Prometheus's now): each
        series' labels and value (None: not a finite number >= 0). `PrometheusError` as
        `read`."""
        out = []
        for r in self._vector(query, at, "the query"):
            labels, sample = r.get("metric"), r.get("value")
            if not isinstance(labels, dict) or not isinstance(sample, list) or len(sample) != 2:
                continue
            out.append(({str(k): str(v) for k, v in labels.items()}, _value(sample[1])))
        return out

    def _vector(self, query: str, at: float | None, what: str) -> list[dict[str, object]]:
        """The instant vector `query` gives as of `at` (None: now), as Prometheus says it."""
        form = {"query": query} if at is None else {"query": query, "time": f"{at:.3f}"}
        doc = self._api.call("/api/v1/query", form, post=True)
        data = doc.get("data")
        if (
            not isinstance(data, dict)
            or data.get("resultType") != "vector"
            or not isinstance(data.get("result"), list)
        ):
            raise PrometheusError(f"{self._api.shown}: {what} gave no instant vector")
        return list(data["result"])


def _value(raw: object) -> float | None:
    try:
        v = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def fold(result: list[dict[str, object]], max_staleness_s: float = 15.0) -> Reading:
    """Pure: the query's series -> each model's `ModelSignal` (see the module)."""
    stats: dict[str, dict[str, float | None]] = {}
    at = 0.0
    for r in result:
        labels, sample = r.get("metric"), r.get("value")
        if not isinstance(labels, dict) or not isinstance(sample, list) or len(sample) != 2:
            continue
        model, stat = labels.get("model"), labels.get("stb_stat")
        if not model or (stat not in _STATS and stat != "age"):
            continue
        at = max(at, float(sample[0]))
        stats.setdefault(str(model), {})[str(stat)] = _value(sample[1])
    models = {}
    stale = {}
    for model, s in sorted(stats.items()):
        replicas = int(s.get("replicas") or 0)
        age = s.get("age")
        if age is None or age > max_staleness_s:  # the rules are not being evaluated
            stale[model] = replicas
            continue
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
        ttft_p99_ms=_ms(s.get("ttft_p99_s")),
        tpot_p99_ms=_ms(s.get("tpot_p99_s")),
        prompt_tps=s.get("prompt_tps"),
        output_tps=s.get("output_tps"),
        running=s.get("running"),
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


__all__ = ["QUERY", "PrometheusError", "PrometheusSignal", "Reading", "fold"]
