"""Reports: GPU-hours and cost over a window, grouped by any of the ledger's keys, with an
optional time step. One data model (`Report`) behind every format (table, CSV, JSON, XLSX,
HTML) and the HTTP endpoint.

How a report is computed: the ledger is summed in SQL at a fine grain (the requested keys
plus what pricing needs: GPU type, pool, QOS, day, workload); each fine line is priced with
the rate in force that day (`rates.RateBook`); idle cost stays its own line (`idle="line"`)
or is shared out within each pool in proportion to use (`idle="shared"`); then filters apply
and the lines are summed to the requested keys. Filtering after pricing means a team's
numbers are the same in a report of all teams and in one of that team alone. A report of
whole days that is not by user, source or hour sums the daily roll-up (`accounting.rollup`)
instead of the hourly rows: the same sums.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy import Engine, case, func, select

from accounting.buckets import MS_PER_HOUR, utc
from accounting.errors import WindowError
from accounting.rates import ROUNDING, RateBook, cost, money
from accounting.rollup import DAYS, usable
from accounting.schema import CAPACITY_WORKLOADS, LedgerRow

LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]
#: the keys a report may group or filter by (the ledger's columns; `user` is user_name)
KEYS = (
    "cluster", "pool", "partition", "workload", "account", "team", "user", "model",
    "gpu_type", "qos", "lease", "source", "lent",
)  # fmt: skip
STEPS = ("hour", "day", "month")
IdleMode = Literal["line", "shared"]
#: the values of the derived key `lent`: a row under a lease (a lent node's serving time,
#: booked to the pool it was lent from) or the pool's own use
LENT, OWN = "lent", "own"
_COLUMN = {k: {"user": "user_name", "lent": "lease"}.get(k, k) for k in KEYS}
_PRICING = ("gpu_type", "pool", "qos", "workload")


@dataclass(frozen=True)
class Window:
    """[start, end) in UTC, on hour boundaries (the ledger is hourly)."""

    start: datetime
    end: datetime
    label: str

    @staticmethod
    def parse(text: str) -> Window:
        """'2026-11' (a month), '2026-11-03' (a day), or 'A..B' with A and B dates or ISO
        times (B exclusive)."""
        t = text.strip()
        if re.fullmatch(r"\d{4}-\d{2}", t):
            start = _dt(t + "-01", text)
            nxt = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
            return Window(start, nxt, t)
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", t):
            start = _dt(t, text)
            return Window(start, start + timedelta(days=1), t)
        if ".." in t:
            a, _, b = t.partition("..")
            start, end = _dt(a, text), _dt(b, text)
            if end <= start:
                raise WindowError(f"window {text!r}: its end is not after its start")
            for edge in (start, end):
                if edge.minute or edge.second or edge.microsecond:
                    raise WindowError(
                        f"window {text!r}: {edge.isoformat()} is not on an hour (the ledger "
                        "is hourly)"
                    )
            return Window(start, end, t)
        raise WindowError(
            f"window {text!r}: expected YYYY-MM, YYYY-MM-DD or START..END (dates or ISO times)"
        )


def _dt(text: str, whole: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise WindowError(f"window {whole!r}: {text!r} is not a date or ISO time") from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else utc(value)


def parse_keys(text: str | Sequence[str]) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    keys = tuple(k.strip() for k in items if k.strip())
    bad = [k for k in keys if k not in KEYS]
    if bad:
        raise WindowError(f"unknown key(s) {', '.join(bad)}; choose from {', '.join(KEYS)}")
    if len(set(keys)) != len(keys):
        raise WindowError(f"a key is named twice in {','.join(keys)}")
    return keys


def parse_filters(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise WindowError(f"filter {item!r}: expected KEY=VALUE")
        parse_keys([key])
        out[key.strip()] = value.strip()
    return out


@dataclass
class Line:
    period: str | None
    keys: dict[str, str]
    gpu_ms: int
    cost: Decimal | None = None
    #: with usage: GPU time in use (measured utilization x allocation) and the allocation
    #: of the jobs that have a usage record
    used_ms: float | None = None
    measured_ms: int | None = None

    @property
    def gpu_hours(self) -> float:
        return self.gpu_ms / MS_PER_HOUR

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.period is not None:
            out["period"] = self.period
        out.update(self.keys)
        out["gpu_hours"] = round(self.gpu_hours, 6)
        out["gpu_ms"] = self.gpu_ms
        if self.cost is not None:
            out["cost"] = str(money(self.cost))
        if self.measured_ms is not None:
            out["measured_gpu_hours"] = round(self.measured_ms / MS_PER_HOUR, 6)
            out["used_gpu_hours"] = round((self.used_ms or 0.0) / MS_PER_HOUR, 6)
        return out


@dataclass
class Report:
    window: Window
    by: tuple[str, ...]
    step: str | None
    idle: IdleMode
    currency: str | None
    filters: dict[str, str]
    lines: list[Line] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: used vs allocated columns (GPU sampler records)
    usage: bool = False

    @property
    def total_gpu_ms(self) -> int:
        return sum(line.gpu_ms for line in self.lines)

    @property
    def total_cost(self) -> Decimal | None:
        if self.currency is None:
            return None
        return sum((line.cost or Decimal(0) for line in self.lines), Decimal(0))

    def columns(self) -> list[str]:
        cols = (["period"] if self.step else []) + list(self.by) + ["gpu_hours"]
        cols += ["cost"] if self.currency else []
        return cols + (["measured_gpu_hours", "used_gpu_hours"] if self.usage else [])

    def as_dict(self) -> dict[str, Any]:
        total: dict[str, Any] = {
            "gpu_hours": round(self.total_gpu_ms / MS_PER_HOUR, 6),
            "gpu_ms": self.total_gpu_ms,
        }
        if self.total_cost is not None:
            total["cost"] = str(money(self.total_cost))
        return {
            "window": {
                "label": self.window.label,
                "start": self.window.start.isoformat(),
                "end": self.window.end.isoformat(),
            },
            "by": list(self.by),
            "step": self.step,
            "filters": self.filters,
            "idle": self.idle,
            "currency": self.currency,
            "rounding": ROUNDING if self.currency else None,
            "lines": [line.as_dict() for line in self.lines],
            "total": total,
            "notes": self.notes,
        }


def _column(table: Any, key: str, *, labelled: bool = True) -> Any:
    """The SQL expression of a report key: a ledger column, or for `lent` whether the row
    came under a lease."""
    if key == "lent":
        lent = case((table.c.lease != "", LENT), else_=OWN)
        return lent.label("lent") if labelled else lent
    return table.c[_COLUMN[key]]


def _period(step: str | None, day: date, bucket: datetime | None, month: str) -> str | None:
    if step is None:
        return None
    if step == "hour":
        assert bucket is not None
        return utc(bucket).isoformat()
    return day.isoformat() if step == "day" else month


def build_report(
    engine: Engine,
    window: Window,
    by: Sequence[str] = ("team", "workload"),
    *,
    step: str | None = None,
    idle: IdleMode = "line",
    rates: RateBook | None = None,
    filters: Mapping[str, str] | None = None,
    usage: Mapping[tuple[str, str], float] | None = None,
    rollup: bool = True,
) -> Report:
    """`usage`: (cluster, job_id) -> utilization (0..1), from `accounting.usage`; adds the
    measured and used GPU-hours of each line. The daily roll-up is read where the report
    allows it (`rollup.usable`; `rollup=False`: always the hourly rows), with the same
    result."""
    by = parse_keys(by)
    filters = dict(filters or {})
    parse_keys(list(filters))
    if step is not None and step not in STEPS:
        raise WindowError(f"unknown step {step!r}; choose from {', '.join(STEPS)}")
    if idle not in ("line", "shared"):
        raise WindowError(f"unknown idle mode {idle!r}; choose line or shared")
    priced = bool(rates)
    fine = list(
        dict.fromkeys([*by, *filters, *_PRICING, *(["source"] if usage is not None else [])])
    )
    table: Any
    if rollup and usage is None and usable([_COLUMN[k] for k in fine], step, window):
        table = DAYS
        cols = [_column(DAYS, k) for k in fine] + [DAYS.c.day, DAYS.c.month]
        q = (
            select(*cols, func.sum(DAYS.c.gpu_ms))
            .where(DAYS.c.day >= utc(window.start).date(), DAYS.c.day < utc(window.end).date())
            .group_by(*cols)
        )
    else:
        table = LEDGER
        cols = [_column(LEDGER, k) for k in fine] + [LEDGER.c.day, LEDGER.c.month]
        if step == "hour":
            cols.append(LEDGER.c.bucket)
        q = (
            select(*cols, func.sum(LEDGER.c.gpu_ms))
            .where(LEDGER.c.bucket >= window.start, LEDGER.c.bucket < window.end)
            .group_by(*cols)
        )
    # Filters narrow the rows in SQL too where no line's price depends on another's (every
    # case but idle shared out over a pool): the same lines, fewer of them read
    pushed = bool(filters) and not (priced and idle == "shared")
    if pushed:
        for k, v in filters.items():
            q = q.where(_column(table, k, labelled=False) == v)
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    n = len(fine)
    fine_lines = []
    for r in rows:
        keys = dict(zip(fine, (str(v) for v in r[:n]), strict=True))
        day, month = r[n], r[n + 1]
        bucket = r[n + 2] if step == "hour" else None
        ms = int(r[-1])
        c = None
        if priced:
            assert rates is not None
            c = cost(ms, rates.price(keys["gpu_type"], keys["pool"], keys["qos"], day))
        line = Line(_period(step, day, bucket, month), keys, ms, c)
        if usage is not None:
            cluster, _, rest = keys["source"].partition(":")
            share = usage.get((cluster, rest.partition(":")[0]))
            line.measured_ms = ms if share is not None else 0
            line.used_ms = ms * share if share is not None else 0.0
        fine_lines.append(line)
    report = Report(window, by, step, idle, rates.currency if priced and rates else None, filters)
    report.usage = usage is not None
    if priced and idle == "shared":
        _share_idle(fine_lines, report)
    grouped: dict[tuple[Any, ...], Line] = {}
    for line in fine_lines:
        if any(line.keys.get(k) != v for k, v in filters.items()):
            continue
        gk = (line.period, *(line.keys[k] for k in by))
        acc = grouped.get(gk)
        if acc is None:
            acc = grouped[gk] = Line(
                line.period, {k: line.keys[k] for k in by}, 0, Decimal(0) if priced else None
            )
        acc.gpu_ms += line.gpu_ms
        if line.measured_ms is not None:
            acc.measured_ms = (acc.measured_ms or 0) + line.measured_ms
            acc.used_ms = (acc.used_ms or 0.0) + (line.used_ms or 0.0)
        if priced and line.cost is not None:
            acc.cost = (acc.cost or Decimal(0)) + line.cost
    report.lines = sorted(grouped.values(), key=lambda li: (li.period or "", *li.keys.values()))
    if not rates:
        report.notes.append("no rates defined: GPU-hours only")
    if not rows:
        report.notes.append(
            "no ledger rows in this window match the filters"
            if pushed
            else "the ledger has no rows in this window"
        )
    return report


def _share_idle(lines: list[Line], report: Report) -> None:
    """Move each pool's idle cost onto the pool's other lines in proportion to their
    GPU time; the idle lines keep their GPU-hours at zero cost."""
    idle_cost: dict[str, Decimal] = defaultdict(Decimal)
    used: dict[str, int] = defaultdict(int)
    for line in lines:
        pool = line.keys["pool"]
        if line.keys["workload"] == "idle":
            idle_cost[pool] += line.cost or Decimal(0)
        else:
            used[pool] += line.gpu_ms
    for line in lines:
        pool = line.keys["pool"]
        if not used[pool]:
            continue  # nothing to share it over: the idle line keeps its cost
        if line.keys["workload"] == "idle":
            line.cost = Decimal(0)
        else:
            line.cost = (line.cost or Decimal(0)) + idle_cost[pool] * line.gpu_ms / used[pool]
    unshared = sorted(p for p, c in idle_cost.items() if c and not used[p])
    if unshared:
        report.notes.append(
            f"idle cost of pool(s) {', '.join(unshared)} stays on the idle line: "
            "no use in the window to share it over"
        )
    report.notes.append("idle cost shared within each pool in proportion to GPU-hours used")


def utilization(engine: Engine, window: Window, step: str = "day") -> list[dict[str, Any]]:
    """Per period and pool: allocated and capacity GPU-hours (capacity = allocated + the
    capacity lines: idle and the down lines, where the capacity covers the pool; none of
    those is allocated)."""
    rep = build_report(engine, window, ("pool", "workload"), step=step)
    cells: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for line in rep.lines:
        cell = cells[(line.period or "", line.keys["pool"])]
        cell[1 if line.keys["workload"] in CAPACITY_WORKLOADS else 0] += line.gpu_ms
    return [
        {
            "period": period,
            "pool": pool,
            "allocated_gpu_hours": alloc / MS_PER_HOUR,
            "capacity_gpu_hours": (alloc + spare) / MS_PER_HOUR,
            "utilization": alloc / (alloc + spare) if alloc + spare else None,
        }
        for (period, pool), (alloc, spare) in sorted(cells.items())
    ]
