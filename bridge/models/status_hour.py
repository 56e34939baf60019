"""Each version's last hour from the site's Prometheus, for a model's status
(`bridge.models.status.gather`): where `[observe]` names a Prometheus (`source =
"prometheus"`, or a `prometheus_url` set: `prometheus_url`), three instant queries as of
`now` through the bridge's own client and timeout
(`bridge.triton.prometheus.PrometheusSignal.instant`), on the raw series Prometheus
scrapes from every Triton server (`job="triton"`, as deploy/prometheus/rules.yml selects
them; its recording rules sum over the versions, so they cannot give a version's
figures): `increase(...[1h])` of the success and failure counters summed per version over
the servers, and `max_over_time` of Triton's p99
(`nv_inference_request_summary_us{quantile="0.99"}`), the highest over the servers
(`last_hour_queries`).

That p99 is the highest of Triton's 60 s p99 windows over the hour: an upper bound of the
hour's p99, not the hour's p99 itself (a summary's quantiles cannot be combined). A
Prometheus that does not answer is a note, never an exception (`last_hour`).
"""

from __future__ import annotations

from datetime import datetime

from bridge.config import ObserveConfig
from bridge.models.status_views import NO_PROMETHEUS, LastHour
from bridge.triton.prometheus import PrometheusError, PrometheusSignal

#: the last-hour window, as PromQL writes it
WINDOW = "1h"


def prometheus_url(observe: ObserveConfig | None) -> str | None:
    """The Prometheus server `[observe]` names: its `prometheus_url` where the signal comes
    from Prometheus or the URL is set (its default alone names none); else None."""
    if observe is None:
        return None
    if observe.source == "prometheus" or "prometheus_url" in observe.model_fields_set:
        return observe.prometheus_url
    return None


def _promql_string(text: str) -> str:
    """`text` inside a PromQL double-quoted string (model names are validated already)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def last_hour_queries(model: str) -> dict[str, str]:
    """The instant queries of `model`'s last hour, per version: successes and failures
    over the hour (summed over the servers), and the highest of Triton's 60 s p99
    windows in it (microseconds), on the series Prometheus scrapes from the Triton servers."""
    sel = f'job="triton",model="{_promql_string(model)}"'

    def increase(counter: str) -> str:
        return f"sum by (version) (increase({counter}{{{sel}}}[{WINDOW}]))"

    return {
        "succeeded": increase("nv_inference_request_success"),
        "failures": increase("nv_inference_request_failure"),
        "p99_us": "max by (version) (max_over_time("
        f'nv_inference_request_summary_us{{{sel},quantile="0.99"}}[{WINDOW}]))',
    }


def last_hour(
    model: str, url: str | None, now: datetime, slo_ms: float | None, *, timeout_s: float = 3.0
) -> tuple[dict[int, LastHour], str]:
    """Each version's last hour as of `now` from the Prometheus at `url`, and the note
    saying the source or why there is none (no Prometheus, or it did not answer: never
    raised)."""
    if not url:
        return {}, NO_PROMETHEUS
    answers: dict[str, dict[int, float | None]] = {}
    signal = PrometheusSignal(url, timeout_s=timeout_s)
    try:
        for what, query in last_hour_queries(model).items():
            series = signal.instant(query, now.timestamp())
            answers[what] = {
                int(labels["version"]): value
                for labels, value in series
                if labels.get("version", "").isdigit()
            }
    except PrometheusError as exc:
        return {}, f"Prometheus did not answer: {exc}"
    finally:
        signal.close()
    out = {}
    ok, bad, p99_us = answers["succeeded"], answers["failures"], answers["p99_us"]
    for v in sorted({*ok, *bad, *p99_us}):
        succeeded, failures = ok.get(v), bad.get(v)
        requests = (
            None if succeeded is None and failures is None else (succeeded or 0) + (failures or 0)
        )
        rate = (failures or 0) / requests if requests else None
        us = p99_us.get(v)
        p99 = None if us is None else us / 1000.0
        out[v] = LastHour(
            requests=_round(requests), succeeded=_round(succeeded), failures=_round(failures),
            failure_rate=rate, p99_ms=p99,
            breach=p99 is not None and slo_ms is not None and p99 > slo_ms,
        )  # fmt: skip
    return out, f"prometheus {signal.url}, {WINDOW} window"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
