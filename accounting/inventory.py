"""The node inventory over time (`NodeSpan`): the nodes in service at each ingest, each
node's pool, GPU type and GPU count, opened and closed as they change. The ledger's
capacity where slurmdbd keeps no events (`[accounting] capacity = "inventory"`), and the
pool of every node's capacity where it does (`accounting.capacity`). Written in the
ingest's own transaction (`accounting.ingest`) or alone (`record_inventory`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, insert, select, update

from accounting.buckets import utc
from accounting.errors import LedgerError
from accounting.schema import NodeSpan
from bridge.db import write_transaction

SPANS = NodeSpan.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """One node in service: its pool, GPU type and GPU count."""

    node: str
    pool: str
    gpu_type: str
    gpus: int


@dataclass(frozen=True)
class Inventory:
    """The nodes in service at `at`, to record with an ingest (see `record_inventory`).
    A node seen for the first time is taken to have been there since `backfill_from`
    (when given and earlier), else since its `first_seen` time (when earlier: the first
    job run it is known to have run), else since `at`."""

    cluster: str
    nodes: Sequence[NodeCapacity]
    at: datetime
    backfill_from: datetime | None = None
    first_seen: Mapping[str, datetime] | None = None


def record_inventory(
    engine: Engine,
    cluster: str,
    nodes: Iterable[NodeCapacity],
    at: datetime,
    *,
    backfill_from: datetime | None = None,
) -> int:
    """Record the inventory seen at `at`; returns the spans opened or closed. A node seen
    for the first time is taken to have been there since `backfill_from` (when given and
    earlier): the first ingest of a window then has the window's capacity."""
    with write_transaction(engine) as conn:
        return record_spans(conn, Inventory(cluster, list(nodes), at, backfill_from))


def record_spans(conn: Connection, inv: Inventory) -> int:
    at = utc(inv.at)
    first = min(utc(inv.backfill_from), at) if inv.backfill_from else at
    seen_at = {node: min(utc(t), first) for node, t in (inv.first_seen or {}).items()}
    cluster = inv.cluster
    changes = 0
    open_spans = {
        r.node: r
        for r in conn.execute(
            select(SPANS).where(SPANS.c.cluster == cluster, SPANS.c.end.is_(None))
        )
    }
    known = set(conn.scalars(select(SPANS.c.node).where(SPANS.c.cluster == cluster).distinct()))
    seen = set()
    for n in inv.nodes:
        if n.gpus < 0:
            raise LedgerError(f"node {n.node}: negative GPU count {n.gpus}")
        seen.add(n.node)
        cur = open_spans.get(n.node)
        if cur is not None and (cur.pool, cur.gpu_type, cur.gpus) == (n.pool, n.gpu_type, n.gpus):
            continue
        if cur is not None:
            conn.execute(update(SPANS).where(SPANS.c.id == cur.id).values(end=at))
            changes += 1
        conn.execute(
            insert(SPANS).values(
                cluster=cluster, node=n.node, pool=n.pool, gpu_type=n.gpu_type, gpus=n.gpus,
                start=seen_at.get(n.node, first) if n.node not in known else at, end=None,
            )
        )  # fmt: skip
        changes += 1
    for name, cur in open_spans.items():
        if name not in seen:
            conn.execute(update(SPANS).where(SPANS.c.id == cur.id).values(end=at))
            changes += 1
    return changes
