"""Parse one Triton instance's Prometheus page into immutable per-(model, version) samples.

Called by the daemon's observe step on each scraped page (and by bench/observe.py); its
output feeds `bridge.triton.signal`. Parsing is prometheus_client's own
(`text_string_to_metric_families`); this module only picks Triton's per-model families,
and hands the parser only their lines (see `_relevant`: parsing is most of a tick's cost).

No value is invented: a counter or gauge that is absent, NaN, infinite or negative is None;
a quantile Triton did not emit, or emitted as NaN (its summaries say "Nan" when the 60 s
window holds no request), is absent from `Summary.quantiles`. A page the parser rejects
(or an empty one) gives a `MetricsPage` with no models and `error` set, never an exception:
to the signal, garbage is "no data". One bad line spoils the whole page (a corrupt page is
never half-used); the error names its line number, quotes it and the parser's complaint.
Lines of `nv_` families the signal does not read are dropped unparsed (see `_relevant`), so
garbage there spoils nothing. The page's size is bounded where it is fetched
(`bridge.triton.client.MAX_METRICS_BYTES`).

Triton 2.51 emits (with `--metrics-config summary_latencies=true`):
counters `nv_inference_request_success`, `nv_inference_request_failure` (one series per
`reason`: summed here), `nv_inference_count`, `nv_inference_exec_count`, and cumulative
microseconds `nv_inference_{request,queue}_duration_us`,
`nv_inference_compute_{input,infer,output}_duration_us`; gauge
`nv_inference_pending_request_count`; summaries `nv_inference_request_summary_us` and
`nv_inference_queue_summary_us` with quantiles 0.5, 0.9, 0.95, 0.99 and 0.999. Series of one
(model, version) that differ in other labels (`reason`, or `gpu_uuid` on GPU servers) are
added; for summary quantiles, where adding is meaningless, the largest is kept.

An LLM's token families (Triton's vLLM backend, the TensorRT-LLM backend, Triton's
first-response histogram) are read by `bridge.triton.llm_metrics` into `ModelSample.llm`
(None for a model with none of them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from bridge.triton import llm_metrics
from bridge.triton.llm_metrics import LlmSample, ModelKey

COUNTERS: Mapping[str, str] = {
    "nv_inference_request_success": "request_success",
    "nv_inference_request_failure": "request_failure",
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "exec_count",
    "nv_inference_request_duration_us": "request_duration_us",
    "nv_inference_queue_duration_us": "queue_duration_us",
    "nv_inference_compute_input_duration_us": "compute_input_duration_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_duration_us",
    "nv_inference_compute_output_duration_us": "compute_output_duration_us",
}
"""Triton counter family -> `ModelSample` field."""

PENDING = "nv_inference_pending_request_count"
SUMMARIES: Mapping[str, str] = {
    "nv_inference_request_summary_us": "request_summary",
    "nv_inference_queue_summary_us": "queue_summary",
}
"""Triton summary family -> `ModelSample` field."""

_WANTED = frozenset(
    [*COUNTERS, *(f"{c}_total" for c in COUNTERS), *(f"{c}_created" for c in COUNTERS), PENDING]
    + [f"{s}{suffix}" for s in SUMMARIES for suffix in ("", "_count", "_sum", "_created")]
    + list(llm_metrics.LINE_NAMES)
)


@dataclass(frozen=True, slots=True)
class Summary:
    """A latency summary in microseconds: observation count and sum (cumulative, None if
    invalid) and the quantiles Triton emitted with a finite value, as (q, value) pairs
    sorted by q. Triton computes them over a sliding window (60 s), not since start."""

    count: float | None
    sum_us: float | None
    quantiles: tuple[tuple[float, float], ...]

    def quantile(self, q: float) -> float | None:
        """The value at quantile q, or None if Triton did not emit it (or emitted NaN)."""
        for qq, v in self.quantiles:
            if qq == q:
                return v
        return None


@dataclass(frozen=True, slots=True)
class ModelSample:
    """One (model, version) on one instance at one scrape. Counters are cumulative since
    the model was loaded; None means absent or invalid on the page, never zero."""

    model: str
    version: str
    request_success: float | None = None
    request_failure: float | None = None
    inference_count: float | None = None
    exec_count: float | None = None
    request_duration_us: float | None = None
    queue_duration_us: float | None = None
    compute_input_duration_us: float | None = None
    compute_infer_duration_us: float | None = None
    compute_output_duration_us: float | None = None
    pending_requests: float | None = None
    request_summary: Summary | None = None
    queue_summary: Summary | None = None
    #: an LLM's token metrics (`bridge.triton.llm_metrics`); None: the page has none
    llm: LlmSample | None = None


@dataclass(frozen=True, slots=True)
class MetricsPage:
    """One parsed page: its models (read-only mapping) and, if it did not parse, why."""

    models: Mapping[ModelKey, ModelSample]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


_INVALID = float("nan")  # marks a field seen with an invalid value: it stays None


def _valid(v: float) -> bool:
    return math.isfinite(v) and v >= 0


class _SummaryAcc:
    __slots__ = ("count", "quantiles", "sum")

    def __init__(self) -> None:
        self.count: float | None = None
        self.sum: float | None = None
        self.quantiles: dict[float, float] = {}

    def freeze(self) -> Summary:
        return Summary(
            count=_field(self.count),
            sum_us=_field(self.sum),
            quantiles=tuple(sorted(self.quantiles.items())),
        )


def _add(old: float | None, v: float) -> float:
    """Sum series; one invalid series makes the whole field invalid (NaN)."""
    if not _valid(v):
        return _INVALID
    return float(v) if old is None else old + v


def _field(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else v


def parse_page(text: str) -> MetricsPage:
    """Parse a Triton metrics page. Never raises on bad text: see the module docstring."""
    if not text.strip():
        return MetricsPage(MappingProxyType({}), error="empty page")
    fields: dict[ModelKey, dict[str, float]] = {}
    summaries: dict[tuple[ModelKey, str], _SummaryAcc] = {}
    llm = llm_metrics.LlmAccumulator()
    try:
        for family in text_string_to_metric_families(_relevant(text)):
            name = family.name
            if llm_metrics.wants(name):
                llm.take(family, _key)
                continue
            counter = COUNTERS.get(name)
            if counter is not None or name == PENDING:
                target = counter or "pending_requests"
                for s in family.samples:
                    key = _key(s.labels)
                    if key is None or s.name.endswith("_created"):
                        continue
                    acc = fields.setdefault(key, {})
                    acc[target] = _add(acc.get(target), s.value)
                continue
            summary = SUMMARIES.get(name)
            if summary is None:
                continue
            for s in family.samples:
                key = _key(s.labels)
                if key is None:
                    continue
                fields.setdefault(key, {})
                sacc = summaries.get((key, summary))
                if sacc is None:
                    sacc = summaries[(key, summary)] = _SummaryAcc()
                _summary_sample(sacc, name, s.name, s.labels, s.value)
    except (ValueError, IndexError, KeyError, TypeError) as e:
        # prometheus_client raises ValueError on malformed text (the others defensively).
        return MetricsPage(MappingProxyType({}), error=_unparseable(text, e))
    tokens = llm.freeze()
    for key in tokens:
        fields.setdefault(key, {})
    models: dict[ModelKey, ModelSample] = {}
    for key, acc in fields.items():
        values = {f: _field(v) for f, v in acc.items()}
        req = summaries.get((key, "request_summary"))
        que = summaries.get((key, "queue_summary"))
        models[key] = ModelSample(
            key[0],
            key[1],
            request_summary=req.freeze() if req else None,
            queue_summary=que.freeze() if que else None,
            llm=tokens.get(key),
            **values,
        )
    return MetricsPage(MappingProxyType(models))


def _relevant(text: str) -> str:
    """The page without the lines of Triton families this module does not read.

    Parsing is most of the cost of a tick, and a Triton page spends over 40% of its lines on
    families the signal ignores (the compute summaries, CPU, memory, pinned pool). Only
    lines naming an `nv_` family outside `_WANTED` are dropped; anything else, garbage
    included, still goes to the parser, so a malformed page is still an error.
    """
    return "\n".join(line for line in text.split("\n") if _kept(line))


def _kept(line: str) -> bool:
    """Whether `_relevant` keeps the line: it names no `nv_` family, or a wanted one."""
    if line.startswith("nv_"):
        end = line.find("{")
        return line[: end if end >= 0 else line.find(" ")] in _WANTED
    if line.startswith(("# HELP nv_", "# TYPE nv_")):
        return line[7 : line.find(" ", 7)] in _WANTED
    return True


def _unparseable(text: str, error: Exception) -> str:
    """Why the page was refused: the first line the parser refuses on its own (its number
    on the page, the line quoted, the parser's words). Only called on a refused page: the
    parser's errors name no line, and each of them comes from one line alone."""
    for number, line in enumerate(text.split("\n"), 1):
        if not _kept(line):
            continue
        try:
            for _ in text_string_to_metric_families(line):
                pass
        except (ValueError, IndexError, KeyError, TypeError) as e:
            return f"unparseable page: line {number} {line[:120]!r}: {str(e) or type(e).__name__}"
    return f"unparseable page ({error}): {text[:120]!r}"


def _key(labels: Mapping[str, str]) -> ModelKey | None:
    model = labels.get("model")
    return None if model is None else (model, labels.get("version", ""))


def _summary_sample(
    acc: _SummaryAcc, family: str, sample: str, labels: Mapping[str, str], value: float
) -> None:
    if sample == family:
        try:
            q = float(labels["quantile"])
        except (KeyError, ValueError):
            return
        if _valid(value) and 0 <= q <= 1:
            acc.quantiles[q] = max(float(value), acc.quantiles.get(q, value))
    elif sample == family + "_count":
        acc.count = _add(acc.count, value)
    elif sample == family + "_sum":
        acc.sum = _add(acc.sum, value)
