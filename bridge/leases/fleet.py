"""`FleetStore`: the fleet's mode as a site switched it (issue 33's migration path), in the
bridge's database beside the leases: one row per switch, the latest in force, each with
who switched, why, the lend cap of a gradual step and the figures measured when it was
made (`bridge.fleet.baseline`). No row: `shared`, as every bridge ran before the modes
(the configuration's caps alone).

The modes (`MODES`):
- `separate`: the bridge lends nothing and returns every lease gracefully; routing, the
  reserved pool's baselines, the ledger and governance go on. The instant fallback.
- `advisory`: as separate, and each pass says what it would lend or return if shared
  (the decisions of the policy on the same snapshot without the fence).
- `shared`: the bridge lends, within `max_lent_nodes` (a gradual step's cap, never above
  the configuration's) when given.

Rows are appended, never changed: the history is the report's periods."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import JSON, Column, Integer, String, Text
from sqlmodel import Field, SQLModel, col, select

from bridge.db import Transactions, UTCDateTime
from bridge.leases.requests import Audit

Mode = Literal["separate", "advisory", "shared"]
MODES: tuple[str, ...] = get_args(Mode)
TABLES = ("fleet_switch",)


class FleetError(ValueError):
    """A switch that cannot be made as asked; says why."""


class FleetSwitch(SQLModel, table=True):
    """One switch of the fleet's mode."""

    __tablename__ = "fleet_switch"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))
    mode: str = Field(sa_column=Column(String(16), nullable=False))
    #: a gradual step's lend cap in nodes (shared only); None: the configuration's
    max_lent_nodes: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    who: str = Field(default="", sa_column=Column(String(255), nullable=False))
    why: str = Field(default="", sa_column=Column(Text, nullable=False))
    #: the figures measured as the switch was made (`bridge.fleet.baseline.Baseline`)
    baseline: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


def check(mode: str, max_lent_nodes: int | None) -> None:
    """FleetError naming what is wrong with a switch to `mode` with `max_lent_nodes`."""
    if mode not in MODES:
        raise FleetError(f"fleet mode {mode!r} is not one of {', '.join(MODES)}")
    if max_lent_nodes is not None:
        if mode != "shared":
            raise FleetError(f"a lend cap (--max-lent-nodes) is a shared step's, not {mode}'s")
        if max_lent_nodes < 0:
            raise FleetError(f"--max-lent-nodes must be >= 0, got {max_lent_nodes}")


class FleetStore(Transactions):
    @classmethod
    def beside(cls, other: Transactions) -> FleetStore:
        """The fleet's switches in `other`'s database (the daemon reads them; `stb fleet`
        writes them, unfenced: an operator's command, as `stb drain` is)."""
        return cls(other._engine)

    def switch(
        self,
        mode: str,
        now: datetime,
        *,
        max_lent_nodes: int | None = None,
        who: str = "",
        why: str = "",
        baseline: dict[str, Any] | None = None,
        audit: Audit | None = None,
    ) -> FleetSwitch:
        """Append a switch to `mode` (FleetError, nothing written, for a bad one); `audit`
        records it in the same transaction (told "switch 3")."""
        check(mode, max_lent_nodes)
        row = FleetSwitch(
            at=now,
            mode=mode,
            max_lent_nodes=max_lent_nodes,
            who=who,
            why=why,
            baseline=baseline or {},
        )
        with self._write() as session:
            session.add(row)
            if audit is not None:
                session.flush()
                audit(session, f"switch {row.id}")
        return row

    def current(self) -> FleetSwitch | None:
        """The switch in force (the latest); None: never switched (shared)."""
        with self._read() as session:
            return session.exec(
                select(FleetSwitch).order_by(col(FleetSwitch.id).desc()).limit(1)
            ).first()

    def history(self) -> list[FleetSwitch]:
        """Every switch, oldest first."""
        with self._read() as session:
            return list(session.exec(select(FleetSwitch).order_by(col(FleetSwitch.id))).all())
