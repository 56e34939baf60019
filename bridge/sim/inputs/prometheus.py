"""Prometheus' HTTP API as the simulator's input: range queries of the models' request
rates (`query_range`, chunked under Prometheus' points limit), instant queries
(`query_instant`), and the answers read back, live or saved to a file, into arrival
series (`arrivals_from_prometheus`). Errors quote the server's own. Called by
`stb simulate --arrivals prometheus` and by `bridge.sim.inputs.service`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bridge.sim.inputs.arrivals import MAX_GAP_S, Samples, checked, resample
from bridge.sim.inputs.common import InputError, aware, iso, positive, read_json
from bridge.sim.workload import ArrivalSeries
from bridge.triton.prometheus import PrometheusAPI, PrometheusError, shown_url

#: per model, the successful requests per second (Triton's counter, over 1 minute)
DEFAULT_QUERY = "sum by (model) (rate(nv_inference_request_success[1m]))"
#: Prometheus refuses a range query of more than 11,000 points per series: each request
#: asks for at most this many
MAX_POINTS = 10_000
#: seconds each request to Prometheus may take
QUERY_TIMEOUT_S = 60.0
#: a site's range answer may be large (many models, 10,000 points each): refused past this
MAX_ANSWER_BYTES = 512 * 1024 * 1024


def base_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"prometheus URL {url!r}: give http(s)://host:port")
    return url.strip().rstrip("/")


def _get(api: PrometheusAPI, path: str, params: Mapping[str, str]) -> dict[str, Any]:
    """One GET of Prometheus' HTTP API (`bridge.triton.prometheus.PrometheusAPI`): its
    answer, or `InputError` with the client's words."""
    try:
        return api.call(path, params)
    except PrometheusError as exc:
        raise InputError(f"prometheus {exc}") from None


def query_range(
    url: str,
    query: str,
    start: datetime,
    end: datetime,
    step_s: float,
    *,
    timeout_s: float = QUERY_TIMEOUT_S,
) -> dict[str, Any]:
    """`GET /api/v1/query_range` of the Prometheus server at `url` over [start, end] at
    `step_s`, in requests of at most MAX_POINTS steps each, merged into one answer of the
    API's own shape (status, data.resultType matrix, data.result; warnings if any): what
    `arrivals_from_prometheus` reads, and what a saved answer holds. Raises `InputError`
    for a server that does not answer or answers an error (quoted), or not a matrix."""
    base = base_url(url)
    positive("step_s", step_s)
    lo, hi = aware(start, "start").timestamp(), aware(end, "end").timestamp()
    if hi <= lo:
        raise InputError(f"prometheus query: the window ends ({iso(hi)}) before it starts")
    merged: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    warnings: list[Any] = []
    span = step_s * MAX_POINTS
    with PrometheusAPI(base, timeout_s, MAX_ANSWER_BYTES) as api:
        k = 0
        while (a := lo + k * span) <= hi:
            k += 1
            b = min(hi, a + span - step_s)
            params = {"query": query, "start": f"{a:.3f}", "end": f"{b:.3f}", "step": f"{step_s:g}"}
            doc = _get(api, "/api/v1/query_range", params)
            data = doc.get("data")
            if not isinstance(data, dict) or data.get("resultType") != "matrix":
                raise InputError(
                    f"prometheus {shown_url(base)}: the answer to {query!r} is not a range "
                    f"(matrix): {str(data)[:200]}"
                )
            for item in data.get("result") or []:
                if not isinstance(item, dict) or not isinstance(item.get("metric", {}), dict):
                    raise InputError(f"prometheus {shown_url(base)}: a series {str(item)[:200]}")
                metric = item.get("metric") or {}
                key = tuple(sorted((str(n), str(v)) for n, v in metric.items()))
                entry = merged.setdefault(key, {"metric": metric, "values": []})
                entry["values"].extend(item.get("values") or [])
            warnings += doc.get("warnings") or []
    answer: dict[str, Any] = {
        "status": "success",
        "data": {"resultType": "matrix", "result": list(merged.values())},
    }
    if warnings:
        answer["warnings"] = warnings
    return answer


def query_instant(
    url: str, query: str, at: datetime, *, timeout_s: float = QUERY_TIMEOUT_S
) -> dict[str, Any]:
    """`GET /api/v1/query` at time `at`: the answer, as `query_range` gives its own."""
    base = base_url(url)
    params = {"query": query, "time": f"{aware(at, 'time').timestamp():.3f}"}
    with PrometheusAPI(base, timeout_s, MAX_ANSWER_BYTES) as api:
        return _get(api, "/api/v1/query", params)


def answer_result(doc: Any, where: str, kind: str) -> list[Any]:
    """The `data.result` list of an answer of Prometheus' API whose resultType is `kind`."""
    if not isinstance(doc, dict):
        raise InputError(f"{where}: not an answer of Prometheus' API (a JSON object)")
    if doc.get("status") != "success":
        said = doc.get("error", doc.get("status"))
        raise InputError(f"{where}: Prometheus answered {doc.get('errorType', 'an error')}: {said}")
    data = doc.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise InputError(f"{where}: no data.result list (an answer of Prometheus' API?)")
    if data.get("resultType") != kind:
        which = {"matrix": "a range query's (/api/v1/query_range)", "vector": "an instant query's"}
        raise InputError(
            f"{where}: resultType {data.get('resultType')!r}, not {kind!r}: give "
            f"{which.get(kind, kind)} answer"
        )
    result: list[Any] = data["result"]
    if not result:
        raise InputError(f"{where}: no series: the query matched nothing")
    return result


def labels_text(metric: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items())) + "}"


def model_label(item: Any, i: int, label: str, where: str) -> tuple[str, Mapping[str, Any]]:
    metric = item.get("metric") if isinstance(item, dict) else None
    if not isinstance(metric, dict):
        raise InputError(f"{where}: series {i} has no metric labels (an object)")
    model = metric.get(label)
    if not isinstance(model, str) or not model:
        raise InputError(
            f"{where}: series {i} {labels_text(metric)} has no {label!r} label: keep it in the "
            f"query (sum by ({label}) (...))"
        )
    return model, metric


def prometheus_samples(doc: Any, *, where: str, label: str = "model") -> list[Samples]:
    """The series of a range query's answer (Prometheus' API: values as [time, "value"]
    pairs), each with its `label`'s value as its model. Refuses an error answer (quoted),
    another shape, no series, a series without the label, a sample that is not a pair of
    a time and a rate, and samples out of time order, naming the series and sample."""
    out = []
    for i, item in enumerate(answer_result(doc, where, "matrix")):
        model, metric = model_label(item, i, label, where)
        values = item.get("values")
        if not isinstance(values, list):
            raise InputError(f"{where}: series {i} {labels_text(metric)} has no values list")
        times: list[float] = []
        rates: list[float] = []
        for k, pair in enumerate(values):
            try:
                if not isinstance(pair, list | tuple) or len(pair) != 2:
                    raise TypeError
                t, v = pair
                if isinstance(t, bool) or isinstance(v, bool):
                    raise TypeError
                times.append(float(t))
                rates.append(float(v))
            except (TypeError, ValueError):
                raise InputError(
                    f"{where}: series {i} {labels_text(metric)}: sample {k} {pair!r} is not "
                    '[time, "value"]'
                ) from None
        out.append(checked(model, f"{i} {labels_text(metric)}", times, rates, where))
    return out


def arrivals_from_prometheus(
    answer_doc: Mapping[str, Any] | Path,
    *,
    start: datetime | None,
    step_s: float,
    label: str = "model",
    scale: float = 1.0,
    end: datetime | None = None,
    max_gap_s: float = MAX_GAP_S,
) -> ArrivalSeries:
    """Per model (each value of `label`), its request rate as Prometheus recorded it:
    an answer of `/api/v1/query_range` (`query_range`'s, or a saved one: a Path), its
    series summed per model and resampled to `step_s` from `start` (None: the first
    sample) to `end` (None: the last sample's step): `resample`, gaps held up to
    `max_gap_s`, longer ones 0 and said. `about` names the source."""
    if isinstance(answer_doc, Path):
        where = f"prometheus answer {answer_doc}"
        doc: Any = read_json(answer_doc, "prometheus answer")
        source = {"source": "prometheus", "file": answer_doc.name}
    else:
        where, doc, source = "the prometheus answer", answer_doc, {"source": "prometheus"}
    series = resample(
        prometheus_samples(doc, where=where, label=label),
        start=start,
        end=end,
        step_s=step_s,
        scale=scale,
        max_gap_s=max_gap_s,
        where=where,
    )
    return replace(series, about={**source, "label": label, **series.about})
