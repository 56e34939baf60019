"""`LoadStore`: each model's measured load times, in the bridge's database beside the
leases (table `model_load`, made by the bridge's migrations: `bridge.leases.schema`).

One row per measurement (model, version, seconds, when, source):

- `placement`: a placement's `load_model` on a lent server, from the ask to its answer
  (Triton's explicit model control answers once the model is loaded; the daemon asks off
  its pass and takes the answer in later: `bridge.daemon.placer`): the model's own load,
  measured directly;
- `lend`: a lend's Triton start, its lease's `starting -> serving` seconds (the job
  running to Triton ready with its models loaded). Triton loads a lend's models at its
  start, so the figure bounds each of them from above (it holds Triton's own start too;
  the start of a Triton without models is never observed, so nothing is subtracted).
- `local`: the same bound of a lend whose model was read from the node's local weight
  cache (the lease history's move to serving says so: `bridge.weights.overlay`); kept
  apart, as the snapshot's `local_load_s` (`estimate(..., local=True)`), never mixed
  into the load from the shared repository.

`estimate`: per model, the median of its newest `KEEP` direct measurements, or of its
lend bounds when it has none: one slow start (a cold page cache, a busy file system)
does not make the lead time, and a placement's measure wins over a start's bound.
Written by the daemon (`bridge.daemon.loadtimes`), read back at its start (`latest`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import Column, Float, Integer, String
from sqlmodel import Field, SQLModel, col, select

from bridge.db import Transactions, UTCDateTime

#: the measurements of a model the estimate reads (the newest, per source)
KEEP = 5
#: the sources from the shared repository, best first, and the node-local cache's
SOURCES = ("placement", "lend")
LOCAL = "local"
TABLES = ("model_load",)


class ModelLoad(SQLModel, table=True):
    """One measured load of one model."""

    __tablename__ = "model_load"

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True))
    model: str = Field(sa_column=Column(String(128), nullable=False, index=True))
    #: the version loaded ("": the repository's default, or not known)
    version: str = Field(default="", sa_column=Column(String(64), nullable=False))
    seconds: float = Field(sa_column=Column(Float, nullable=False))
    measured_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    #: placement | lend (the module docstring)
    source: str = Field(sa_column=Column(String(16), nullable=False))


def estimate(measures: Iterable[tuple[str, float]], local: bool = False) -> float | None:
    """One model's load time from its measurements (source, seconds), oldest first: the
    median of the newest `KEEP` of the best source it has (with `local`, of its loads
    from the node-local cache alone; without, of the others); None without any."""
    by_source: dict[str, list[float]] = {}
    for source, seconds in measures:
        if (source == LOCAL) == local:
            by_source.setdefault(source, []).append(seconds)
    for source in (*SOURCES, *sorted(set(by_source) - set(SOURCES))):
        values = by_source.get(source)
        if values:
            return statistics.median(values[-KEEP:])
    return None


class LoadStore(Transactions):
    @classmethod
    def beside(cls, other: Transactions) -> LoadStore:
        """The load times in `other`'s database, behind its fence."""
        return cls(other._engine, other._fence)

    def record(
        self, model: str, seconds: float, at: datetime, source: str, version: str = ""
    ) -> None:
        """One measured load of `model` (`source`: placement | lend)."""
        if source not in (*SOURCES, LOCAL):
            known = ", ".join((*SOURCES, LOCAL))
            raise ValueError(f"unknown load source {source!r} (one of {known})")
        with self._write() as session:
            session.add(
                ModelLoad(
                    model=model,
                    version=version,
                    seconds=max(0.0, float(seconds)),
                    measured_at=at,
                    source=source,
                )
            )

    def measures(self, per_model: int = 4 * KEEP) -> dict[str, list[tuple[str, float]]]:
        """Per model, its newest `per_model` measurements (source, seconds), oldest first."""
        out: dict[str, list[tuple[str, float]]] = {}
        with self._read() as session:
            rows = session.exec(select(ModelLoad).order_by(col(ModelLoad.id).desc())).all()
        for row in rows:
            kept = out.setdefault(row.model, [])
            if len(kept) < per_model:
                kept.append((row.source, row.seconds))
        return {m: kept[::-1] for m, kept in out.items()}

    def latest(self) -> dict[str, float]:
        """Per model, its load time (`estimate`)."""
        out: dict[str, float] = {}
        for model, measures in self.measures().items():
            value = estimate(measures)
            if value is not None:
                out[model] = value
        return out


__all__ = ["KEEP", "LOCAL", "SOURCES", "TABLES", "LoadStore", "ModelLoad", "estimate"]
