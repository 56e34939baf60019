"""The advisory mode's record: what the bridge would have done, and what it saw.

Three tables in the bridge's database, made by its migrations (`bridge.leases.schema`):

- `advice`: one row per decision the advisory pass would have carried out (lend, return,
  baseline), with the snapshot's key figures as the policy saw them (per model: p99, rate,
  replicas, pending; per pool: free and lendable nodes);
- `advice_sample`: each tick, each model's observed request rate, p99, mean and compute
  time and pending requests: the arrivals `stb advise report` replays through the
  simulator, without a Prometheus server;
- `shadow_lease`: the leases the advisory would have made (`bridge.advise.shadow`), so a
  restarted advisory carries on with the same leases, cooldowns and preemption budget.

Written by `bridge.advise.advisory.Advisor` once per tick, in one transaction (a crash
loses at most the tick in progress); read by `stb advise report` (`bridge.advise`). It
writes nothing else: no lease, no operator request, no leader row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, Float, Integer, String, Text, func
from sqlmodel import Field, Session, SQLModel, col, select

from bridge.db import Transactions, UTCDateTime

#: the kinds of advice (the policy's actions)
KINDS = ("lend", "return", "place", "baseline")


class Advice(SQLModel, table=True):
    """One decision the advisory pass would have carried out."""

    __tablename__ = "advice"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))
    #: lend | return | place | baseline
    kind: str = Field(sa_column=Column(String(16), nullable=False))
    node: str = Field(sa_column=Column(String(255), nullable=False))
    #: the node's pool (a return: the pool its lease was lent from)
    pool: str = Field(default="", sa_column=Column(String(64), nullable=False))
    lend_mode: str = Field(default="", sa_column=Column(String(16), nullable=False))
    models: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    #: the shadow lease the decision made or returned (None: a baseline)
    shadow_lease: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    #: shadow leases serving when it was decided: replicas the policy counted that never
    #: served, so the latency it read does not show them
    shadow_serving: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    #: the snapshot's key figures: {"models": {m: {p99_ms, rate, replicas, pending}},
    #: "pools": {p: {free, lendable}}}
    figures: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class AdviceSample(SQLModel, table=True):
    """One model's signal at one tick of the advisory pass."""

    __tablename__ = "advice_sample"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))
    model: str = Field(sa_column=Column(String(128), nullable=False))
    #: requests answered per second over the tick (None: no usable window)
    request_rate: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    p99_ms: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    mean_ms: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    compute_ms: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    pending: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    #: ready replicas that hold the model (real ones: the shadows serve nothing)
    replicas: int = Field(default=0, sa_column=Column(Integer, nullable=False))


class ShadowLeaseRow(SQLModel, table=True):
    """A shadow lease as stored (`bridge.advise.shadow.ShadowLease`). Times of its Triton
    job (which never exists) are epoch seconds."""

    __tablename__ = "shadow_lease"

    #: assigned by the advisory (`ShadowBook.next_id`), not by the database
    id: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    node: str = Field(sa_column=Column(String(255), nullable=False))
    pool: str = Field(sa_column=Column(String(64), nullable=False))
    lend_mode: str = Field(sa_column=Column(String(16), nullable=False))
    models: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    state: str = Field(sa_column=Column(String(16), nullable=False, index=True))
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))
    updated_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    running_at: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    ready_at: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    gone_at: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    victims: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))


TABLES = ("advice", "advice_sample", "shadow_lease")


class AdviceStore(Transactions):
    """Reads and writes the advisory's tables. Rows handed in are copied (the caller's
    objects stay free to be written again after a failed transaction); rows handed out
    are detached copies."""

    def write_tick(
        self,
        advice: Sequence[Advice],
        samples: Sequence[AdviceSample],
        shadows: Sequence[ShadowLeaseRow],
    ) -> None:
        """One tick's record in one transaction: its advice and samples appended, its
        changed shadow leases upserted. Raises SQLAlchemy's error and writes nothing when
        the database refuses."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            for a in advice:
                session.add(Advice(**a.model_dump(exclude={"id"})))
            for s in samples:
                session.add(AdviceSample(**s.model_dump(exclude={"id"})))
            for row in shadows:
                session.merge(ShadowLeaseRow(**row.model_dump()))

    def shadows(self, since: datetime) -> list[ShadowLeaseRow]:
        """The shadow leases still open, and those made at or after `since` (their
        would-be requeues still count), by id."""
        with self._read() as session:
            rows = session.exec(
                select(ShadowLeaseRow)
                .where(
                    (col(ShadowLeaseRow.state) != "returned")
                    | (col(ShadowLeaseRow.created_at) >= since)
                )
                .order_by(col(ShadowLeaseRow.id))
            )
            return list(rows.all())

    def next_shadow_id(self) -> int:
        with self._read() as session:
            top = session.exec(select(func.max(ShadowLeaseRow.id))).one()
            return int(top or 0) + 1

    def advice_between(self, start: datetime, end: datetime) -> list[Advice]:
        """The advice of [start, end), oldest first."""
        with self._read() as session:
            rows = session.exec(
                select(Advice)
                .where(col(Advice.at) >= start, col(Advice.at) < end)
                .order_by(col(Advice.at), col(Advice.id))
            )
            return list(rows.all())

    def samples_between(self, start: datetime, end: datetime) -> list[AdviceSample]:
        """The samples of [start, end), oldest first."""
        with self._read() as session:
            rows = session.exec(
                select(AdviceSample)
                .where(col(AdviceSample.at) >= start, col(AdviceSample.at) < end)
                .order_by(col(AdviceSample.at), col(AdviceSample.id))
            )
            return list(rows.all())


__all__ = ["KINDS", "TABLES", "Advice", "AdviceSample", "AdviceStore", "ShadowLeaseRow"]
