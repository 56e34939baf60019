"""Capacity, down time and idle time per hour from Slurm's own records: the events slurmdbd
keeps (`sacctmgr show event`), counted the way slurmdbd's hourly rollup counts them for
`sreport -T gres/gpu cluster Utilization` (Slurm 22.05, as_mysql_rollup.c). Pure: the
ingest reads the events and the node inventory from the ledger and writes what this returns.

- Capacity: a node has capacity only while a "Cluster Registered TRES" event (a cluster
  event with state 0) lists it, so a cluster that did not exist yet, or a node not yet
  added, books nothing. Its pool, GPU type and GPU count come from the ledger's node
  inventory (`NodeSpan`) at that time, or the nearest record of the node. A MIG slice
  counts 1 in Slurm's figures and its fraction of a GPU in the ledger's (`units_of`).
- Down time: each node event (not MAINT) over the time the cluster was registered, the
  node's GPUs from the event's TRES, in one of four lines that together are sreport's Down
  and PLND Down: `down` (DOWN, FAIL, not responding), `drained` (an administrator's drain),
  `fenced` (a drain the bridge set: its reason begins "stb:"), `planned_down` (FUTURE, or a
  cloud node powered down). Slurm records a drain only once the node's jobs have ended, so
  a draining node is not down.
- Per cell (cluster, pool, GPU type, hour), as the rollup does for the cluster: allocation
  first; down lines take what is left of the capacity (down, drained, fenced, in that
  order, then planned_down); idle is the rest. sreport clamps the whole cluster at once,
  the ledger each pool: they differ only where one pool's allocation and down time exceed
  its capacity while another pool has room (docs/finance/sreport.md).
- slurmctld disconnected (`TrackSlurmctldDown=yes` in slurmdbd.conf; `SlurmEvent.
  is_disconnect`): when slurmctld's connection to slurmdbd closes, slurmdbd inserts a
  cluster event with node name "", no cluster nodes, state NODE_STATE_DOWN, reason
  "slurmctld disconnect", user none (reason_uid NO_VAL) and the cluster's registered TRES
  (as_mysql_cluster.c at slurm-22-05-8-1, `as_mysql_fini_ctld` l. 1588-1622; called from
  slurmdbd's rpc_mgr.c l. 154 and slurmdbd.c l. 687). The registration stays open. slurmctld
  registering again ends it (same TRES and nodes: l. 1754-1766; changed: every open event
  ends, l. 1724-1731). The rollup (as_mysql_rollup.c) counts a cluster event with a state
  as a disconnect (l. 937-952), its TRES x seconds in the hour (l. 960, 309-323); takes
  from it each job's TRES x the seconds the job ran in it (l. 1510-1534) and, for each
  node event (not MAINT) over it, the *cluster's* count x the seconds of overlap (l.
  1051-1069), never below 0 (l. 170-173); and adds the rest to the cluster's Down (l.
  1768-1781), clamped with the rest after allocation (l. 568-600). So the ledger books, per
  disconnect and cell: the registered capacity over the disconnect, less the allocation
  of the job runs in it (`RunAlloc`, pro rata over each run's time in the hour) and less
  the cell's capacity over each node event's overlap, never below 0, as `down` with user
  `DISCONNECT_USER` (slurmdbd records none), then clamped with the other down lines after
  allocation. The rollup takes from the cluster as a whole, the ledger per cell: they
  differ only where one cell's deductions exceed its part of the disconnect while
  another's do not. Without `allocations` the jobs in the gap are not taken from it (their
  GPUs would be booked down where they ran: the caller passes them).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction

from accounting.attribution import Entry, capacity_ms
from accounting.buckets import utc
from accounting.errors import LedgerError
from accounting.schema import DOWN_TEAM, DOWN_WORKLOADS, IDLE_TEAM
from bridge.slurm.model import (
    BRIDGE_TAG,
    NODE_STATE_BASE,
    NODE_STATE_CLOUD,
    NODE_STATE_DOWN,
    NODE_STATE_DRAIN,
    NODE_STATE_FAIL,
    NODE_STATE_FUTURE,
    NODE_STATE_MAINT,
    NODE_STATE_POWERED_DOWN,
    SlurmEvent,
)
from bridge.slurm.slices import SliceError, SliceRules, unit_share

#: the pool of capacity on a node the inventory never recorded
UNKNOWN_POOL = "(unknown)"
#: the `user` of a slurmctld disconnect's down line (slurmdbd records no one): tells it
#: from a node's own down time in the ledger
DISCONNECT_USER = "(slurmctld)"

Cell = tuple[str, str, str, datetime]  # cluster, pool, gpu_type, hour
#: a capacity span: cluster, pool, gpu_type, GPUs, start, end
_Span = tuple[str, str, str, int, datetime, datetime]

HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class NodeAttrs:
    """What the inventory recorded of a node from `start` (to `end`, None: still): its
    pool, GPU type and count, and the node's other GPU types with theirs (`more`: MIG
    slices of other profiles on the same node)."""

    start: datetime
    end: datetime | None
    pool: str
    gpu_type: str
    gpus: int
    more: tuple[tuple[str, int], ...] = ()

    @property
    def types(self) -> tuple[tuple[str, int], ...]:
        """(GPU type, count) of every type on the node, this record's first."""
        return ((self.gpu_type, self.gpus), *self.more)


def units_of(rules: SliceRules) -> Callable[[str], Fraction]:
    """GPU type -> the GPUs one unit of it is (`bridge.slurm.slices.unit_share`: 1 for a
    whole GPU, a MIG slice's fraction), cached; a slice the rules cannot price is a
    LedgerError naming it."""
    cache: dict[str, Fraction] = {}

    def unit(gpu_type: str) -> Fraction:
        hit = cache.get(gpu_type)
        if hit is None:
            try:
                hit = cache[gpu_type] = unit_share(gpu_type, rules)
            except SliceError as exc:
                raise LedgerError(f"capacity of GPU type {gpu_type!r}: {exc}") from exc
        return hit

    return unit


def _down_parts(attrs: NodeAttrs | None, gpus: int) -> list[tuple[str, int]]:
    """A node event's GPUs (the node's gres/gpu, a slice counted 1) by the node's GPU
    types, in the inventory's order: all of them under its one type, as before; on a node
    of several types each type up to its count."""
    if attrs is None:
        return [("gpu", gpus)]
    if not attrs.more:
        return [(attrs.gpu_type, gpus)]
    out, left = [], gpus
    for gpu_type, count in attrs.types:
        take = min(count, left)
        if take > 0:
            out.append((gpu_type, take))
            left -= take
    if left > 0:
        out.append((attrs.gpu_type, left))
    return out


@dataclass(frozen=True, slots=True)
class RunAlloc:
    """A job run's allocated GPU-ms in one cell (its ledger rows there, summed), with the
    run's [start, end) (end None: still running). Taken from a slurmctld disconnect over it
    pro rata to the run's time in the cell's hour (a run's GPUs do not change)."""

    cell: Cell
    gpu_ms: int
    start: datetime
    end: datetime | None


def down_class(event: SlurmEvent) -> str | None:
    """The down line a node event books to, or None when the rollup ignores it (MAINT)."""
    raw = event.state_raw
    if raw & NODE_STATE_MAINT:
        return None
    base = raw & NODE_STATE_BASE
    if base == NODE_STATE_FUTURE or (raw & NODE_STATE_CLOUD and raw & NODE_STATE_POWERED_DOWN):
        return "planned_down"
    if raw & NODE_STATE_DRAIN and base != NODE_STATE_DOWN and not raw & NODE_STATE_FAIL:
        return "fenced" if event.reason.startswith(BRIDGE_TAG) else "drained"
    return "down"


class _Inventory:
    """A node's recorded attributes over time; the nearest record outside them."""

    def __init__(self, attrs: Mapping[str, Sequence[NodeAttrs]]) -> None:
        self._by_node = {n: sorted(a, key=lambda x: utc(x.start)) for n, a in attrs.items() if a}
        self._starts = {n: [utc(x.start) for x in a] for n, a in self._by_node.items()}

    def pieces(
        self, node: str, start: datetime, end: datetime
    ) -> list[tuple[datetime, datetime, NodeAttrs | None]]:
        """[start, end) cut where the node's attributes change; each piece with the record
        in force (the first record before it begins, the last after it ends)."""
        records = self._by_node.get(node)
        if not records:
            return [(start, end, None)]
        starts = self._starts[node]
        out: list[tuple[datetime, datetime, NodeAttrs | None]] = []
        t = start
        while t < end:
            i = bisect_right(starts, t) - 1
            cur = records[max(i, 0)]
            nxt = starts[i + 1] if i + 1 < len(starts) else None
            stop = min(end, nxt) if nxt is not None and nxt > t else end
            out.append((t, stop, cur))
            t = stop
        return out


def _clip(
    start: datetime, end: datetime | None, lo: datetime, hi: datetime
) -> tuple[datetime, datetime] | None:
    s = max(utc(start), lo)
    e = min(utc(end), hi) if end is not None else hi
    return (s, e) if e > s else None


def event_capacity(
    events: Sequence[SlurmEvent],
    attrs: Mapping[str, Sequence[NodeAttrs]],
    start: datetime,
    end: datetime,
    allocations: Iterable[RunAlloc] = (),
    *,
    hull: bool = False,
    unit: Callable[[str], Fraction] | None = None,
) -> tuple[dict[Cell, int], dict[tuple[Cell, str, str], int]]:
    """Capacity per cell, and raw (unclamped) down time per (cell, down line, who set it),
    in GPU-ms over [start, end), from the events. Capacity of a node with no inventory
    record goes to pool `UNKNOWN_POOL`, its GPUs the event's total less the known nodes'
    (shared evenly among the unknown ones). A slurmctld disconnect books `down` over the
    registered capacity less the job runs in `allocations` and the node events over it
    (module docstring).

    Node events count while the cluster was registered; `hull` (for one hour, as
    slurmdbd's rollup counts them): from the first registration's start to the last
    one's end in [start, end), gaps between registrations included (as_mysql_rollup.c's
    `c_usage` spans them).

    `unit` (`units_of`): the GPUs one unit of a type is; a MIG slice type's capacity and
    down time book its fraction of a GPU per slice (`attribution.capacity_ms`)."""
    lo, hi = utc(start), utc(end)
    inv = _Inventory(attrs)
    spans: list[_Span] = []
    registered: list[tuple[datetime, datetime]] = []
    node_events = [ev for ev in events if not ev.is_cluster]
    # slurmctld-disconnected cluster events (TrackSlurmctldDown) are no capacity of their
    # own: they book down within it (`_disconnect_down`)
    cluster_events = sorted((ev for ev in events if ev.is_registration), key=lambda e: utc(e.start))
    for i, ev in enumerate(cluster_events):
        # Slurm closes one registration before it opens the next; should two overlap, the
        # later one holds from its start
        nxt = cluster_events[i + 1].start if i + 1 < len(cluster_events) else None
        stop = ev.end if nxt is None or (ev.end is not None and ev.end <= nxt) else nxt
        clip = _clip(ev.start, stop, lo, hi)
        if clip is None:
            continue
        registered.append(clip)
        unknown = []
        known_gpus = 0
        for node in ev.nodes:
            for s, e, a in inv.pieces(node, *clip):
                if a is None:
                    unknown.append((node, s, e))
                    continue
                for gpu_type, count in a.types:
                    known_gpus += count if s == clip[0] else 0
                    spans.append((ev.cluster, a.pool, gpu_type, count, s, e))
        if unknown:
            nodes = sorted({n for n, _, _ in unknown})
            share, extra = divmod(max(0, ev.gpus - known_gpus), len(nodes))
            gpus = {n: share + (1 if i < extra else 0) for i, n in enumerate(nodes)}
            for node, s, e in unknown:
                spans.append((ev.cluster, UNKNOWN_POOL, "gpu", gpus[node], s, e))
    capacity = capacity_ms(spans, lo, hi, unit)
    registered.sort()
    if hull and registered:
        registered = [(registered[0][0], max(r_hi for _, r_hi in registered))]
    down_spans: dict[tuple[str, str], list[tuple[str, str, str, int, datetime, datetime]]] = (
        defaultdict(list)
    )
    for ev in node_events:
        line = down_class(ev)
        if line is None or ev.gpus <= 0:
            continue
        for r_lo, r_hi in registered:
            clip = _clip(ev.start, ev.end, r_lo, r_hi)
            if clip is None:
                continue
            for s, e, a in inv.pieces(ev.node, *clip):
                pool = a.pool if a else UNKNOWN_POOL
                for gpu_type, count in _down_parts(a, ev.gpus):
                    down_spans[(line, ev.user)].append((ev.cluster, pool, gpu_type, count, s, e))
    down: dict[tuple[Cell, str, str], int] = defaultdict(int)
    for (line, user), pieces in down_spans.items():
        for cell, ms in capacity_ms(pieces, lo, hi, unit).items():
            if ms:
                down[(cell, line, user)] += ms
    disconnects = [ev for ev in events if ev.is_disconnect]
    if disconnects and spans:
        runs = list(allocations)
        counted = [ev for ev in node_events if not ev.state_raw & NODE_STATE_MAINT]
        for ev in disconnects:
            for cell, ms in _disconnect_down(ev, spans, counted, runs, lo, hi, unit).items():
                down[(cell, "down", ev.user or DISCONNECT_USER)] += ms
    return capacity, dict(down)


def _within(spans: Sequence[_Span], lo: datetime, hi: datetime) -> list[_Span]:
    """The spans' parts in [lo, hi)."""
    out = []
    for cluster, pool, gpu_type, gpus, s, e in spans:
        clip = _clip(s, e, lo, hi)
        if clip is not None:
            out.append((cluster, pool, gpu_type, gpus, *clip))
    return out


def _disconnect_down(
    ev: SlurmEvent,
    spans: Sequence[_Span],
    node_events: Sequence[SlurmEvent],
    runs: Sequence[RunAlloc],
    lo: datetime,
    hi: datetime,
    unit: Callable[[str], Fraction] | None = None,
) -> dict[Cell, int]:
    """One slurmctld disconnect's down time per cell, as the rollup books it: the
    registered capacity over it, less each node event's overlap with it (the capacity over
    the overlap) and the job runs in it, never below 0 (module docstring)."""
    gap = _clip(ev.start, ev.end, lo, hi)
    if gap is None:
        return {}
    mine = [s for s in spans if s[0] == ev.cluster]
    raw = capacity_ms(_within(mine, *gap), lo, hi, unit)
    cut: dict[Cell, int] = defaultdict(int)
    for nev in node_events:
        if nev.cluster != ev.cluster:
            continue
        over = _clip(nev.start, nev.end, *gap)
        if over is not None:
            for cell, ms in capacity_ms(_within(mine, *over), lo, hi, unit).items():
                cut[cell] += ms
    for run in runs:
        if run.cell not in raw or run.gpu_ms <= 0:
            continue
        hour = utc(run.cell[3])
        in_hour = _clip(run.start, run.end, hour, min(hour + HOUR, hi))
        if in_hour is None:
            continue
        over = _clip(in_hour[0], in_hour[1], *gap)
        if over is not None:
            cut[run.cell] += run.gpu_ms * _span_ms(*over) // _span_ms(*in_hour)
    return {cell: ms - cut[cell] for cell, ms in raw.items() if ms > cut[cell]}


def _span_ms(s: datetime, e: datetime) -> int:
    return (e - s) // timedelta(milliseconds=1)


def capacity_entries(
    capacity: Mapping[Cell, int],
    allocated: Mapping[Cell, int],
    down: Mapping[tuple[Cell, str, str], int] | None = None,
) -> tuple[list[Entry], dict[Cell, int]]:
    """Down and idle entries per cell: allocation first, then the down lines in the order
    of `DOWN_WORKLOADS` (each who-set-it in name order) up to the capacity, idle the rest.
    Also the over-allocated cells (allocation above capacity, or with no capacity at all:
    those book neither down nor idle)."""
    by_cell: dict[Cell, list[tuple[int, str, str, int]]] = defaultdict(list)
    for (cell, line, user), ms in (down or {}).items():
        by_cell[cell].append((DOWN_WORKLOADS.index(line), user, line, ms))
    entries: list[Entry] = []
    over: dict[Cell, int] = {}
    for cell, used in allocated.items():
        if used > 0 and cell not in capacity:
            over[cell] = used
    for cell, cap in sorted(capacity.items()):
        used = allocated.get(cell, 0)
        if used > cap:
            over[cell] = used - cap
        left = max(0, cap - used)
        for _, user, line, ms in sorted(by_cell.get(cell, ())):
            take = min(ms, left)
            if take:
                entries.append(_entry(cell, line, DOWN_TEAM, user, take))
                left -= take
        if left:
            entries.append(_entry(cell, "idle", IDLE_TEAM, "", left))
    return entries, over


def _entry(cell: Cell, workload: str, team: str, user: str, ms: int) -> Entry:
    cluster, pool, gpu_type, bucket = cell
    return Entry(
        bucket=bucket, cluster=cluster, pool=pool, partition="", workload=workload, account="",
        team=team, user=user, model="", gpu_type=gpu_type, qos="", lease="", gpu_ms=ms,
    )  # fmt: skip
