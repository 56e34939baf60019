"""The lending view ("what elasticity costs"): per lending pool, how much GPU time was lent
to Triton over a report window, and how much of it the lend's transitions took.

A `Section` (`accounting.section`) shown beside a ledger report, built from two sources:

- the ledger: `lent_gpu_hours` and `borrowers` are its rows that carry a lease (the
  borrowing models' serving time, booked to the pool the node was lent from);
- the lease history (`bridge.leases`): each lease's time in each state, clipped to the
  window and multiplied by the node's GPUs (its latest `node_span` in the window), gives
  three phases (a lease of some of a node's GPUs counts those, a MIG slice its share of
  a GPU: `lease_gpus`):

  - `wait`: from the request until the Triton job starts (requested, submitted): the
    preemption grace and requeue in preempt mode, the wait for a drained node in drain
    mode. Not in the serving job: the displaced elastic job, or the ledger's `fenced`
    line, already holds it.
  - `startup`: starting -> serving (Triton's start and model load); inside the serving job.
  - `drain`: from leaving serving until returned (draining, releasing); inside the
    serving job.

  Time in `serving` is no overhead and is not counted here. A lease that failed or never
  served: its phases end at the state it reached. Once its job has started (it reached
  `starting`), every later state but serving (draining, releasing, failed) counts as
  drain; before that, all its time, including releasing or failed, counts as wait (no
  job ran on the node). So requested -> submitted -> starting -> failed -> returned is
  wait, then startup up to the failure, then drain until returned.

The work is split in two: `phase_gpu_ms`, a pure core (no SQL) from lease timelines and
node GPUs to GPU-ms per pool and phase, and `lending_section`, the reader that feeds it
from the two databases and prices the result. Times are timezone-aware UTC; amounts are
integer GPU-milliseconds, split at hours exactly as the ledger splits (`split_ms`).

It lives in `bridge/`, not `accounting/`, because it reads the lease store, which the
ledger must not import (an import-linter contract).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, col, or_, select

from accounting.buckets import MS_PER_HOUR, split_ms, utc
from accounting.errors import RateError
from accounting.rates import RateBook, cost, money
from accounting.report import LENT, Window, build_report
from accounting.schema import NodeSpan
from accounting.section import Section
from bridge.leases.models import Lease, LeaseEvent
from bridge.lifecycle import LeaseState
from bridge.slurm.slices import SliceRules, is_mig_type, parse_mig_profile, slice_share

__all__ = [
    "LeaseTimeline",
    "NodeGpus",
    "PoolPhases",
    "lease_gpus",
    "lending_section",
    "phase_gpu_ms",
    "read_timelines",
]

#: the pool column of the total row
TOTAL = "(total)"
KEY = "lending"
TITLE = "Lending: time lent and what the transitions cost"

_S = LeaseState
#: states that mean the lease's Triton job has started on the node
_STARTED = frozenset({_S.STARTING, _S.SERVING, _S.DRAINING})


# ---- the pure core ---------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseTimeline:
    """One lease's status changes: (time, state entered), creation first."""

    lease_id: int
    node: str
    #: the pool the node was lent from
    pool: str
    changes: tuple[tuple[datetime, LeaseState], ...]
    #: a gang's other nodes (their GPUs count with `node`'s)
    members: tuple[str, ...] = ()
    #: GPUs of the node it holds (`Lease.gpus`: a partial lend, its node's other GPUs
    #: left to their jobs); None: the whole node
    gpus: int | None = None
    #: the GRES type of its `gpus` (`Lease.gpu_type`: a MIG slice books its share of a
    #: GPU, `bridge.slurm.slices`); None: whole GPUs
    gpu_type: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.members)

    @staticmethod
    def of(lease: Lease, events: Iterable[LeaseEvent]) -> LeaseTimeline:
        """From the store's rows (events in the order they happened)."""
        assert lease.id is not None
        changes = tuple((utc(e.at), LeaseState(e.to_state)) for e in events)
        members = tuple(lease.members or ())
        return LeaseTimeline(
            lease.id, lease.node, lease.pool, changes, members, lease.gpus, lease.gpu_type
        )


@dataclass(frozen=True)
class NodeGpus:
    gpus: int
    gpu_type: str


@dataclass
class PoolPhases:
    """One pool's leases within a window: how many, and GPU-ms per phase."""

    leases: int = 0
    wait_ms: int = 0
    startup_ms: int = 0
    drain_ms: int = 0
    #: startup + drain GPU-ms per (GPU type, UTC day): what pricing needs
    transition_by_day: dict[tuple[str, date], int] = field(default_factory=dict)
    #: nodes of its leases whose GPUs are unknown (counted as 0 GPUs)
    unknown_nodes: set[str] = field(default_factory=set)

    @property
    def transition_ms(self) -> int:
        return self.startup_ms + self.drain_ms


def _phase(state: LeaseState, started: bool) -> str | None:
    """The phase time in `state` counts to (None: serving or returned, not overhead)."""
    if state in (_S.SERVING, _S.RETURNED):
        return None
    if state == _S.STARTING:
        return "startup"
    return "drain" if started else "wait"


def lease_gpus(lease: LeaseTimeline, node: NodeGpus, rules: SliceRules) -> Fraction:
    """The GPUs a lease's phases book: its node's (a gang's: all its nodes'), a partial
    lease's own `gpus` (at most its node's), and a lease of MIG slices each slice's share
    of a GPU by `rules` (`bridge.slurm.slices`, as the ledger books the slice's job)."""
    if lease.gpus is None or node.gpus == 0:
        return Fraction(node.gpus)
    if lease.gpu_type is not None and is_mig_type(lease.gpu_type):
        share = slice_share(parse_mig_profile(lease.gpu_type), rules, node.gpu_type or None)
        return lease.gpus * share
    return Fraction(min(lease.gpus, node.gpus))


def phase_gpu_ms(
    leases: Iterable[LeaseTimeline],
    nodes: Mapping[str, NodeGpus],
    start: datetime,
    end: datetime,
    rules: SliceRules | None = None,
) -> dict[str, PoolPhases]:
    """Per pool, the leases whose lifetime overlaps [start, end) and the GPU-ms of their
    wait, startup and drain phases within it (each stretch clipped to the window, times the
    GPUs the lease holds, `lease_gpus`, from its node's in `nodes`; a node not there counts
    0 GPUs and is named in `unknown_nodes`). A lease not yet returned stays in its last
    state until `end`. `rules`: a MIG slice's share of a GPU (default: compute, 1g of 7
    is 1/7)."""
    rules = rules or SliceRules()
    start, end = utc(start), utc(end)
    out: dict[str, PoolPhases] = {}
    if end <= start:
        return out
    for lease in leases:
        if not lease.changes:
            continue
        created = lease.changes[0][0]
        last_at, last_state = lease.changes[-1]
        returned = last_at if last_state == _S.RETURNED else None
        if created >= end or (returned is not None and returned <= start):
            continue
        pool = out.setdefault(lease.pool, PoolPhases())
        pool.leases += 1
        known = [nodes[n] for n in lease.nodes if n in nodes]
        pool.unknown_nodes.update(n for n in lease.nodes if n not in nodes)
        # (a gang's nodes together: the GPUs of each, the type of its first known)
        node = NodeGpus(sum(k.gpus for k in known), known[0].gpu_type if known else "")
        gpus = lease_gpus(lease, node, rules)
        started = False
        stops = [at for at, _ in lease.changes[1:]] + [end]
        for (at, state), until in zip(lease.changes, stops, strict=True):
            started = started or state in _STARTED
            phase = _phase(state, started)
            if phase is None or gpus == 0:
                continue
            for bucket, ms in split_ms(max(at, start), min(until, end)):
                gpu_ms = int(ms * gpus)
                if phase == "wait":
                    pool.wait_ms += gpu_ms
                    continue
                if phase == "startup":
                    pool.startup_ms += gpu_ms
                else:
                    pool.drain_ms += gpu_ms
                key = (node.gpu_type, bucket.date())
                pool.transition_by_day[key] = pool.transition_by_day.get(key, 0) + gpu_ms
    return out


# ---- the reader ------------------------------------------------------------------------


def read_timelines(leases: Engine, start: datetime, end: datetime) -> list[LeaseTimeline]:
    """The leases created before `end` and not returned by `start`, with their history."""
    with Session(leases) as session:
        rows = session.exec(
            select(Lease)
            .where(col(Lease.created_at) < end)
            .where(or_(col(Lease.state) != _S.RETURNED, col(Lease.updated_at) > start))
            .order_by(col(Lease.id))
        ).all()
        ids = [lease.id for lease in rows]
        events: dict[int, list[LeaseEvent]] = defaultdict(list)
        for i in range(0, len(ids), 500):
            query = select(LeaseEvent).where(col(LeaseEvent.lease_id).in_(ids[i : i + 500]))
            for event in session.exec(query.order_by(col(LeaseEvent.id))):
                events[event.lease_id].append(event)
    return [LeaseTimeline.of(lease, events[lease.id]) for lease in rows if lease.id is not None]


def _node_gpus(
    ledger: Engine, nodes: Sequence[str], window: Window, cluster: str
) -> dict[str, NodeGpus]:
    """Each node's GPUs from its latest `node_span` overlapping the window."""
    out: dict[str, NodeSpan] = {}
    with Session(ledger) as session:
        for i in range(0, len(nodes), 500):
            query = select(NodeSpan).where(
                col(NodeSpan.node).in_(nodes[i : i + 500]),
                col(NodeSpan.start) < window.end,
                or_(col(NodeSpan.end).is_(None), col(NodeSpan.end) > window.start),
            )
            if cluster:
                query = query.where(NodeSpan.cluster == cluster)
            for span in session.exec(query):
                seen = out.get(span.node)
                if seen is None or span.start > seen.start:
                    out[span.node] = span
    return {node: NodeGpus(span.gpus, span.gpu_type) for node, span in out.items()}


def _lent(
    ledger: Engine, window: Window, cluster: str
) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Per pool, the GPU-ms of the ledger's lent rows (report key `lent`) and their teams."""
    filters = {"lent": LENT, **({"cluster": cluster} if cluster else {})}
    report = build_report(ledger, window, ("pool", "team"), filters=filters)
    gpu_ms: dict[str, int] = defaultdict(int)
    teams: dict[str, set[str]] = defaultdict(set)
    for line in report.lines:
        gpu_ms[line.keys["pool"]] += line.gpu_ms
        if line.keys["team"]:
            teams[line.keys["pool"]].add(line.keys["team"])
    return gpu_ms, teams


def _hours(ms: int) -> float:
    return ms / MS_PER_HOUR


def lending_section(
    ledger: Engine,
    leases: Engine,
    window: Window,
    rates: RateBook | None,
    cluster: str = "",
    *,
    now: datetime | None = None,
    rules: SliceRules | None = None,
) -> Section:
    """The lending view over `window`: one row per lending pool and a total row.
    `cluster` narrows the ledger rows and the node inventory (leases have no cluster).
    Leases not yet returned are counted up to `now` (default: the current time). `rules`:
    what a MIG slice books (`[accounting.slices]`; default: its compute share)."""
    now = utc(now) if now is not None else datetime.now(UTC)
    until = max(window.start, min(window.end, now))
    timelines = read_timelines(leases, window.start, until)
    nodes = _node_gpus(ledger, sorted({n for t in timelines for n in t.nodes}), window, cluster)
    phases = phase_gpu_ms(timelines, nodes, window.start, until, rules)
    lent, teams = _lent(ledger, window, cluster)
    columns = (
        "pool", "leases", "lent_gpu_hours", "borrowers", "wait_gpu_hours", "startup_gpu_hours",
        "drain_gpu_hours", "transition_gpu_hours", "transition_share",
    ) + (("transition_cost",) if rates else ())  # fmt: skip
    notes = [
        "lent_gpu_hours: the ledger's rows with a lease, booked to the pool the node was "
        "lent from (the borrowing models' serving time); borrowers: their teams",
        "wait: from the lend's request until its Triton job started (preempt: the grace "
        "and requeue of the displaced elastic jobs; drain: waiting for the node to be "
        "free); not in the serving job: the displaced job or the ledger's fenced line "
        "holds it",
        "startup: starting until serving (Triton's start and model load); drain: from "
        "leaving serving until returned (draining, releasing); both are already inside "
        "the serving job's time, so transition_share = (startup + drain) / lent",
        "a lease that failed or never served: time after its job started counts as drain "
        "(a failure's cleanup too), time before as wait",
        "each phase is clipped to the window and counts the node's GPUs (its latest "
        "node_span in the window); a lease not yet returned counts up to now",
    ]
    if not rates:
        notes.append("no rates defined: GPU-hours only")
    unknown = sorted(set().union(*(p.unknown_nodes for p in phases.values())))
    if unknown:
        notes.append(
            f"no node_span in the window for node(s) {', '.join(unknown)}: their leases' "
            "phases count 0 GPUs"
        )

    rows: list[dict[str, Any]] = []
    total = PoolPhases()
    total_cost: Decimal | None = Decimal(0)
    for pool in sorted(set(phases) | set(lent)):
        p = phases.get(pool, PoolPhases())
        row = _row(pool, p, lent.get(pool, 0), teams.get(pool, set()))
        if rates:
            try:
                amount = _transition_cost(p, pool, rates)
            except RateError as exc:
                notes.append(f"pool {pool}: no transition_cost: {exc}")
                total_cost = None
            else:
                row["transition_cost"] = money(amount)
                total_cost = None if total_cost is None else total_cost + amount
        rows.append(row)
        total.leases += p.leases
        total.wait_ms += p.wait_ms
        total.startup_ms += p.startup_ms
        total.drain_ms += p.drain_ms
    if rows:
        row = _row(TOTAL, total, sum(lent.values()), set().union(*teams.values()))
        if rates and total_cost is not None:
            row["transition_cost"] = money(total_cost)
        rows.append(row)
    return Section(
        key=KEY,
        title=TITLE,
        columns=columns,
        rows=rows,
        notes=notes,
    )


def _transition_cost(p: PoolPhases, pool: str, rates: RateBook) -> Decimal:
    """Unrounded: each day's startup + drain GPU-ms at the rate of the node's GPU type in
    the lease's pool that day (QOS "": the lend has none)."""
    return sum(
        (
            cost(ms, rates.price(gpu_type, pool, "", day))
            for (gpu_type, day), ms in sorted(p.transition_by_day.items())
        ),
        Decimal(0),
    )


def _row(pool: str, p: PoolPhases, lent_ms: int, teams: set[str]) -> dict[str, Any]:
    return {
        "pool": pool,
        "leases": p.leases,
        "lent_gpu_hours": _hours(lent_ms),
        "borrowers": ", ".join(sorted(teams)),
        "wait_gpu_hours": _hours(p.wait_ms),
        "startup_gpu_hours": _hours(p.startup_ms),
        "drain_gpu_hours": _hours(p.drain_ms),
        "transition_gpu_hours": _hours(p.transition_ms),
        "transition_share": p.transition_ms / lent_ms if lent_ms else None,
    }
