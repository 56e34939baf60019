"""The node inventory over time (`NodeSpan`): the nodes in service at each ingest, each
node's pool, GPU type and GPU count, opened and closed as they change. The ledger's
capacity where slurmdbd keeps no events (`[accounting] capacity = "inventory"`), and the
pool of every node's capacity where it does (`accounting.capacity`). Written in the
ingest's own transaction (`accounting.ingest`) or alone (`record_inventory`).

A node with GPUs of several types (MIG slices of several profiles:
`gpu:h100_4g.40gb:1,gpu:h100_1g.10gb:2`) has one span per type, opened and closed
together: a change to any of them closes them all and opens the new set."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from accounting.buckets import utc
from accounting.errors import LedgerError
from accounting.schema import NodeSpan
from bridge.db import write_transaction

SPANS = NodeSpan.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """One node in service: its pool, GPU type and GPU count (a node with GPUs of several
    types, MIG slices of several profiles, is one of these per type, a slice counted 1
    as Slurm counts it)."""

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
    open_spans: dict[str, list[Any]] = defaultdict(list)
    for r in conn.execute(select(SPANS).where(SPANS.c.cluster == cluster, SPANS.c.end.is_(None))):
        open_spans[r.node].append(r)
    known = set(conn.scalars(select(SPANS.c.node).where(SPANS.c.cluster == cluster).distinct()))
    by_node: dict[str, list[NodeCapacity]] = defaultdict(list)
    for n in inv.nodes:
        if n.gpus < 0:
            raise LedgerError(f"node {n.node}: negative GPU count {n.gpus}")
        by_node[n.node].append(n)
    for node, parts in by_node.items():
        cur = open_spans.get(node, [])
        if sorted((r.pool, r.gpu_type, r.gpus) for r in cur) == sorted(
            (n.pool, n.gpu_type, n.gpus) for n in parts
        ):
            continue
        for r in cur:
            conn.execute(update(SPANS).where(SPANS.c.id == r.id).values(end=at))
            changes += 1
        start = seen_at.get(node, first) if node not in known else at
        for n in parts:
            conn.execute(
                insert(SPANS).values(
                    cluster=cluster, node=node, pool=n.pool, gpu_type=n.gpu_type, gpus=n.gpus,
                    start=start, end=None,
                )
            )  # fmt: skip
            changes += 1
    for name, cur in open_spans.items():
        if name not in by_node:
            for r in cur:
                conn.execute(update(SPANS).where(SPANS.c.id == r.id).values(end=at))
                changes += 1
    return changes
