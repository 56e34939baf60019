"""`sacctmgr -P -n show event` -> slurmdbd's cluster and node events (`SlurmEvent`): the
capacity and down time the ledger books for a cluster that has them
(`accounting.slurm_events`). `EVENT_FIELDS` is the format `SlurmCLI.events` asks for.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from bridge.slurm.errors import UnparseableOutput
from bridge.slurm.model import SlurmEvent
from bridge.slurm.parse import gpus_from_tres, nodes_of

#: the fields `SlurmCLI.events` asks for, in this order (Reason last: it is the one free
#: text, so a "|" inside it is kept)
EVENT_FIELDS = (
    "Event", "Cluster", "ClusterNodes", "NodeName", "TimeStart", "TimeEnd", "StateRaw",
    "State", "User", "TRES", "Reason",
)  # fmt: skip


def parse_sacctmgr_events(text: str) -> list[SlurmEvent]:
    """`sacctmgr -P -n show event Format=<EVENT_FIELDS>` run with SLURM_TIME_FORMAT=%s (times
    as epoch seconds; an open event's end is "Unknown")."""
    events = []
    n = len(EVENT_FIELDS)
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < n:
            raise UnparseableOutput("sacctmgr show event", line)
        parts = [*parts[: n - 1], "|".join(parts[n - 1 :])]
        kind, cluster, nodes, node, start, end, raw, state, user, tres, reason = parts
        try:
            if kind not in ("Cluster", "Node") or (kind == "Node") != bool(node):
                raise ValueError(f"event type {kind!r} with node name {node!r}")
            _, gpus = gpus_from_tres(tres)
            events.append(
                SlurmEvent(
                    cluster=cluster,
                    node=node,
                    nodes=nodes_of(nodes, line) if kind == "Cluster" else (node,),
                    start=_epoch(start),
                    end=None if end in ("Unknown", "", "0") else _epoch(end),
                    state_raw=int(raw or "0"),
                    state=state,
                    user=re.sub(r"\(\d+\)$", "", user),
                    reason=reason.strip(),
                    gpus=gpus,
                )
            )
        except ValueError as exc:
            raise UnparseableOutput(f"sacctmgr show event ({exc})", line) from exc
    return events


def _epoch(value: str) -> datetime:
    """An epoch time, as SLURM_TIME_FORMAT=%s prints it."""
    if not value.isdigit():
        raise ValueError(f"time {value!r} is not epoch seconds (SLURM_TIME_FORMAT=%s unset?)")
    return datetime.fromtimestamp(int(value), UTC)
