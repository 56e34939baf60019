"""`WeightStore`: the catalogue of node-local weight copies, in the bridge's database
beside the leases (table `weight_copy`, made by the bridge's migrations).

One row per node and model version: where the copy is, its size and digest (the sha256
over its manifest's file list: `bridge.weights.manifest`), its state, when it was staged
and last verified, and the staging job that made it. States and the moves between them:

    staging  -> complete | failed          (the staging job's outcome)
    complete -> evicted  | failed | staging (removed; refused at verify; staged again)
    failed   -> staging  | evicted          (a retry; cleaned up)
    evicted  -> staging                     (wanted again)

`begin` opens (or reopens) a row in `staging`; `finish`, `fail`, `verified` and `evict`
move it, refusing a move the table does not allow (`WeightStoreError`). Rows handed out
are detached copies. Written by the daemon's staging step and `stb weights`, read by
`stb weights status` and the policy's snapshot.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sqlalchemy import BigInteger, Column, Integer, String, Text, UniqueConstraint
from sqlmodel import Field, SQLModel, col, select

from bridge.db import Transactions, UTCDateTime

State = Literal["staging", "complete", "failed", "evicted"]
STATES: tuple[State, ...] = ("staging", "complete", "failed", "evicted")
MOVES: dict[str, tuple[str, ...]] = {
    "staging": ("complete", "failed"),
    "complete": ("evicted", "failed", "staging"),
    "failed": ("staging", "evicted"),
    "evicted": ("staging",),
}
TABLES = ("weight_copy",)


class WeightStoreError(RuntimeError):
    """A copy's row cannot be moved as asked; says why."""


class WeightCopy(SQLModel, table=True):
    """One model version's copy on one node."""

    __tablename__ = "weight_copy"
    __table_args__ = (UniqueConstraint("node", "model", "version", name="ux_weight_copy"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    node: str = Field(sa_column=Column(String(128), nullable=False, index=True))
    model: str = Field(sa_column=Column(String(128), nullable=False))
    version: int = Field(sa_column=Column(Integer, nullable=False))
    #: the copy's folder on the node (`<cache_root>/<model>/<version>`)
    path: str = Field(sa_column=Column(Text, nullable=False))
    #: bytes (the manifest's total; 0 until known)
    size_bytes: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    #: the manifest's digest ("" until known)
    digest: str = Field(default="", sa_column=Column(String(64), nullable=False))
    state: str = Field(sa_column=Column(String(16), nullable=False))
    staged_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime(), nullable=True))
    verified_at: datetime | None = Field(
        default=None, sa_column=Column(UTCDateTime(), nullable=True)
    )
    #: the Slurm job that staged (or is staging) it ("" when staged by hand)
    job_id: str = Field(default="", sa_column=Column(String(32), nullable=False))
    #: why it failed or was evicted ("" otherwise)
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    updated_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))


class WeightStore(Transactions):
    @classmethod
    def beside(cls, other: Transactions) -> WeightStore:
        """The catalogue in `other`'s database, behind its fence."""
        return cls(other._engine, other._fence)

    def _row(self, session: object, node: str, model: str, version: int) -> WeightCopy | None:
        stmt = select(WeightCopy).where(
            WeightCopy.node == node, WeightCopy.model == model, WeightCopy.version == version
        )
        return session.exec(stmt).first()  # type: ignore[attr-defined, no-any-return]

    def _move(self, row: WeightCopy, to: State, at: datetime) -> None:
        if to not in MOVES.get(row.state, ()):
            raise WeightStoreError(
                f"{row.model} version {row.version} on {row.node} is {row.state}: it cannot "
                f"become {to} (allowed: {', '.join(MOVES.get(row.state, ())) or 'none'})"
            )
        row.state = to
        row.updated_at = at

    def begin(
        self, node: str, model: str, version: int, path: str, at: datetime, job_id: str = ""
    ) -> WeightCopy:
        """A staging of the version on `node` starts (a new row, or a row moved back to
        staging); WeightStoreError while one is already staging."""
        with self._write() as session:
            row = self._row(session, node, model, version)
            if row is None:
                row = WeightCopy(
                    node=node,
                    model=model,
                    version=version,
                    path=path,
                    state="staging",
                    updated_at=at,
                    job_id=job_id,
                )
            else:
                self._move(row, "staging", at)
                row.path, row.job_id, row.reason = path, job_id, ""
            session.add(row)
            session.flush()
            return row

    def _update(
        self, node: str, model: str, version: int, to: State, at: datetime, **values: object
    ) -> WeightCopy:
        with self._write() as session:
            row = self._row(session, node, model, version)
            if row is None:
                raise WeightStoreError(f"no copy of {model} version {version} on {node}")
            self._move(row, to, at)
            for key, value in values.items():
                setattr(row, key, value)
            session.add(row)
            session.flush()
            return row

    def finish(
        self, node: str, model: str, version: int, size_bytes: int, digest: str, at: datetime
    ) -> WeightCopy:
        """The staging job put a verified copy in place."""
        return self._update(
            node,
            model,
            version,
            "complete",
            at,
            size_bytes=size_bytes,
            digest=digest,
            staged_at=at,
            verified_at=at,
        )

    def fail(self, node: str, model: str, version: int, reason: str, at: datetime) -> WeightCopy:
        """Staging failed, or the copy did not verify before a use."""
        return self._update(node, model, version, "failed", at, reason=reason)

    def evict(self, node: str, model: str, version: int, reason: str, at: datetime) -> WeightCopy:
        return self._update(node, model, version, "evicted", at, reason=reason)

    def verified(self, node: str, model: str, version: int, at: datetime) -> WeightCopy:
        """A complete copy verified again (before a use)."""
        with self._write() as session:
            row = self._row(session, node, model, version)
            if row is None or row.state != "complete":
                state = row.state if row is not None else "unknown"
                raise WeightStoreError(
                    f"{model} version {version} on {node} is {state}, not complete"
                )
            row.verified_at = row.updated_at = at
            session.add(row)
            session.flush()
            return row

    def copies(self, node: str | None = None, states: tuple[str, ...] = STATES) -> list[WeightCopy]:
        """The copies (of `node`, in `states`), by node, model and version."""
        with self._read() as session:
            stmt = select(WeightCopy).where(col(WeightCopy.state).in_(states))
            if node is not None:
                stmt = stmt.where(WeightCopy.node == node)
            stmt = stmt.order_by(
                col(WeightCopy.node), col(WeightCopy.model), col(WeightCopy.version)
            )
            return list(session.exec(stmt).all())

    def used_bytes(self, node: str) -> int:
        """Bytes the node's complete and staging copies take (or will take)."""
        return sum(c.size_bytes for c in self.copies(node, ("staging", "complete")))

    def where(self, model: str, version: int) -> list[str]:
        """The nodes holding a complete copy of the version."""
        return [
            c.node
            for c in self.copies(states=("complete",))
            if (c.model, c.version) == (model, version)
        ]


__all__ = ["MOVES", "STATES", "TABLES", "WeightCopy", "WeightStore", "WeightStoreError"]
