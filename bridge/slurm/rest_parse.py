"""Pure parsers of slurmrestd's answers (OpenAPI v0.0.38, Slurm 22.05), tested on
recorded real answers (tests/data/slurm/rest-*.json).

Jobs (`/slurm/v0.0.38/jobs`) and accounting (`/slurmdb/v0.0.38/jobs`) are the very
documents `squeue --json` and `sacct --json` print on 22.05 (both commands dump through the
same OpenAPI plugins), so `bridge.slurm.squeue.parse_squeue_json` and
`bridge.slurm.sacct.parse_sacct_json` read them. This module reads what has no command-line
twin in JSON: nodes, partitions, reservations, a submission's answer, the `errors` list
every answer carries, the release in `meta`, and the OpenAPI versions `/openapi` lists.

Each returns the same records as the `scontrol show ... -o` parsers for the same cluster
state (node state flags use the same names, e.g. DRAIN, COMPLETING, MAINTENANCE,
RESERVED; the reason drops Slurm's `[user@time]`); anything unexpected raises
`UnparseableOutput` quoting the raw text.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from typing import Any

from bridge.slurm.errors import UnparseableOutput
from bridge.slurm.hostlist import HostlistError, expand
from bridge.slurm.model import Node, Partition, Reservation
from bridge.slurm.parse import (
    benign_error,
    gpus_from_tres,
    load_json,
    parse_gres,
    strip_reason,
    timestamp,
)

#: `/slurm/vX/...` and `/slurmdb/vX/...` in the paths of `/openapi`
_VERSIONED = re.compile(r"^/(slurm|slurmdb)/(v\d+\.\d+\.\d+)/")


def _document(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnparseableOutput(f"{what} (not JSON: {exc.msg} at char {exc.pos})", text) from exc
    if not isinstance(data, dict):
        raise UnparseableOutput(f"{what} (not a JSON object)", text)
    return data


def errors(text: str, what: str) -> list[str]:
    """Slurm's words in an answer's `errors` (each entry's `error` and `description`),
    the benign ones left out (9003, "Nothing found with query"); [] when there are none."""
    data = _document(text, what)
    found = data.get("errors") or []
    if not isinstance(found, list):
        raise UnparseableOutput(f"{what} (its 'errors' is not a list)", text)
    out = []
    for entry in found:
        if benign_error(entry):
            continue
        if isinstance(entry, dict):
            words = [str(entry[k]) for k in ("error", "description") if entry.get(k)]
            out.append(": ".join(dict.fromkeys(words)) or json.dumps(entry))
        else:
            out.append(str(entry))
    return out


def release(text: str) -> str:
    """Slurm's release from an answer's `meta` (e.g. "22.05.8")."""
    data = _document(text, "slurmrestd answer")
    value = (data.get("meta") or {}).get("Slurm", {}).get("release")
    if not isinstance(value, str) or not value[:1].isdigit():
        raise UnparseableOutput("slurmrestd answer (no meta.Slurm.release)", text)
    return value


def openapi_versions(text: str) -> dict[str, set[str]]:
    """The OpenAPI plugin versions `/openapi` lists: {"slurm": {"v0.0.38", ...},
    "slurmdb": {...}}."""
    data = _document(text, "/openapi")
    paths = data.get("paths")
    if not isinstance(paths, dict):
        raise UnparseableOutput("/openapi (no 'paths')", text[:2000])
    out: dict[str, set[str]] = {"slurm": set(), "slurmdb": set()}
    for path in paths:
        m = _VERSIONED.match(str(path))
        if m:
            out[m[1]].add(m[2])
    return out


def submitted_job_id(text: str) -> str:
    """The job id of a `/job/submit` answer."""
    data = _document(text, "/job/submit")
    job_id = data.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise UnparseableOutput("/job/submit (no job_id)", text)
    return str(job_id)


def jwt_expiry(token: str) -> datetime | None:
    """When a JWT expires (its payload's `exp`, as `scontrol token` sets it), read without
    checking the signature (slurmctld checks it); None when it says no `exp` or is not a
    JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return datetime.fromtimestamp(exp, tz=UTC)


def _nodes_of(expr: Any, raw: dict[str, Any]) -> tuple[str, ...]:
    if not expr:
        return ()
    try:
        return tuple(expand(str(expr)))
    except HostlistError as exc:
        raise UnparseableOutput("a node list", json.dumps(raw)) from exc


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def parse_nodes(text: str) -> list[Node]:
    """`/slurm/v0.0.38/nodes`. GPUs in use: `tres_used` (scontrol's AllocTRES), else the
    count in `gres_used` (`gpu:h100:2(IDX:0-1)`); `tres_used` is null on an idle node."""
    out = []
    for n in load_json(text, "slurmrestd nodes", "nodes"):
        try:
            gpu_type, gpus = parse_gres(_text(n.get("gres")))
            used = _text(n.get("tres_used"))
            alloc_type, alloc = (
                gpus_from_tres(used) if used else parse_gres(_text(n.get("gres_used")))
            )
            out.append(
                Node(
                    name=str(n["name"]),
                    addr=_text(n.get("address")) or str(n["name"]),
                    partitions=tuple(str(p) for p in n.get("partitions") or ()),
                    state=str(n["state"]).rstrip("*").lower(),
                    flags=frozenset(str(f).upper() for f in n.get("state_flags") or ()),
                    reason=strip_reason(_text(n.get("reason"))),
                    gpu_type=gpu_type or alloc_type,
                    gpus=gpus,
                    gpus_alloc=alloc,
                    gres=_text(n.get("gres")),
                    alloc_tres=used,
                )
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UnparseableOutput("a node of slurmrestd nodes", json.dumps(n)) from exc
    return out


def _preempt_mode(modes: Any) -> str:
    """["requeue"] -> "REQUEUE", ["disabled"] -> "OFF" (scontrol's words for the same)."""
    if isinstance(modes, str):
        modes = [modes]
    words = [str(m).upper() for m in modes or () if str(m).lower() != "disabled"]
    return ",".join(words) or "OFF"


def parse_partitions(text: str) -> list[Partition]:
    """`/slurm/v0.0.38/partitions`. `allowed_accounts` "" is every account (scontrol's
    AllowAccounts=ALL); the `default` flag is Default=YES."""
    out = []
    for p in load_json(text, "slurmrestd partitions", "partitions"):
        try:
            allow = _text(p.get("allowed_accounts"))
            out.append(
                Partition(
                    name=str(p["name"]),
                    nodes=_nodes_of(p.get("nodes"), p),
                    priority_tier=int(p.get("priority_tier", 1)),
                    preempt_mode=_preempt_mode(p.get("preemption_mode")),
                    allow_accounts=None
                    if allow in ("", "ALL")
                    else tuple(a for a in allow.split(",") if a),
                    grace_time_s=int(p.get("preemption_grace_time") or 0),
                    state=_text(p.get("state")) or "UP",
                    default="default" in {str(f).lower() for f in p.get("flags") or ()},
                )
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UnparseableOutput("a partition of slurmrestd partitions", json.dumps(p)) from exc
    return out


def parse_reservations(text: str, now: datetime) -> list[Reservation]:
    """`/slurm/v0.0.38/reservations`. v0.0.38 gives no state: a reservation is ACTIVE
    from its start to its end at `now` (as scontrol says), else INACTIVE."""
    out = []
    for r in load_json(text, "slurmrestd reservations", "reservations"):
        try:
            start = timestamp(r.get("start_time"))
            end = timestamp(r.get("end_time"))
            active = start is not None and start <= now and (end is None or now < end)
            out.append(
                Reservation(
                    name=str(r["name"]),
                    nodes=_nodes_of(r.get("node_list"), r),
                    start=start,
                    end=end,
                    flags=frozenset(str(f).upper() for f in r.get("flags") or ()),
                    users=tuple(u for u in _text(r.get("users")).split(",") if u),
                    state="ACTIVE" if active else "INACTIVE",
                )
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UnparseableOutput(
                "a reservation of slurmrestd reservations", json.dumps(r)
            ) from exc
    return out
