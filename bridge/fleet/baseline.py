"""The figures taken at each switch of the fleet's mode (`stb fleet mode`), over the window
before it: what the site's training saw (from Slurm's accounting) and what its inference
saw (from Prometheus), so that `stb fleet report` sets each mode's period beside the one
before it.

- Training, per lendable pool (its partition), from `sacct` through the Slurm adapter:
  the runs that started in the window and are not the bridge's own (Triton or staging
  jobs): how many and their GPU-hours within the window (also per hour: the training
  throughput, which periods of different lengths compare by), the mean and 95th percentile of
  their queue wait (start less eligible time, else submit), and how many were requeued
  or preempted.
- Inference, per model, from Prometheus (the Triton servers' series, `job="triton"`):
  the typical and the worst p99 of the window (the median and the maximum of Triton's
  own p99 summary, sampled each 30 s), requests and failed requests, and an LLM's TTFT
  p99 (`vllm:time_to_first_token_seconds`). Where Prometheus does not answer, the
  inference part says why and the switch is still made.

`measure` is the one entry; `compare` sets two baselines side by side (pure)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from bridge.cli_text import first_line
from bridge.config import BridgeConfig
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import STAGING_TAG, TRITON_TAG, AccountingRecord
from bridge.slurm.protocol import SlurmProtocol
from bridge.triton.prometheus import PrometheusError, PrometheusSignal

#: the default window before a switch the figures cover
DEFAULT_WINDOW_S = 24 * 3600.0
#: how often the window's p99 is sampled (a subquery's step)
SAMPLE = "30s"


def training(
    records: Iterable[AccountingRecord],
    partitions: Mapping[str, str],
    start: datetime,
    end: datetime,
) -> dict[str, dict[str, float | int | None]]:
    """Per pool (`partitions`: partition -> pool), the figures of the runs in `records`
    that started within [start, end) and are not the bridge's. Pure."""
    waits: dict[str, list[float]] = {pool: [] for pool in partitions.values()}
    gpu_s: dict[str, float] = dict.fromkeys(waits, 0.0)
    requeued: dict[str, int] = dict.fromkeys(waits, 0)
    for r in records:
        pool = partitions.get(r.partition)
        if pool is None or r.start is None or not start <= r.start < end:
            continue
        if TRITON_TAG in r.comment or STAGING_TAG in r.comment:
            continue
        queued_from = r.eligible or r.submit
        waits[pool].append(
            max(0.0, (r.start - queued_from).total_seconds()) if queued_from else 0.0
        )
        until = min(r.end or end, end)
        gpu_s[pool] += max(0.0, (until - r.start).total_seconds()) * r.gpus
        if r.state.upper().startswith(("REQUEUE", "PREEMPT")):
            requeued[pool] += 1
    hours = max(1e-9, (end - start).total_seconds() / 3600.0)
    return {
        pool: {
            "jobs": len(w),
            "gpu_hours": round(gpu_s[pool] / 3600.0, 3),
            # (per hour: periods of different lengths compare by these)
            "jobs_per_h": round(len(w) / hours, 3),
            "gpu_hours_per_h": round(gpu_s[pool] / 3600.0 / hours, 3),
            "wait_mean_s": round(sum(w) / len(w), 1) if w else None,
            "wait_p95_s": round(_quantile(w, 0.95), 1) if w else None,
            "requeued": requeued[pool],
        }
        for pool, w in waits.items()
    }


def _quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def inference_queries(window_s: float) -> dict[str, str]:
    """The instant queries of the inference figures over the `window_s` before their
    time, each by model."""
    w = f"{max(1, int(window_s))}s"
    p99 = 'max by (model) (nv_inference_request_summary_us{job="triton", quantile="0.99"} >= 0)'
    return {
        "p99_ms_typical": f"quantile_over_time(0.5, ({p99})[{w}:{SAMPLE}]) / 1000",
        "p99_ms_worst": f"max_over_time(({p99})[{w}:{SAMPLE}]) / 1000",
        "requests": f'sum by (model) (increase(nv_inference_request_success{{job="triton"}}[{w}]))',
        "failed": f'sum by (model) (increase(nv_inference_request_failure{{job="triton"}}[{w}]))',
        "ttft_p99_ms": "1000 * histogram_quantile(0.99, sum by (model, le) (increase("
        f'vllm:time_to_first_token_seconds_bucket{{job="triton"}}[{w}])))',
    }


def inference(signal: PrometheusSignal, at: datetime, window_s: float) -> dict[str, Any]:
    """Per model, the inference figures of the `window_s` before `at`; PrometheusError
    when Prometheus does not answer."""
    out: dict[str, dict[str, float | None]] = {}
    for name, query in inference_queries(window_s).items():
        for labels, value in signal.instant(query, at.timestamp()):
            model = labels.get("model")
            if model:
                v = None if value is None else round(value, 3)
                out.setdefault(model, {})[name] = v
    return out


def measure(
    config: BridgeConfig,
    slurm: SlurmProtocol | None,
    at: datetime,
    window_s: float = DEFAULT_WINDOW_S,
) -> dict[str, Any]:
    """The baseline of a switch at `at`: the training and inference figures of the
    `window_s` before it, each part with the error that kept it out instead."""
    start = at - timedelta(seconds=window_s)
    doc: dict[str, Any] = {"at": at.isoformat(), "window_s": window_s}
    partitions = {
        pool.partition: name
        for name, pool in config.pools.items()
        if pool.lend_mode in ("preempt", "drain")
    }
    if slurm is None:
        doc["training_error"] = "no Slurm backend"
    else:
        try:
            doc["training"] = training(slurm.accounting(start, at), partitions, start, at)
        except SlurmError as exc:
            doc["training_error"] = f"sacct: {first_line(exc)}"
    url = config.observe.prometheus_url
    signal = PrometheusSignal(url)
    try:
        doc["inference"] = inference(signal, at, window_s)
    except PrometheusError as exc:
        doc["inference_error"] = f"Prometheus: {first_line(exc)}"
    finally:
        signal.close()
    return doc


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per figure both baselines hold (training per pool, inference per model):
    its value before, after, and after / before where both are numbers and before is
    not 0. Pure."""
    rows: list[dict[str, Any]] = []
    for part in ("training", "inference"):
        a, b = before.get(part) or {}, after.get(part) or {}
        for key in sorted(set(a) & set(b)):
            for figure in sorted(set(a[key]) & set(b[key])):
                x, y = a[key][figure], b[key][figure]
                ratio = round(y / x, 3) if _number(x) and _number(y) and x else None
                rows.append(
                    {
                        "part": part,
                        "of": key,
                        "figure": figure,
                        "before": x,
                        "after": y,
                        "ratio": ratio,
                    }
                )
    return rows


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
