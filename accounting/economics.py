"""Unit economics per served model and model version: what a request cost in GPU time and
money over a report window (`unit_economics`, a `Section` beside the report).

Two sources, one window:

- the ledger (`report.build_report`, workload `inference`, grouped by model and team):
  each served model's booked GPU time (a serving job split by Triton's compute time, lent
  nodes' time included) and its cost priced like every report line;
- Triton's stored counters (`serving.window_increases`): compute time and successful
  requests (`nv_inference_request_success`) per model version over the scrape intervals
  that end in the window.

Per model (a row with version "*", then one row per version):

- `requests`: the successful requests counted in the window (None when no interval of it
  had the request counter); `compute_gpu_seconds`: Triton's compute time, seconds (None
  when no scrape interval of it ends in the window);
- `gpu_hours`: the model's ledger GPU time; a version's share is the model's time split in
  proportion to the version's compute time (whole milliseconds, largest remainder, so the
  versions sum to the model); `cost`: the model's priced ledger cost split the same way
  (Decimal, None without rates), shown rounded with `rates.money`;
- `gpu_seconds_per_request` = gpu_hours x 3600 / requests; `cost_per_million_requests` =
  cost / requests x 1e6 (from the unrounded cost, then rounded). A division by zero (or by
  an unknown) is None;
- `loaded_gpu_hours` and `loaded_cost_per_million_requests`: fully loaded, the model's
  time plus its share of the `(unattributed)` time of each serving job it ran in (the
  replica's GPU time no model computed on: the price of keeping a replica warm), shared
  among the job's models in proportion to their time. What finance charges back per
  request is the loaded figure; the plain one is what the requests themselves took.

An LLM's token counters (`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, or
the TensorRT-LLM backend's, stored with each scrape) add, for a model or version that
counted tokens in the window:

- `input_tokens`, `output_tokens`: prompt and generated tokens counted in the window
  (None when no interval of it had the counter);
- `cost_per_million_input_tokens` = cost / input_tokens x 1e6 and
  `cost_per_million_output_tokens` = cost / output_tokens x 1e6, and the same of the
  loaded cost (`loaded_cost_per_million_*_tokens`). Each divides the whole cost by one
  count (what a million tokens of that kind cost with the rest of the work they came
  with): the two are not parts of the cost and do not add up. Over a window whose
  scrapes cover the serving job, `cost_per_million_output_tokens` is the ledger's
  GPU-hours x rate / the generated-token counter's increase.

The token columns are in the section only when some model counted tokens in the window.

The serving jobs' `(unattributed)` time (GPU time no model computed on) is in no model's
plain cost: a note gives it (with a team filter, that team's serving jobs' only). Filters model,
version and team select rows after the figures are computed, so a model's numbers are
the same with and without them; a cluster filter, like the `cluster` argument, narrows
both sources first. The ledger splits by compute
within each hour while the counters are read per scrape interval, so at the window's edges
the two can differ by up to one scrape interval.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine

from accounting.buckets import MS_PER_HOUR, largest_remainder
from accounting.errors import WindowError
from accounting.rates import RateBook, money
from accounting.report import Line, Report, Window, build_report
from accounting.schema import UNATTRIBUTED
from accounting.section import Section
from accounting.serving import Increase, window_increases

KEY = "unit_economics"
TITLE = "Unit economics per model and version"
COLUMNS = (
    "model", "version", "team", "requests", "compute_gpu_seconds", "gpu_hours",
    "gpu_seconds_per_request", "cost", "cost_per_million_requests", "loaded_gpu_hours",
    "loaded_cost_per_million_requests",
)  # fmt: skip
#: the columns an LLM's token counters add (after `COLUMNS`, when some model counted tokens)
TOKEN_COLUMNS = (
    "input_tokens", "output_tokens", "cost_per_million_input_tokens",
    "cost_per_million_output_tokens", "loaded_cost_per_million_input_tokens",
    "loaded_cost_per_million_output_tokens",
)  # fmt: skip
#: the version column of a model's whole row
ALL_VERSIONS = "*"
#: the filters `unit_economics` takes
FILTER_KEYS = ("model", "version", "team", "cluster")
_MILLION = Decimal(1_000_000)
TOKENS_NOTE = (
    "input_tokens, output_tokens: an LLM's prompt and generated tokens "
    "(vllm:prompt_tokens_total, vllm:generation_tokens_total or the TensorRT-LLM backend's) "
    "over the same scrape intervals; cost per million input (output) tokens: the whole cost "
    "over that one count (the two do not add up)"
)


@dataclass
class _Counted:
    """Triton's counters for one model version over the window."""

    compute_us: float = 0.0
    requests: float = 0.0
    #: intervals with / without the request counter
    with_requests: int = 0
    without_requests: int = 0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    #: intervals with / without the token counters (both: a backend reports the two
    #: together; one without the other counts as without)
    with_tokens: int = 0
    without_tokens: int = 0

    def add(self, other: _Counted) -> None:
        self.compute_us += other.compute_us
        self.requests += other.requests
        self.with_requests += other.with_requests
        self.without_requests += other.without_requests
        self.prompt_tokens += other.prompt_tokens
        self.generation_tokens += other.generation_tokens
        self.with_tokens += other.with_tokens
        self.without_tokens += other.without_tokens

    def count(self, inc: Increase) -> None:
        """Add one scrape interval's increase."""
        self.compute_us += inc.compute_us
        if inc.requests is None:
            self.without_requests += 1
        else:
            self.requests += inc.requests
            self.with_requests += 1
        if inc.prompt_tokens is None or inc.generation_tokens is None:
            self.without_tokens += 1
        else:
            self.prompt_tokens += inc.prompt_tokens
            self.generation_tokens += inc.generation_tokens
            self.with_tokens += 1

    @property
    def intervals(self) -> int:
        return self.with_requests + self.without_requests

    @property
    def request_count(self) -> int | None:
        return round(self.requests) if self.with_requests else None

    @property
    def token_counts(self) -> tuple[int, int] | None:
        """(input, output) tokens, or None where no interval had the token counters."""
        if not self.with_tokens:
            return None
        return round(self.prompt_tokens), round(self.generation_tokens)


@dataclass
class _Booked:
    """The ledger's GPU time and cost of one model (or of the unattributed rest)."""

    gpu_ms: int = 0
    cost: Decimal | None = None
    teams: set[str] = field(default_factory=set)
    #: with its share of its serving jobs' unattributed time (the fully loaded figures)
    loaded_ms: float = 0.0
    loaded_cost: Decimal | None = None


def unit_economics(
    engine: Engine,
    window: Window,
    rates: RateBook | None,
    cluster: str | None = None,
    filters: Mapping[str, str] | None = None,
) -> Section:
    """The unit economics section over `window` (see the module docstring)."""
    filters = dict(filters or {})
    bad = sorted(set(filters) - set(FILTER_KEYS))
    if bad:
        raise WindowError(
            f"unit economics cannot filter by {', '.join(bad)}; "
            f"choose from {', '.join(FILTER_KEYS)}"
        )
    if "cluster" in filters:
        if cluster is not None and filters["cluster"] != cluster:
            raise WindowError(f"cluster {cluster!r} and filter cluster={filters['cluster']!r}")
        cluster = filters["cluster"]
    priced = bool(rates)

    # The ledger: each model's GPU time and cost (unrounded), and the unattributed rest.
    ledger_filters = {"workload": "inference", **({"cluster": cluster} if cluster else {})}
    report = build_report(
        engine, window, ("source", "model", "team"), rates=rates if priced else None,
        filters=ledger_filters,
    )  # fmt: skip
    booked: dict[str, _Booked] = defaultdict(lambda: _Booked(cost=Decimal(0) if priced else None))
    # The unattributed rest: of the filter's team's serving jobs when there is one.
    rest = _Booked(cost=Decimal(0) if priced else None)
    jobs: dict[str, list[Line]] = defaultdict(list)
    for line in report.lines:
        model, team = line.keys["model"], line.keys["team"]
        jobs[line.keys["source"]].append(line)
        if model == UNATTRIBUTED and filters.get("team", team) != team:
            continue
        b = rest if model == UNATTRIBUTED else booked[model]
        b.gpu_ms += line.gpu_ms
        b.teams.add(team)
        if b.cost is not None and line.cost is not None:
            b.cost += line.cost
    _load(booked, jobs, priced)

    # The counters: compute time and requests per model version.
    counted: dict[str, dict[str, _Counted]] = defaultdict(lambda: defaultdict(_Counted))
    for inc in window_increases(engine, window.start, window.end, cluster):
        counted[inc.model][inc.version].count(inc)

    rows: list[dict[str, Any]] = []
    uncounted: list[str] = []
    unbooked: list[str] = []
    partial: list[str] = []
    partial_tokens: list[str] = []
    for model in sorted(set(booked) | set(counted)):
        b = booked.get(model) or _Booked(cost=Decimal(0) if priced else None)
        versions = {v: c for v, c in sorted(counted.get(model, {}).items())}
        whole = _Counted()
        for c in versions.values():
            whole.add(c)
        team = ", ".join(sorted(b.teams))
        if b.gpu_ms and whole.compute_us <= 0:
            uncounted.append(model)
        if whole.compute_us > 0 and not b.gpu_ms:
            unbooked.append(model)
        partial += [
            f"{model} {v or '(no version)'}"
            for v, c in versions.items()
            if c.with_requests and c.without_requests
        ]
        partial_tokens += [
            f"{model} {v or '(no version)'}"
            for v, c in versions.items()
            if c.with_tokens and c.without_tokens
        ]
        rows.append(
            _row(model, ALL_VERSIONS, team, whole, b.gpu_ms, b.cost, b.loaded_ms, b.loaded_cost)
        )
        shares = largest_remainder(b.gpu_ms, [c.compute_us for c in versions.values()])
        for (version, c), ms in zip(versions.items(), shares, strict=True):
            part = None if b.cost is None else _split(b.cost, ms, b.gpu_ms)
            f = ms / b.gpu_ms if b.gpu_ms else 0.0
            loaded_cost = None if b.loaded_cost is None else _split(b.loaded_cost, ms, b.gpu_ms)
            rows.append(_row(model, version, team, c, ms, part, b.loaded_ms * f, loaded_cost))

    rows = [r for r in rows if _selected(r, filters)]
    tokens = any(r["output_tokens"] is not None for r in rows)
    columns = COLUMNS + TOKEN_COLUMNS if tokens else COLUMNS
    notes = _notes(report, rest, filters.get("team"), uncounted, unbooked, partial)
    if tokens:
        notes.insert(1, TOKENS_NOTE)
    if partial_tokens:
        notes.append(
            "tokens undercounted, some scrapes lacked the token counters: "
            + ", ".join(partial_tokens)
        )
    return Section(KEY, TITLE, columns, rows, notes)


def _load(booked: Mapping[str, _Booked], jobs: Mapping[str, list[Line]], priced: bool) -> None:
    """Each model's fully loaded time and cost: its own, plus the unattributed time of each
    serving job it ran in, shared among that job's models in proportion to their time (a
    job where no model computed keeps its time unattributed)."""
    for b in booked.values():
        b.loaded_ms = float(b.gpu_ms)
        b.loaded_cost = b.cost
    for lines in jobs.values():
        spare = [li for li in lines if li.keys["model"] == UNATTRIBUTED]
        own = [li for li in lines if li.keys["model"] != UNATTRIBUTED and li.gpu_ms > 0]
        total = sum(li.gpu_ms for li in own)
        if not spare or not total:
            continue
        spare_ms = sum(li.gpu_ms for li in spare)
        spare_cost = sum((li.cost or Decimal(0) for li in spare), Decimal(0))
        for li in own:
            m = booked.get(li.keys["model"])
            if m is None:
                continue
            m.loaded_ms += spare_ms * li.gpu_ms / total
            if priced and m.loaded_cost is not None:
                m.loaded_cost += spare_cost * Decimal(li.gpu_ms) / Decimal(total)


def _split(cost: Decimal, ms: int, total_ms: int) -> Decimal:
    return cost * Decimal(ms) / Decimal(total_ms) if total_ms else Decimal(0)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _per_million(cost: Decimal | None, count: int | None) -> Decimal | None:
    """cost / count x 1e6 from the unrounded cost, then rounded; None without a cost or
    a count (zero included)."""
    if cost is None or not count:
        return None
    return money(cost / Decimal(count) * _MILLION)


def _row(
    model: str,
    version: str,
    team: str,
    c: _Counted,
    gpu_ms: int,
    cost: Decimal | None,
    loaded_ms: float,
    loaded_cost: Decimal | None,
) -> dict[str, Any]:
    requests = c.request_count
    gpu_s = gpu_ms / 1000
    compute_s = c.compute_us / 1e6 if c.intervals else None
    tokens_in, tokens_out = c.token_counts or (None, None)
    return {
        "model": model,
        "version": version,
        "team": team,
        "requests": requests,
        "compute_gpu_seconds": None if compute_s is None else round(compute_s, 6),
        "gpu_hours": round(gpu_ms / MS_PER_HOUR, 6),
        "gpu_seconds_per_request": _ratio(gpu_s, requests),
        "cost": None if cost is None else money(cost),
        "cost_per_million_requests": _per_million(cost, requests),
        "loaded_gpu_hours": round(loaded_ms / MS_PER_HOUR, 6),
        "loaded_cost_per_million_requests": _per_million(loaded_cost, requests),
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "cost_per_million_input_tokens": _per_million(cost, tokens_in),
        "cost_per_million_output_tokens": _per_million(cost, tokens_out),
        "loaded_cost_per_million_input_tokens": _per_million(loaded_cost, tokens_in),
        "loaded_cost_per_million_output_tokens": _per_million(loaded_cost, tokens_out),
    }


def _selected(row: Mapping[str, Any], filters: Mapping[str, str]) -> bool:
    for key, value in filters.items():
        if key == "team":
            if value not in row["team"].split(", "):
                return False
        elif key in ("model", "version") and row[key] != value:
            return False
    return True


def _notes(
    report: Report,
    rest: _Booked,
    team: str | None,
    uncounted: list[str],
    unbooked: list[str],
    partial: list[str],
) -> list[str]:
    notes = [
        "requests: Triton's successful requests (nv_inference_request_success) over the "
        "scrape intervals ending in the window; gpu_hours: the model's serving time in the "
        "ledger (lent nodes' included), a version's share in proportion to its compute time",
        f'version "{ALL_VERSIONS}": the model as a whole',
    ]
    if report.currency is None:
        notes.append("no rates defined: GPU-hours only")
    if rest.gpu_ms:
        whose = f"team {team}'s serving jobs'" if team is not None else "serving jobs'"
        priced = f" ({money(rest.cost)} {report.currency})" if rest.cost is not None else ""
        notes.append(
            f"{whose} {UNATTRIBUTED} time, GPU time no model computed on: "
            f"{rest.gpu_ms / MS_PER_HOUR:,.3f} GPU-hours{priced}; in no model's cost"
        )
    if uncounted:
        notes.append(
            "GPU time but no Triton counters in the window (no requests, no version split): "
            + ", ".join(uncounted)
        )
    if unbooked:
        notes.append(
            "Triton counters but no GPU time in the ledger for the window (serving job not "
            "ingested yet?): " + ", ".join(unbooked)
        )
    if partial:
        notes.append(
            "requests undercounted, some scrapes lacked the request counter: " + ", ".join(partial)
        )
    if not report.lines:
        notes.append("the ledger has no serving rows in this window")
    return notes
