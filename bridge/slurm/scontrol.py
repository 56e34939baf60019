"""Parsers of `scontrol`'s output, pure: `scontrol show <node|partition|reservation> -o`
(one `Key=Value` record per line, a format stable across releases; values may hold spaces,
`Reason=`, `OS=`: a field ends where the next `Key=` begins), `scontrol token` and
`scontrol show config`. Read by the Slurm backends (`bridge.slurm.cli`, `.pyslurm_backend`,
`.rest`), the site check and the simulator's fleet reader; anything unexpected raises
`UnparseableOutput` quoting the line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from bridge.slurm.errors import UnparseableOutput
from bridge.slurm.model import Node, Partition, Reservation
from bridge.slurm.parse import NULLS, gpus_from_tres, nodes_of, parse_gres, strip_reason

T = TypeVar("T")

_FIELD_START = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9_/:.]*=)")


def scontrol_records(text: str) -> list[dict[str, str]]:
    """`scontrol show X -o` -> one dict per line. "No ... in the system" -> []."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line or (line.startswith("No ") and line.endswith("in the system")):
            continue
        fields = _FIELD_START.split(line)
        record = {}
        for f in fields:
            key, sep, value = f.partition("=")
            if not sep:
                raise UnparseableOutput("scontrol output", line)
            record[key] = value.strip()
        records.append(record)
    return records


def _scontrol_time(value: str) -> datetime | None:
    """scontrol prints local time; the backends run it with TZ=UTC."""
    if value in NULLS or value in ("Unknown", "None"):
        return None
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def _each(text: str, what: str, make: Callable[[dict[str, str]], T]) -> list[T]:
    """`make` of each record of `scontrol show <what> -o`'s `text`; a record it cannot
    read (a key missing, a value malformed) raises `UnparseableOutput` quoting it."""
    out = []
    for r in scontrol_records(text):
        try:
            out.append(make(r))
        except (KeyError, ValueError) as exc:
            raise UnparseableOutput(f"scontrol show {what}", str(r)) from exc
    return out


def _node(r: dict[str, str]) -> Node:
    state_parts = r["State"].split("+")
    gpu_type, gpus = parse_gres(r.get("Gres", ""))
    alloc_type, alloc = gpus_from_tres(r.get("AllocTRES", ""))
    return Node(
        name=r["NodeName"],
        addr=r.get("NodeAddr", r["NodeName"]),
        partitions=tuple(p for p in r.get("Partitions", "").split(",") if p),
        state=state_parts[0].rstrip("*").lower(),
        flags=frozenset(s.upper() for s in state_parts[1:]),
        reason=strip_reason(r.get("Reason", "")),
        gpu_type=gpu_type or alloc_type,
        gpus=gpus,
        gpus_alloc=alloc,
        gres=r.get("Gres", "") if r.get("Gres", "") not in NULLS else "",
        alloc_tres=r.get("AllocTRES", "") if r.get("AllocTRES", "") not in NULLS else "",
    )


def _partition(r: dict[str, str]) -> Partition:
    allow = r.get("AllowAccounts", "ALL")
    return Partition(
        name=r["PartitionName"],
        nodes=nodes_of(r.get("Nodes", ""), str(r)),
        priority_tier=int(r.get("PriorityTier", "1")),
        preempt_mode=r.get("PreemptMode", "OFF"),
        allow_accounts=None if allow == "ALL" else tuple(allow.split(",")),
        grace_time_s=int(r.get("GraceTime", "0")),
        state=r.get("State", "UP"),
        default=r.get("Default", "NO") == "YES",
    )


def _reservation(r: dict[str, str]) -> Reservation:
    return Reservation(
        name=r["ReservationName"],
        nodes=nodes_of(r.get("Nodes", ""), str(r)),
        start=_scontrol_time(r.get("StartTime", "")),
        end=_scontrol_time(r.get("EndTime", "")),
        flags=frozenset(f for f in r.get("Flags", "").split(",") if f),
        users=tuple(u for u in r.get("Users", "").split(",") if u not in NULLS),
        state=r.get("State", ""),
    )


def parse_nodes(text: str) -> list[Node]:
    return _each(text, "node", _node)


def parse_partitions(text: str) -> list[Partition]:
    return _each(text, "partition", _partition)


def parse_reservations(text: str) -> list[Reservation]:
    return _each(text, "reservation", _reservation)


def parse_token(text: str) -> str:
    """`scontrol token`'s `SLURM_JWT=<token>` -> the token (three base64url parts)."""
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "SLURM_JWT" and re.fullmatch(r"[\w-]+\.[\w-]+\.[\w-]+", value):
            return value
    raise UnparseableOutput("scontrol token", text)


def parse_show_config(text: str) -> dict[str, str]:
    """`scontrol show config`: lines `Key = Value` (the header and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out
