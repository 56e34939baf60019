"""Operator requests (`stb lend NODE`, `stb return LEASE`, `stb place LEASE MODELS`) on
their way to the daemon, a standby's wakes (requests for a model at zero held by its
activator, which only the leader's policy can lend for), and pool holds (`stb drain POOL`
... `stb resume POOL`).

The CLI or the HTTP API writes a row naming who asked; the running daemon reads the
pending rows at the start of each tick and carries them out through the same state
machine as its own decisions, then records the outcome. So there is one actor on Slurm
and Triton, however many operators type at once, and a request made while the daemon is
down is carried out when it comes back.

A request is idempotent across a failover (`kill -9` of the active daemon after it took a
request and before it recorded the outcome; the standby takes it again): a lend's lease is
keyed by the request (`lease_key`), and a return's moves name it (`OperatorRequest.reason`),
so the request taken again is answered from what its first attempt did, never done twice
and never refused for being its own work. A placement taken again finds its lease holding
the models it asked for, and is answered so.

A hold is a row too: while a pool is held, the daemon lends none of its nodes and returns
the leases it has there. The rows stay after the hold is lifted, with who lifted it when:
the audit of who drained what.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import JSON, Column, Integer, String, Text
from sqlmodel import Field, Session, SQLModel, col, select

from bridge.db import Transactions, UTCDateTime

KINDS = ("lend", "return", "place", "wake")

#: records a write in its own transaction, told what was written ("request 7"): the
#: request or hold and its audit entry commit together or not at all (`bridge.audit`)
Audit = Callable[[Session, str], None]


def lease_key(request_id: int) -> str:
    """The `request_key` of the lease operator request `request_id` lends
    (`LeaseStore.create` is idempotent by it): the request taken again finds its lease."""
    return f"operator-request:{request_id}"


class OperatorRequest(SQLModel, table=True):
    __tablename__ = "operator_request"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    #: "lend" (node, models), "return" (lease_id), "place" (lease_id, models) or "wake"
    #: (models: the one model at zero a standby's activator holds requests for)
    kind: str = Field(sa_column=Column(String(16), nullable=False))
    node: str | None = Field(default=None, sa_column=Column(String(255), nullable=True))
    models: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    lease_id: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    requested_by: str = Field(default="", sa_column=Column(String(255), nullable=False))
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    done_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    #: what happened: "lease 7 requested", or the error that stopped it
    outcome: str = Field(default="", sa_column=Column(Text, nullable=False))

    @property
    def reason(self) -> str:
        """Why its lease moves: the request and who asked ("operator request 7 by ops").
        Unique per request, so a return taken again finds the move its first attempt made."""
        by = f" by {self.requested_by}" if self.requested_by else ""
        return f"operator request {self.id}{by}"


class PoolHold(SQLModel, table=True):
    __tablename__ = "pool_hold"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    pool: str = Field(sa_column=Column(String(128), nullable=False, index=True))
    held_by: str = Field(sa_column=Column(String(255), nullable=False))
    held_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    released_by: str | None = Field(default=None, sa_column=Column(String(255), nullable=True))
    released_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )


class RequestQueue(Transactions):
    """Operator requests and pool holds. Writes begin IMMEDIATE on SQLite (`bridge.db`):
    a read-then-write transaction started as a reader would fail at once ("database is
    locked") when another process inserted a request in between, instead of waiting its
    busy timeout. Only the active bridge (the leader's fence) records outcomes."""

    def _add(self, req: OperatorRequest, audit: Audit | None = None) -> OperatorRequest:
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            session.add(req)
            if audit is not None:
                session.flush()
                audit(session, f"request {req.id}")
        return req

    def request_lend(
        self,
        node: str,
        models: list[str],
        now: datetime,
        requested_by: str = "",
        audit: Audit | None = None,
    ) -> OperatorRequest:
        if not node:
            raise ValueError("a lend request needs a node")
        return self._add(
            OperatorRequest(
                kind="lend", node=node, models=models, requested_by=requested_by, created_at=now
            ),
            audit,
        )

    def request_return(
        self, lease_id: int, now: datetime, requested_by: str = "", audit: Audit | None = None
    ) -> OperatorRequest:
        return self._add(
            OperatorRequest(
                kind="return", lease_id=lease_id, requested_by=requested_by, created_at=now
            ),
            audit,
        )

    def request_place(
        self,
        lease_id: int,
        models: list[str],
        now: datetime,
        requested_by: str = "",
        audit: Audit | None = None,
    ) -> OperatorRequest:
        """Ask the daemon to give serving lease `lease_id` the models `models` in place of
        those it holds (`bridge.daemon.placer`)."""
        if not models:
            raise ValueError("a placement needs at least one model")
        return self._add(
            OperatorRequest(
                kind="place",
                lease_id=lease_id,
                models=models,
                requested_by=requested_by,
                created_at=now,
            ),
            audit,
        )

    def request_wake(self, model: str, now: datetime, requested_by: str) -> OperatorRequest:
        """A standby daemon's activator holds requests for `model`, served from zero: the
        leader counts them as waiting at its next pass (decide's rule 6). At most one
        pending wake a model: a standby asking again while one waits gets that one."""
        if not model:
            raise ValueError("a wake request needs a model")
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            query = select(OperatorRequest).where(
                col(OperatorRequest.done_at).is_(None), OperatorRequest.kind == "wake"
            )
            for req in session.exec(query).all():
                if req.models == [model]:
                    return req
            req = OperatorRequest(
                kind="wake", models=[model], requested_by=requested_by, created_at=now
            )
            session.add(req)
        return req

    def pending(self) -> list[OperatorRequest]:
        with Session(self._engine, expire_on_commit=False) as session:
            query = select(OperatorRequest).where(col(OperatorRequest.done_at).is_(None))
            return list(session.exec(query.order_by(col(OperatorRequest.id))).all())

    def get(self, request_id: int) -> OperatorRequest | None:
        with Session(self._engine, expire_on_commit=False) as session:
            return session.get(OperatorRequest, request_id)

    def finish(
        self, request_id: int, now: datetime, outcome: str, audit: Audit | None = None
    ) -> None:
        """Record a request's outcome, once: a finished request is left as it is.
        `audit` records the outcome in the same transaction (told "request 7")."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            if self._fence is not None:
                self._fence(session)
            req = session.get(OperatorRequest, request_id)
            if req is not None and req.done_at is None:
                req.done_at = now
                req.outcome = outcome
                if audit is not None:
                    session.flush()
                    audit(session, f"request {request_id}")

    # ---- pool holds -----------------------------------------------------------------

    def hold(
        self,
        pool: str,
        now: datetime,
        held_by: str,
        reason: str = "",
        audit: Audit | None = None,
    ) -> PoolHold:
        """Hold `pool` (no lends, its leases returned); holding a held pool returns the
        hold in force. `audit` records either in the same transaction."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            current = session.exec(
                select(PoolHold).where(PoolHold.pool == pool, col(PoolHold.released_at).is_(None))
            ).first()
            if current is not None:
                if audit is not None:
                    audit(session, f"already held by {current.held_by} (hold {current.id})")
                return current
            hold = PoolHold(pool=pool, held_by=held_by, held_at=now, reason=reason)
            session.add(hold)
            if audit is not None:
                session.flush()
                audit(session, f"hold {hold.id}" + (f": {reason}" if reason else ""))
        return hold

    def release(
        self, pool: str, now: datetime, released_by: str, audit: Audit | None = None
    ) -> PoolHold | None:
        """Lift the hold on `pool`; None when it was not held (`audit` is then not
        called: the caller records the refusal)."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            current = session.exec(
                select(PoolHold).where(PoolHold.pool == pool, col(PoolHold.released_at).is_(None))
            ).first()
            if current is not None:
                current.released_at = now
                current.released_by = released_by
                if audit is not None:
                    audit(session, f"hold {current.id} by {current.held_by} lifted")
        return current

    def holds(self) -> dict[str, PoolHold]:
        """The holds in force, by pool."""
        with Session(self._engine, expire_on_commit=False) as session:
            rows = session.exec(select(PoolHold).where(col(PoolHold.released_at).is_(None)))
            return {h.pool: h for h in rows.all()}
