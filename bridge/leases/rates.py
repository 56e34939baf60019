"""`RateStore`: each model's request rate as 5-minute means, the memory of the seasonal
forecast (`bridge.policy.seasonal`), in the bridge's database beside the leases (table
`model_rate`, made by the bridge's migrations: `bridge.leases.schema`).

One row per model and bucket (model, bucket start, mean req/s), written as each bucket
closes (`bridge.daemon.reconciler`: the deciding pass's `LendMemory.seasons`), read back
when the daemon starts (`since`), pruned past the days the forecast reads (`prune`). A
bucket written twice (a failover's new leader closing a bucket the old one wrote) keeps
the newer mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Column, Float, PrimaryKeyConstraint, String, delete
from sqlmodel import Field, SQLModel, col, select

from bridge.db import Transactions, UTCDateTime

TABLES = ("model_rate",)


class ModelRate(SQLModel, table=True):
    """One model's mean request rate over one bucket."""

    __tablename__ = "model_rate"
    __table_args__ = (PrimaryKeyConstraint("model", "bucket_start"),)

    model: str = Field(sa_column=Column(String(128), nullable=False))
    bucket_start: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    rate: float = Field(sa_column=Column(Float, nullable=False))


class RateStore(Transactions):
    @classmethod
    def beside(cls, other: Transactions) -> RateStore:
        """The rate history in `other`'s database, behind its fence."""
        return cls(other._engine, other._fence)

    def record(self, rows: Sequence[tuple[str, float, float]]) -> None:
        """Closed buckets (model, bucket start in epoch seconds, mean req/s) in one
        transaction."""
        if not rows:
            return
        with self._write() as session:
            for model, start, rate in rows:
                at = datetime.fromtimestamp(start, UTC)
                session.merge(ModelRate(model=model, bucket_start=at, rate=rate))

    def since(self, at: datetime) -> list[tuple[str, float, float]]:
        """The buckets that start at or after `at` (model, bucket start in epoch seconds,
        mean), oldest first."""
        with self._read() as session:
            rows = session.exec(
                select(ModelRate)
                .where(col(ModelRate.bucket_start) >= at)
                .order_by(col(ModelRate.bucket_start))
            ).all()
        return [(r.model, r.bucket_start.timestamp(), r.rate) for r in rows]

    def prune(self, before: datetime) -> None:
        """Forget the buckets that start before `before`."""
        with self._write() as session:
            session.execute(delete(ModelRate).where(col(ModelRate.bucket_start) < before))


__all__ = ["TABLES", "ModelRate", "RateStore"]
