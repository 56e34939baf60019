"""The report over HTTP: `GET /api/report?window=2026-11&by=team,workload&step=day`
returns the same JSON as `stb report --format json`. Served by the daemon's HTTP
surface (`bridge.http.routes`).

Parameters: `window` (required: YYYY-MM, YYYY-MM-DD or START..END), `aggregate` (or
`by`: the keys to group by, comma-separated, default team,workload), `step` (hour, day or
month; none: one line per group), `idle` (line or shared), `where` (repeatable KEY=VALUE
filter). A bad parameter is a 400 with `{"error": "..."}` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sqlalchemy import Engine

from accounting.errors import LedgerError
from accounting.rates import RateBook, list_rates
from accounting.report import IdleMode, Window, build_report, parse_filters, parse_keys


def report_response(
    engine: Engine, query: Mapping[str, Sequence[str]], default_idle: IdleMode = "line"
) -> tuple[int, bytes]:
    """(HTTP status, JSON body) for a report query."""
    try:
        known = {"window", "aggregate", "by", "step", "idle", "where"}
        unknown = sorted(set(query) - known)
        if unknown:
            raise LedgerError(f"unknown parameter(s) {', '.join(unknown)}; use {sorted(known)}")
        if not query.get("window"):
            raise LedgerError("window is required (YYYY-MM, YYYY-MM-DD or START..END)")
        window = Window.parse(query["window"][-1])
        keys = query.get("aggregate") or query.get("by")
        by = parse_keys(keys[-1]) if keys else ("team", "workload")
        step = query["step"][-1] if query.get("step") else None
        idle = query["idle"][-1] if query.get("idle") else default_idle
        if idle not in ("line", "shared"):
            raise LedgerError(f"idle must be line or shared, not {idle!r}")
        report = build_report(
            engine,
            window,
            by,
            step=step,
            idle=idle,  # type: ignore[arg-type]
            rates=RateBook(list_rates(engine)),
            filters=parse_filters(query.get("where", [])),
        )
    except LedgerError as exc:
        return 400, json.dumps({"error": str(exc)}).encode()
    return 200, json.dumps(report.as_dict()).encode()
