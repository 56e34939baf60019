"""Operator requests (`stb lend NODE`, `stb return LEASE`) on their way to the daemon.

The CLI writes a row; the running daemon reads the pending rows at the start of each tick
and carries them out through the same state machine as its own decisions, then records the
outcome. So there is one actor on Slurm and Triton, however many operators type at once,
and a request made while the daemon is down is carried out when it comes back.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Column, Engine, Integer, String, Text
from sqlmodel import Field, Session, SQLModel, col, select

from bridge.db import WRITE_OPTION, UTCDateTime, configure_sqlite

KINDS = ("lend", "return")


class OperatorRequest(SQLModel, table=True):
    __tablename__ = "operator_request"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    #: "lend" (node, models) or "return" (lease_id)
    kind: str = Field(sa_column=Column(String(16), nullable=False))
    node: str | None = Field(default=None, sa_column=Column(String(255), nullable=True))
    models: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    lease_id: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    requested_by: str = Field(default="", sa_column=Column(String(255), nullable=False))
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    done_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    #: what happened: "lease 7 requested", or the error that stopped it
    outcome: str = Field(default="", sa_column=Column(Text, nullable=False))


class RequestQueue:
    def __init__(self, engine: Engine) -> None:
        configure_sqlite(engine)
        self._engine = engine
        # Writes begin IMMEDIATE on SQLite (bridge.db): a read-then-write transaction
        # started as a reader would fail at once ("database is locked") when another
        # process inserted a request in between, instead of waiting its busy timeout.
        self._writer = engine.execution_options(**{WRITE_OPTION: True})

    def _add(self, req: OperatorRequest) -> OperatorRequest:
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            session.add(req)
        return req

    def request_lend(
        self, node: str, models: list[str], now: datetime, requested_by: str = ""
    ) -> OperatorRequest:
        if not node:
            raise ValueError("a lend request needs a node")
        return self._add(
            OperatorRequest(
                kind="lend", node=node, models=models, requested_by=requested_by, created_at=now
            )
        )

    def request_return(
        self, lease_id: int, now: datetime, requested_by: str = ""
    ) -> OperatorRequest:
        return self._add(
            OperatorRequest(
                kind="return", lease_id=lease_id, requested_by=requested_by, created_at=now
            )
        )

    def pending(self) -> list[OperatorRequest]:
        with Session(self._engine, expire_on_commit=False) as session:
            query = select(OperatorRequest).where(col(OperatorRequest.done_at).is_(None))
            return list(session.exec(query.order_by(col(OperatorRequest.id))).all())

    def get(self, request_id: int) -> OperatorRequest | None:
        with Session(self._engine, expire_on_commit=False) as session:
            return session.get(OperatorRequest, request_id)

    def finish(self, request_id: int, now: datetime, outcome: str) -> None:
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            req = session.get(OperatorRequest, request_id)
            if req is not None and req.done_at is None:
                req.done_at = now
                req.outcome = outcome
