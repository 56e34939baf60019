"""Capacity and down time from slurmdbd's events (accounting.capacity), and the parsers of
`sacctmgr show event` and sreport output, on output recorded from the lab's Slurm 22.05."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.attribution import capacity_ms
from accounting.capacity import (
    DISCONNECT_USER,
    UNKNOWN_POOL,
    NodeAttrs,
    RunAlloc,
    capacity_entries,
    down_class,
    event_capacity,
)
from accounting.schema import DOWN_WORKLOADS
from bridge.slurm.errors import UnparseableOutput
from bridge.slurm.model import SlurmEvent
from bridge.slurm.sacctmgr import parse_sacctmgr_events
from bridge.slurm.sreport import parse_sreport_accounts, parse_sreport_utilization

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
H = timedelta(hours=1)
MS_H = 3_600_000


def _ev(node: str, start: datetime, end: datetime | None, raw: int, reason: str = "", *,
        nodes: tuple[str, ...] = (), gpus: int = 4, user: str = "root") -> SlurmEvent:  # fmt: skip
    return SlurmEvent(
        cluster="c", node=node, nodes=nodes or (node,), start=start, end=end, state_raw=raw,
        state="", user=user, reason=reason, gpus=gpus,
    )  # fmt: skip


def _cluster(
    start: datetime, end: datetime | None, nodes: tuple[str, ...], gpus: int
) -> SlurmEvent:
    return SlurmEvent("c", "", nodes, start, end, 0, "", "", "Cluster Registered TRES", gpus)


def _disconnect(start: datetime, end: datetime | None, gpus: int = 12) -> SlurmEvent:
    """What slurmdbd 22.05 inserts when slurmctld's connection closes (TrackSlurmctldDown):
    no node, no cluster nodes, state DOWN, the cluster's TRES, no user."""
    return SlurmEvent("c", "", (), start, end, 0x0001, "", "", "slurmctld disconnect", gpus)


ATTRS = {
    "n1": [NodeAttrs(T0 - 10 * H, None, "train", "h100", 4)],
    "n2": [NodeAttrs(T0 - 10 * H, None, "train", "h100", 4)],
    "n3": [NodeAttrs(T0 - 10 * H, None, "elastic", "h100", 4)],
}


def test_recorded_events_parse() -> None:
    events = parse_sacctmgr_events((DATA / "sacctmgr-events-22.05.txt").read_text())
    cluster = [e for e in events if e.is_cluster]
    assert len(cluster) == 1 and cluster[0].nodes == ("n1", "n2", "n3", "n4")
    assert cluster[0].gpus == 16 and cluster[0].end is None and cluster[0].state_raw == 0
    by_node = {e.node: e for e in events if not e.is_cluster}
    assert by_node["n2"].state == "DOWN*" and by_node["n2"].user == "root"
    assert by_node["n2"].end is not None and by_node["n2"].end > by_node["n2"].start
    assert [down_class(by_node[n]) for n in ("n1", "n2", "n4")] == ["drained", "down", "fenced"]


def test_event_reason_may_hold_the_separator() -> None:
    line = "Node|c||n1|1796087555|Unknown|514|DRAIN|alice(1000)|gres/gpu=4|a|b"
    (ev,) = parse_sacctmgr_events(line)
    assert ev.reason == "a|b" and ev.user == "alice" and ev.gpus == 4


@pytest.mark.parametrize(
    "line",
    [
        "Node|c||n1|2026-12-01T01:00:00|Unknown|514|DRAIN|root(0)|gres/gpu=4|x",  # not epoch
        "Node|c||n1|1796087555",  # cut short
        "Cluster|c|n1|n1|1796087555|Unknown|0|||gres/gpu=4|x",  # cluster event with a node
        "Node|c||n1|1796087555|Unknown|DRAIN|DRAIN|root(0)|gres/gpu=4|x",  # state not a number
    ],
)
def test_bad_event_lines_are_named(line: str) -> None:
    with pytest.raises(UnparseableOutput, match="sacctmgr show event"):
        parse_sacctmgr_events(line)


def test_sreport_lines() -> None:
    (u,) = parse_sreport_utilization("stblab|gres/gpu|100|20|0|3480|0|3600\n")
    assert (u.allocated, u.down, u.idle, u.reported) == (100, 20, 3480, 3600)
    accounts = parse_sreport_accounts(
        "stblab|root|||gres/gpu|50\nstblab|team-a|||gres/gpu|30\nstblab|team-a|alice|Alice|gres/gpu|30\n"
    )
    assert accounts == {"root": 50, "team-a": 30}
    with pytest.raises(UnparseableOutput, match="Utilization"):
        parse_sreport_utilization("stblab|cpu|1|2|3|4|5|6")


def test_states_map_to_sreport_lines() -> None:
    assert down_class(_ev("n", T0, None, 0x0001)) == "down"
    assert down_class(_ev("n", T0, None, 0x0801)) == "down"  # DOWN + not responding
    assert down_class(_ev("n", T0, None, 0x2002)) == "down"  # IDLE + FAIL
    assert down_class(_ev("n", T0, None, 0x0202, "maintenance")) == "drained"
    assert down_class(_ev("n", T0, None, 0x0202, "stb: lent")) == "fenced"
    assert down_class(_ev("n", T0, None, 0x0201, "stb: lent")) == "down"  # DOWN + DRAIN
    assert down_class(_ev("n", T0, None, 0x0006)) == "planned_down"  # FUTURE
    assert down_class(_ev("n", T0, None, 0x1082)) == "planned_down"  # CLOUD + POWERED_DOWN
    assert down_class(_ev("n", T0, None, 0x1002)) == "down"  # powered down, not cloud (22.05)
    assert down_class(_ev("n", T0, None, 0x8201)) is None  # MAINT: the rollup ignores it


def test_capacity_only_while_the_cluster_is_registered() -> None:
    """The first ingest of a new cluster books nothing before slurmdbd's first event (the
    bug: the whole look-back window was booked idle)."""
    start = T0 + timedelta(minutes=4, seconds=45)
    cap, down = event_capacity(
        [_cluster(start, None, ("n1", "n2", "n3"), 12)], ATTRS, T0, T0 + 2 * H
    )
    first = (H - timedelta(minutes=4, seconds=45)) // timedelta(milliseconds=1)
    assert cap[("c", "train", "h100", T0)] == 8 * first
    assert cap[("c", "elastic", "h100", T0)] == 4 * first
    assert cap[("c", "train", "h100", T0 + H)] == 8 * MS_H
    assert not down


def test_down_lines_clamped_after_allocation() -> None:
    events = [
        _cluster(T0, None, ("n1", "n2"), 8),
        _ev("n1", T0, T0 + timedelta(minutes=30), 0x0801),  # down half an hour
        _ev("n2", T0, None, 0x0202, "stb: lent"),  # fenced the whole hour
    ]
    cap, down = event_capacity(events, ATTRS, T0, T0 + H)
    cell = ("c", "train", "h100", T0)
    assert cap[cell] == 8 * MS_H
    assert down[(cell, "down", "root")] == 2 * MS_H and down[(cell, "fenced", "root")] == 4 * MS_H
    # 3 GPU-hours allocated: down (2) fits, fenced gets the rest (3), no idle
    entries, over = capacity_entries(cap, {cell: 3 * MS_H}, down)
    got = {e.workload: e.gpu_ms for e in entries}
    assert got == {"down": 2 * MS_H, "fenced": 3 * MS_H} and not over


def test_unknown_nodes_share_the_rest_of_the_registered_gpus() -> None:
    cap, _ = event_capacity([_cluster(T0, T0 + H, ("n1", "x1", "x2"), 10)], ATTRS, T0, T0 + H)
    assert cap[("c", "train", "h100", T0)] == 4 * MS_H
    assert cap[("c", UNKNOWN_POOL, "gpu", T0)] == 6 * MS_H


def test_disconnect_events_add_no_capacity() -> None:
    down_ev = SlurmEvent("c", "", ("n1",), T0, T0 + H, 1, "DOWN", "", "slurmctld disconnect", 4)
    cap, _ = event_capacity([down_ev], ATTRS, T0, T0 + H)
    assert cap == {}


# a "slurmctld disconnect" event as `sacctmgr -P -n show event Format=<EVENT_FIELDS>` prints
# it (event_functions.c at slurm-22-05-8-1: State empty for a cluster event, l. 483-490;
# User empty for reason_uid NO_VAL, l. 507-515; cluster_nodes never set, as_mysql_cluster.c
# l. 1618-1622)
DISCONNECT_LINE = (
    "Cluster|stblab|||1796090000|1796090180|1|||billing=32,cpu=32,energy=0,fs/disk=0,"
    "gres/gpu:h100=16,gres/gpu=16,mem=32G,node=4,pages=0,vmem=0|slurmctld disconnect"
)


def test_a_disconnect_is_not_a_registration_nor_the_other_way() -> None:
    (d,) = parse_sacctmgr_events(DISCONNECT_LINE)
    assert d.is_cluster and d.is_disconnect and not d.is_registration
    assert d.nodes == () and d.gpus == 16 and d.user == "" and d.state_raw == 1
    assert d.end is not None and (d.end - d.start).total_seconds() == 180
    (reg,) = [e for e in parse_sacctmgr_events((DATA / "sacctmgr-events-22.05.txt").read_text())
              if e.is_cluster]  # fmt: skip
    assert reg.is_registration and not reg.is_disconnect
    # a node event is neither, whatever its state; a MAINT cluster event the rollup skips
    assert not any(f(_ev("n1", T0, None, raw)) for raw in (0, 1)
                   for f in (SlurmEvent.is_registration.fget, SlurmEvent.is_disconnect.fget))  # type: ignore[attr-defined]  # fmt: skip
    maint = SlurmEvent("c", "", (), T0, None, 0x8001, "", "", "x", 4)
    assert not maint.is_disconnect and not maint.is_registration


def test_disconnect_between_registrations_books_down_on_the_registered_nodes() -> None:
    """slurmctld stopped at +5 min and came back at +20 min with a node more: slurmdbd ends
    the first registration and the disconnect then and opens a second registration. The
    gap is down on the nodes registered then (n1, n2), none on n3; nothing of it idle."""
    m = timedelta(minutes=1)
    events = [
        _cluster(T0 - H, T0 + 20 * m, ("n1", "n2"), 8),
        _disconnect(T0 + 5 * m, T0 + 20 * m, 8),
        _cluster(T0 + 20 * m, None, ("n1", "n2", "n3"), 12),
    ]
    cap, down = event_capacity(events, ATTRS, T0, T0 + H)
    train, elastic = ("c", "train", "h100", T0), ("c", "elastic", "h100", T0)
    assert cap == {train: 8 * MS_H, elastic: 4 * MS_H * 40 // 60}
    assert down == {(train, "down", DISCONNECT_USER): 8 * 15 * 60_000}
    entries, over = capacity_entries(cap, {}, down)
    got = {(e.pool, e.workload): e.gpu_ms for e in entries}
    # idle: the capacity outside the gap only
    assert got == {("train", "down"): 2 * MS_H, ("train", "idle"): 6 * MS_H,
                   ("elastic", "idle"): 4 * MS_H * 40 // 60}  # fmt: skip
    assert not over


def test_disconnect_leaves_out_the_jobs_running_in_it() -> None:
    """A 4-GPU job on n1 runs across a 30-minute gap: the rollup takes its GPUs x seconds
    from the disconnect (as_mysql_rollup.c l. 1510-1534), so Down is the free GPUs of the
    gap, the job stays allocated, and idle is only what was idle outside the gap."""
    m = timedelta(minutes=1)
    events = [_cluster(T0 - H, None, ("n1", "n2", "n3"), 12), _disconnect(T0 + 10 * m, T0 + 40 * m)]
    train, elastic = ("c", "train", "h100", T0), ("c", "elastic", "h100", T0)
    job = RunAlloc(train, 4 * 50 * 60_000, T0 - 30 * m, T0 + 50 * m)  # 4 GPUs, 50 min here
    cap, down = event_capacity(events, ATTRS, T0, T0 + H, [job])
    assert down == {
        (train, "down", DISCONNECT_USER): 4 * 30 * 60_000,
        (elastic, "down", DISCONNECT_USER): 4 * 30 * 60_000,
    }
    entries, _ = capacity_entries(cap, {train: job.gpu_ms}, down)
    got = {(e.pool, e.workload): e.gpu_ms for e in entries}
    # outside the gap: train 8 GPUs x 30 min less the job's 4 x 20 min; elastic 4 x 30 min
    assert got == {("train", "down"): 2 * MS_H, ("train", "idle"): (8 * 30 - 4 * 20) * 60_000,
                   ("elastic", "down"): 2 * MS_H, ("elastic", "idle"): 2 * MS_H}  # fmt: skip
    # without the runs the job's GPUs would be down as well as allocated
    _, blind = event_capacity(events, ATTRS, T0, T0 + H)
    assert blind[(train, "down", DISCONNECT_USER)] == 8 * 30 * 60_000


def test_disconnect_open_until_the_window_ends() -> None:
    """slurmctld still away at the ingest: the gap runs to the window's end."""
    cap, down = event_capacity(
        [_cluster(T0 - H, None, ("n1", "n2", "n3"), 12), _disconnect(T0 + H / 2, None)],
        ATTRS, T0, T0 + H,
    )  # fmt: skip
    entries, _ = capacity_entries(cap, {}, down)
    got = {(e.pool, e.workload): e.gpu_ms for e in entries}
    assert got == {("train", "down"): 4 * MS_H, ("train", "idle"): 4 * MS_H,
                   ("elastic", "down"): 2 * MS_H, ("elastic", "idle"): 2 * MS_H}  # fmt: skip


def test_node_event_in_a_disconnect_takes_the_cluster_count() -> None:
    """The rollup takes the cluster's GPU count x the overlap from the disconnect for each
    node event over it (as_mysql_rollup.c l. 1051-1069), so a node down in the second half
    of a one-hour gap leaves the disconnect only the first half; the node's own down time
    stays. Down = 12 x 30 min + 4 x 30 min, as sreport books it."""
    m = timedelta(minutes=1)
    events = [
        _cluster(T0 - H, None, ("n1", "n2", "n3"), 12),
        _disconnect(T0, T0 + H),
        _ev("n1", T0 + 30 * m, None, 0x0801),
        _ev("n3", T0 - H, None, 0x8201),  # MAINT: skipped by the rollup, takes nothing
    ]
    _, down = event_capacity(events, ATTRS, T0, T0 + H)
    train, elastic = ("c", "train", "h100", T0), ("c", "elastic", "h100", T0)
    assert down == {(train, "down", DISCONNECT_USER): 8 * 30 * 60_000,
                    (train, "down", "root"): 4 * 30 * 60_000,
                    (elastic, "down", DISCONNECT_USER): 4 * 30 * 60_000}  # fmt: skip
    assert sum(down.values()) == (12 * 30 + 4 * 30) * 60_000
    # a node down all through the gap leaves the disconnect nothing
    events[2] = _ev("n1", T0 - H, None, 0x0801)
    _, down = event_capacity(events, ATTRS, T0, T0 + H)
    assert down == {(train, "down", "root"): 4 * MS_H}


def test_pool_change_splits_the_node() -> None:
    attrs = {"n3": [NodeAttrs(T0, T0 + H / 2, "elastic", "h100", 4),
                    NodeAttrs(T0 + H / 2, None, "train", "h100", 4)]}  # fmt: skip
    cap, _ = event_capacity([_cluster(T0 - H, None, ("n3",), 4)], attrs, T0 - H, T0 + H)
    # before its first record the node has its first record's pool
    assert cap[("c", "elastic", "h100", T0 - H)] == 4 * MS_H
    assert cap[("c", "elastic", "h100", T0)] == 2 * MS_H
    assert cap[("c", "train", "h100", T0)] == 2 * MS_H


_minutes = st.integers(min_value=0, max_value=180)


@settings(max_examples=200, deadline=None)
@given(
    cluster=st.lists(st.tuples(_minutes, _minutes), min_size=1, max_size=3),
    node_events=st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2", "n3"]),
            _minutes,
            _minutes,
            st.sampled_from([0x0801, 0x0202, 0x2002, 0x0006, 0x8201]),
        ),
        max_size=6,
    ),
    alloc_frac=st.lists(st.integers(min_value=0, max_value=120), min_size=9, max_size=9),
    disconnects=st.lists(st.tuples(_minutes, _minutes), max_size=3),
)
def test_conservation(cluster, node_events, alloc_frac, disconnects) -> None:  # type: ignore[no-untyped-def]
    """Per cell: allocation + down lines + idle = capacity (allocation within capacity);
    down never exceeds what the events say; the lines are sreport's; slurmctld disconnects
    (the job runs over them taken out) book down within the capacity over them."""
    m = timedelta(minutes=1)
    events = [_cluster(T0 + min(a, b) * m, T0 + max(a, b) * m + m, ("n1", "n2", "n3"), 12)
              for a, b in cluster]  # fmt: skip
    events += [
        _ev(n, T0 + min(a, b) * m, T0 + max(a, b) * m + m, raw) for n, a, b, raw in node_events
    ]
    gaps = [(T0 + min(a, b) * m, T0 + max(a, b) * m + m) for a, b in disconnects]
    events += [_disconnect(s, e) for s, e in gaps]
    end = T0 + 3 * H
    cap, _ = event_capacity(events, ATTRS, T0, end)
    cells = sorted(cap)
    alloc = {c: cap[c] * alloc_frac[i % 9] // 100 for i, c in enumerate(cells)}
    # each cell's allocation one run over its hour
    runs = [RunAlloc(c, ms, c[3], c[3] + H) for c, ms in alloc.items()]
    _, down = event_capacity(events, ATTRS, T0, end, runs)
    # a disconnect's down in a cell is at most the capacity over it
    over_gaps = capacity_ms(
        [("c", a.pool, a.gpu_type, a.gpus, s, e) for s, e in gaps
         for attrs in ATTRS.values() for a in attrs],
        T0, end,
    )  # fmt: skip
    for (c, line, user), ms in down.items():
        assert c in cap
        if user == "":
            assert line == "down" and ms <= over_gaps.get(c, 0)
    entries, over = capacity_entries(cap, alloc, down)
    for c in cells:
        lines = [e for e in entries if (e.cluster, e.pool, e.gpu_type, e.bucket) == c]
        assert all(e.workload in (*DOWN_WORKLOADS, "idle") for e in lines)
        total = sum(e.gpu_ms for e in lines)
        if alloc[c] <= cap[c]:
            assert total + alloc[c] == cap[c]
        else:
            assert total == 0 and over[c] == alloc[c] - cap[c]
        for line in DOWN_WORKLOADS:
            booked = sum(e.gpu_ms for e in lines if e.workload == line)
            assert booked <= sum(ms for (cc, ln, _), ms in down.items() if cc == c and ln == line)
    # capacity never exceeds the registered nodes' GPUs over the union of cluster events
    union = capacity_ms(
        [("c", a.pool, a.gpu_type, a.gpus, T0, end) for attrs in ATTRS.values() for a in attrs],
        T0,
        end,
    )
    assert all(cap[c] <= union[c] for c in cap)


def test_recorded_sreport_parses() -> None:
    """The lab's first hour (01:00-02:00, the cluster registered at 01:04:45), as sreport
    printed it once rolled up: 16 GPUs x 3,315 s reported; the node down, the drain and the
    fence of sacctmgr-events-22.05.txt together 1,544 GPU-seconds of Down."""
    (u,) = parse_sreport_utilization((DATA / "sreport-utilization-22.05.txt").read_text())
    assert u.reported == 16 * 3315 == u.allocated + u.down + u.planned_down + u.idle
    assert u.down == 1544
    accounts = parse_sreport_accounts((DATA / "sreport-accounts-22.05.txt").read_text())
    assert accounts["root"] == u.allocated == sum(v for a, v in accounts.items() if a != "root")


def test_compare_names_each_difference() -> None:
    from accounting.agreement import HourFigures, compare

    led = HourFigures(100, 20, 0, 80, 200, {"a": 60, "b": 40})
    same = HourFigures(100, 20, 0, 80, 200, {"root": 100, "a": 60, "b": 40})
    assert compare(T0, led, same) == []
    srep = HourFigures(100, 10, 0, 50, 160, {"root": 100, "a": 60, "b": 40, "c": 5})
    diffs = {d.what: d for d in compare(T0, led, srep)}
    assert set(diffs) == {"down", "idle", "reported", "account c"}
    assert diffs["reported"].delta == 40 and "did not have" in diffs["reported"].cause
    assert "re-ingest" in diffs["account c"].cause


def test_a_gpu_planned_in_sreport_is_named() -> None:
    """sreport books Planned (eligible jobs waiting) to CPUs only, and the recorded lab hour
    shows 0 for GPUs; should a release book GPUs too, the comparison says so."""
    from accounting.agreement import HourFigures, compare

    (u,) = parse_sreport_utilization((DATA / "sreport-utilization-22.05.txt").read_text())
    assert u.planned == 0
    led = HourFigures(100, 20, 0, 80, 200, {"a": 100})
    srep = HourFigures(100, 20, 0, 50, 200, {"root": 100, "a": 100}, planned=30)
    diffs = {d.what: d for d in compare(T0, led, srep)}
    assert set(diffs) == {"idle", "planned"}
    assert "CPUs only" in diffs["planned"].cause
