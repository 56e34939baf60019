"""The ledger's daily roll-up (`ledger_day`): kept in step with `ledger_row`, read by reports.

Every write of ledger rows (`ingest`: a record's rows booked or replaced, idle rows
recomputed) notes the GPU-ms it adds and removes per day and key in a `DayDelta`, and
`DayDelta.apply` folds them into `ledger_day` in the same transaction (adding to each cell;
a cell that comes to zero is removed), so the roll-up always equals `ledger_row` summed by
day over every key but the user and the source. `build_report` reads it where the report
allows (`usable`): a window of whole UTC days, no hourly step, not by user or source, no
usage columns; a month by team then sums a few thousand cells instead of every hourly row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import time
from typing import Any

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from accounting.buckets import utc
from accounting.errors import LedgerError
from accounting.prepare import DayCell
from accounting.schema import DAY_KEYS, LedgerDay, LedgerRow

DAYS = LedgerDay.__table__  # type: ignore[attr-defined]
LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]


class DayDelta:
    """GPU-ms added (positive) and removed (negative) per roll-up cell."""

    def __init__(self) -> None:
        self.cells: defaultdict[DayCell, int] = defaultdict(int)

    def add_cells(self, cells: Iterable[tuple[DayCell, int]], sign: int = 1) -> None:
        c = self.cells
        for cell, ms in cells:
            c[cell] += sign * ms

    def remove_sources(self, conn: Connection, sources: Sequence[str]) -> None:
        """Note the removal of every row of `sources` (read before they are deleted)."""
        cols = [LEDGER.c.day, *(LEDGER.c[k] for k in DAY_KEYS)]
        q = select(*cols, func.sum(LEDGER.c.gpu_ms)).where(LEDGER.c.source.in_(sources))
        c = self.cells
        for *cell, ms in conn.execute(q.group_by(*cols)):
            c[tuple(cell)] -= int(ms)

    def apply(self, conn: Connection) -> int:
        """Fold the changes into `ledger_day`; returns the cells changed."""
        changes = [(cell, ms) for cell, ms in self.cells.items() if ms]
        self.cells.clear()
        if not changes:
            return 0
        names = ("day", *DAY_KEYS)
        rows = [
            {**dict(zip(names, cell, strict=True)), "month": f"{cell[0]:%Y-%m}", "gpu_ms": ms}
            for cell, ms in changes
        ]
        dialect = conn.dialect.name
        ins: Any
        if dialect == "postgresql":
            ins = postgresql.insert(DAYS)
        elif dialect == "sqlite":
            ins = sqlite.insert(DAYS)
        else:  # pragma: no cover - the two supported backends are above
            raise LedgerError(f"unsupported database {dialect}")
        stmt = ins.on_conflict_do_update(
            index_elements=list(names), set_={"gpu_ms": DAYS.c.gpu_ms + ins.excluded.gpu_ms}
        )
        for part in _parts(rows, 1000):
            conn.execute(stmt, part)
        days = sorted({cell[0] for cell, _ in changes})
        for part in _parts(days, 500):
            conn.execute(delete(DAYS).where(DAYS.c.day.in_(part), DAYS.c.gpu_ms == 0))
        return len(changes)


def _parts(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def usable(columns: Sequence[str], step: str | None, window: Any) -> bool:
    """Whether a report over `window` (a `report.Window`) grouped by `columns` (its keys,
    filters and pricing keys, as ledger columns) with `step` can read the roll-up."""
    whole_days = all(t.time() == time() for t in (utc(window.start), utc(window.end)))
    return whole_days and step != "hour" and all(k in DAY_KEYS for k in columns)
