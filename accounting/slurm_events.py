"""slurmdbd's events in the ledger (`slurm_event`): stored at each ingest as Slurm last
reported them, read back for the capacity of the hours an ingest recomputes.

An event is keyed by cluster, node ("" for the cluster) and start; a re-read event whose
end, state, reason or GPUs changed (an open event that closed) is updated, and the hours it
covers are recomputed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, insert, select, update

from accounting.buckets import floor_hour, utc
from accounting.capacity import NodeAttrs
from accounting.schema import NodeSpan, SlurmEventRow
from bridge.slurm.hostlist import compress, expand
from bridge.slurm.model import SlurmEvent

EVENTS = SlurmEventRow.__table__  # type: ignore[attr-defined]
SPANS = NodeSpan.__table__  # type: ignore[attr-defined]
HOUR = timedelta(hours=1)


def _values(ev: SlurmEvent) -> dict[str, object]:
    return {
        "nodes": compress(ev.nodes) if ev.is_cluster else ev.node,
        "end": utc(ev.end) if ev.end else None,
        "state_raw": ev.state_raw,
        "state": ev.state,
        "user_name": ev.user,
        "reason": ev.reason,
        "gpus": ev.gpus,
    }


def store_events(
    conn: Connection, events: Iterable[SlurmEvent], horizon: datetime
) -> set[datetime]:
    """Insert new events, update changed ones; the hours whose capacity that changes (an
    open event's hours up to `horizon`)."""
    hours: set[datetime] = set()
    horizon = utc(horizon)
    for ev in events:
        key = (EVENTS.c.cluster == ev.cluster, EVENTS.c.node == ev.node,
               EVENTS.c.start == utc(ev.start))  # fmt: skip
        have = conn.execute(select(EVENTS).where(*key)).first()
        want = _values(ev)
        new_end = utc(ev.end) if ev.end else None
        stop = min(new_end, horizon) if new_end else horizon
        if have is None:
            conn.execute(
                insert(EVENTS).values(cluster=ev.cluster, node=ev.node, start=utc(ev.start), **want)
            )
            changed_from = utc(ev.start)
        else:
            old_end = utc(have.end) if have.end else None
            stored = {k: getattr(have, k) for k in want} | {"end": old_end}
            if stored == want:
                continue
            conn.execute(update(EVENTS).where(EVENTS.c.id == have.id).values(**want))
            ends = [e for e in (old_end, new_end) if e is not None]
            only_end = all(stored[k] == want[k] for k in want if k != "end")
            # an open event that closed changes its hours from the earlier end; the hours
            # it counted before reach as far as the horizon of that ingest, so recompute to now
            changed_from = min(ends) if only_end and ends else utc(ev.start)
            stop = horizon
        h = floor_hour(changed_from)
        while h < stop:
            hours.add(h)
            h += HOUR
    return hours


def clusters_with_events(conn: Connection) -> set[str]:
    """Clusters whose capacity comes from events: slurmdbd registered them at least once."""
    return set(
        conn.scalars(
            select(EVENTS.c.cluster).where(EVENTS.c.node == "", EVENTS.c.state_raw == 0).distinct()
        )
    )


def load_events(
    conn: Connection, clusters: Sequence[str], lo: datetime, hi: datetime
) -> list[SlurmEvent]:
    rows = conn.execute(
        select(EVENTS).where(
            EVENTS.c.cluster.in_(list(clusters)),
            EVENTS.c.start < hi,
            (EVENTS.c.end.is_(None)) | (EVENTS.c.end > lo),
        )
    ).all()
    return [
        SlurmEvent(
            cluster=r.cluster,
            node=r.node,
            nodes=tuple(expand(r.nodes)) if not r.node else (r.node,),
            start=utc(r.start),
            end=utc(r.end) if r.end else None,
            state_raw=int(r.state_raw),
            state=r.state,
            user=r.user_name,
            reason=r.reason,
            gpus=int(r.gpus),
        )
        for r in rows
    ]


def node_attrs(conn: Connection, cluster: str) -> dict[str, list[NodeAttrs]]:
    """Every node's recorded pool, GPU type and GPU count over time."""
    # a node's spans of one stretch (one per GPU type) open together: one record
    stretches: dict[tuple[str, datetime], list[Any]] = defaultdict(list)
    for r in conn.execute(select(SPANS).where(SPANS.c.cluster == cluster).order_by(SPANS.c.id)):
        stretches[(r.node, utc(r.start))].append(r)
    out: dict[str, list[NodeAttrs]] = defaultdict(list)
    for (node, start), rows in stretches.items():
        r = rows[0]
        out[node].append(
            NodeAttrs(
                start, utc(r.end) if r.end else None, r.pool, r.gpu_type, r.gpus,
                tuple((x.gpu_type, x.gpus) for x in rows[1:]),
            )
        )  # fmt: skip
    return dict(out)
