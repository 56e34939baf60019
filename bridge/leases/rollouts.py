"""`RolloutStore`: the persisted gradual rollouts of model versions (one row per rollout,
its verdicts as events), in the bridge's database beside the leases.

A rollout is written by `stb models publish --canary` (state `pending`) and carried out by
the daemon's rollout driver (`bridge.daemon.rollouts`), which moves it through its states
here and nowhere else:

    pending -> running (step 0, 1, ...) -> promoting -> promoted
                  \\-> rolling_back -> rolled_back        (from pending or running)

`pending`: the new version is in the repository, not yet loaded (the split sends every
unversioned request to the old version); `running`: both serve, the new one takes its
step's share; `promoting`/`rolling_back`: the split sends everything to the version that
stays while the other is unloaded. Each move is stored before it is carried out, and each
carrying out is idempotent, so a daemon killed at any point resumes where it was.

At most one rollout per model is open (not promoted or rolled back): `start` checks it in
its write transaction, and a partial unique index enforces it against a racing writer.
Rows handed out are detached copies.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import JSON, Column, Float, Integer, String, Text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

from bridge.db import Transactions, UTCDateTime
from bridge.leases.models import partial_unique
from bridge.leases.requests import Audit

State = Literal["pending", "running", "promoting", "promoted", "rolling_back", "rolled_back"]
OPEN: tuple[State, ...] = ("pending", "running", "promoting", "rolling_back")
DONE: tuple[State, ...] = ("promoted", "rolled_back")
#: the moves the driver may make (anything else is a bug: `RolloutError`)
MOVES: dict[str, tuple[str, ...]] = {
    "pending": ("running", "rolling_back"),
    "running": ("running", "promoting", "rolling_back"),
    "promoting": ("promoted",),
    "rolling_back": ("rolled_back",),
}
TABLES = ("rollout", "rollout_event")


def move_words(rollout_id: int, before: str, after: str, step: int) -> str:
    """A rollout's move as its audit entry names it ("rollout 3 running -> running step
    2"); `bridge.audit.check` reads the entries back by it."""
    return f"rollout {rollout_id} {before} -> {after}" + (
        f" step {step}" if after == "running" else ""
    )


class RolloutError(RuntimeError):
    """A rollout cannot be started or moved as asked; says why."""


class Rollout(SQLModel, table=True):
    """One gradual rollout of `new_version` of `model` beside `old_version`."""

    __tablename__ = "rollout"
    __table_args__ = (
        partial_unique(
            "ux_rollout_open_model", "model", "state NOT IN ('promoted', 'rolled_back')"
        ),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    model: str = Field(sa_column=Column(String(255), nullable=False, index=True))
    old_version: int = Field(sa_column=Column(Integer, nullable=False))
    new_version: int = Field(sa_column=Column(Integer, nullable=False))
    #: the step plan as given (`bridge.policy.rollout.parse_plan`), e.g. "10%:5m,50%"
    plan: str = Field(sa_column=Column(Text, nullable=False))
    #: the plan's default hold per step, seconds
    hold_s: float = Field(sa_column=Column(Float, nullable=False))
    state: str = Field(sa_column=Column(String(16), nullable=False, index=True))
    #: index of the step in progress (running), or the last one reached
    step: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    step_started_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    updated_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    who: str = Field(default="", sa_column=Column(Text, nullable=False))
    why: str = Field(default="", sa_column=Column(Text, nullable=False))
    #: why it is where it is (the last verdict that moved it)
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))


class RolloutEvent(SQLModel, table=True):
    """One move of a rollout, with the verdict's reason and the figures it judged."""

    __tablename__ = "rollout_event"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    rollout_id: int = Field(sa_column=Column(Integer, nullable=False, index=True))
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    from_state: str = Field(sa_column=Column(String(16), nullable=False))
    to_state: str = Field(sa_column=Column(String(16), nullable=False))
    step: int = Field(sa_column=Column(Integer, nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    #: {"new": {requests, failures, p99_ms}, "old": {...}, "held_s": ...} when judged
    figures: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class RolloutStore(Transactions):
    def start(
        self,
        model: str,
        old_version: int,
        new_version: int,
        plan: str,
        hold_s: float,
        now: datetime,
        *,
        who: str = "",
        why: str = "",
    ) -> Rollout:
        """A new pending rollout; RolloutError if the model has one open already."""
        if new_version <= old_version:
            raise RolloutError(
                f"{model}: the new version {new_version} must be above the old {old_version}"
            )
        try:
            with self._write() as session:
                open_ = self._open(session, model)
                if open_ is not None:
                    raise RolloutError(busy(open_))
                row = Rollout(
                    model=model, old_version=old_version, new_version=new_version, plan=plan,
                    hold_s=hold_s, state="pending", created_at=now, updated_at=now, who=who,
                    why=why, reason="waiting for the daemon to load the new version",
                )  # fmt: skip
                self._insert(
                    session,
                    row,
                    lambda rollout_id: RolloutEvent(
                        rollout_id=rollout_id,
                        at=now,
                        from_state="",
                        to_state="pending",
                        step=0,
                        reason=why or "published with a step plan",
                    ),
                )
        except IntegrityError as exc:  # another writer opened one between our read and write
            raise RolloutError(f"{model}: a rollout was opened at the same time") from exc
        return row

    def move(
        self,
        rollout_id: int,
        state: State,
        now: datetime,
        reason: str,
        *,
        step: int | None = None,
        figures: dict[str, Any] | None = None,
        audit: Audit | None = None,
    ) -> Rollout:
        """Move the rollout (checked against `MOVES`); a new step restarts its clock.
        `audit` records the move in the same transaction (told "rollout 3 running ->
        running step 2")."""
        with self._write() as session:
            row = session.get(Rollout, rollout_id, with_for_update=True)
            if row is None:
                raise RolloutError(f"no rollout {rollout_id}")
            if state not in MOVES.get(row.state, ()):
                raise RolloutError(f"rollout {rollout_id} of {row.model}: {row.state} -> {state}")
            before = row.state
            if step is not None and (step != row.step or row.step_started_at is None):
                row.step, row.step_started_at = step, now
            row.state, row.updated_at, row.reason = state, now, reason
            session.add(row)
            session.add(
                RolloutEvent(
                    rollout_id=rollout_id,
                    at=now,
                    from_state=before,
                    to_state=state,
                    step=row.step,
                    reason=reason,
                    figures=figures or {},
                )
            )
            if audit is not None:
                audit(session, move_words(rollout_id, before, state, row.step))
        return row

    def open_rollouts(self) -> list[Rollout]:
        """Every open rollout, oldest first."""
        with self._read() as session:
            rows = session.exec(
                select(Rollout).where(col(Rollout.state).in_(OPEN)).order_by(col(Rollout.id))
            ).all()
        return list(rows)

    def open_of(self, model: str) -> Rollout | None:
        """The model's open rollout, if it has one."""
        with self._read() as session:
            return self._open(session, model)

    def of_model(self, model: str) -> list[Rollout]:
        """The model's rollouts, newest first."""
        with self._read() as session:
            rows = session.exec(
                select(Rollout).where(Rollout.model == model).order_by(col(Rollout.id).desc())
            ).all()
        return list(rows)

    def events(self, rollout_id: int) -> list[RolloutEvent]:
        with self._read() as session:
            rows = session.exec(
                select(RolloutEvent)
                .where(RolloutEvent.rollout_id == rollout_id)
                .order_by(col(RolloutEvent.id))
            ).all()
        return list(rows)

    @staticmethod
    def _open(session: Session, model: str) -> Rollout | None:
        return session.exec(
            select(Rollout).where(Rollout.model == model, col(Rollout.state).in_(OPEN))
        ).first()


def busy(row: Rollout) -> str:
    """Why a model with this rollout open cannot start another."""
    return (
        f"{row.model} has a rollout open (version {row.new_version} beside "
        f"{row.old_version}, {row.state}): wait for it to end, one rollout per model at a time"
    )


__all__ = [
    "DONE", "MOVES", "OPEN", "TABLES", "Rollout", "RolloutError", "RolloutEvent",
    "RolloutStore", "State", "busy",
]  # fmt: skip
