"""Pure parsers of Slurm's output, tested on recorded real output.

- `scontrol show <node|partition|reservation> -o`: one `Key=Value` record per line; a
  stable format across releases. Values may hold spaces (`Reason=`, `OS=`): a field ends
  where the next `Key=` begins.
- `squeue --json` and `sacct --json`: the OpenAPI shapes of Slurm 22.05 (v0.0.38) and
  later (v0.0.39+, where numbers become `{"set", "infinite", "number"}` and states become
  lists). Accessors below accept both. Fields the parsers do not read are ignored, so newer
  releases that add fields parse as before.

Anything unexpected raises `UnparseableOutput` quoting the raw text; for JSON it also says
what was wrong (not valid JSON, and where: output cut short reads as "truncated?"; not an
object; no job list).

`sacct --json` (the ledger reads a million records at a time) is decoded typed, with msgspec,
into only the fields the parser reads; any document that does not fit those types is read
again by the plain parser (`parse_sacct_json_plain`), which gives the same records or the
precise error, so both return exactly the same (tests/unit/test_sacct_fast_reader.py).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from bridge.hostlist import HostlistError, expand
from bridge.slurm.errors import ControllerUnreachable, UnparseableOutput
from bridge.slurm.model import (
    AccountingRecord,
    Job,
    Node,
    Partition,
    Reservation,
    SlurmEvent,
)

_FIELD_START = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9_/:.]*=)")
_NULLS = {"", "(null)", "N/A", "n/a", "None", "None assigned"}
#: what is left of JSON cut inside its last token (a number, true, false or null)
_PARTIAL_TOKEN = re.compile(r"[\w.+\-]*")


# --- scalar accessors tolerant of OpenAPI versions -----------------------------------


def num(value: Any) -> int | None:
    """An integer from `5`, `{"set": true, "number": 5}`; None when unset or infinite."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    raise ValueError(f"not a number: {value!r}")


#: Slurm's "no value" in a 32-bit time field (NO_VAL; INFINITE is one more): 24.11's
#: sacct gives it as the start of a run that never started (22.05 gave 0)
NO_VAL = 0xFFFFFFFE


def timestamp(value: Any) -> datetime | None:
    """UTC datetime from epoch seconds (either shape); None for 0, unset or NO_VAL."""
    n = num(value)
    return datetime.fromtimestamp(n, tz=UTC) if n and n < NO_VAL else None


def states(value: Any) -> list[str]:
    """`"RUNNING"`, `["RUNNING", "COMPLETING"]` or `{"current": ...}` -> upper-case list."""
    if isinstance(value, dict):
        value = value.get("current")
    if isinstance(value, str):
        return [s for s in value.upper().replace("+", " ").split() if s]
    if isinstance(value, list):
        return [str(s).upper() for s in value]
    raise ValueError(f"not a state: {value!r}")


#: the state flags sacct and squeue show in place of the base state, in the order Slurm
#: tests them (`job_state_string`). Slurm 22.05's JSON gives that one name
#: ("REQUEUED"); 23.02 and later give the base state and its flags
#: (["PENDING", "REQUEUED"]).
SHOWN_FLAGS = (
    "COMPLETING", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT",
)  # fmt: skip


def shown_state(st: list[str]) -> str:
    """The one state name of a job as sacct and squeue show it, from `states`: the first
    shown flag after the base state, else the base state."""
    if len(st) > 1:
        flags = set(st[1:])
        for flag in SHOWN_FLAGS:
            if flag in flags:
                return flag
    return st[0] if st else "UNKNOWN"


# --- gres and TRES --------------------------------------------------------------------


def parse_gres(gres: str) -> tuple[str | None, int]:
    """GPU (type, count) from a gres string: `gpu:h100:4`, `gpu:4`, `gpu:h100:2(IDX:0-1)`,
    several comma-separated entries (GPU counts summed, first type kept)."""
    gpu_type: str | None = None
    count = 0
    for entry in _split_gres(gres):
        entry = entry.split("(", 1)[0]
        parts = entry.split(":")
        if parts[0] not in ("gpu", "gres/gpu"):
            continue
        if len(parts) == 1:
            count += 1
        elif len(parts) == 2:
            count += int(parts[1]) if parts[1].isdigit() else 1
            if not parts[1].isdigit():
                gpu_type = gpu_type or parts[1]
        else:
            gpu_type = gpu_type or parts[1]
            count += int(parts[2]) if parts[2].isdigit() else 0
    return gpu_type, count


def _split_gres(gres: str) -> list[str]:
    """Split on commas outside parentheses (`gpu:h100:2(IDX:0,2)`)."""
    out, depth, cur = [], 0, ""
    for ch in gres:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [e.strip() for e in out if e.strip() and e.strip() not in _NULLS]


def gpus_from_tres(tres: str) -> tuple[str | None, int]:
    """GPU (type, count) from a TRES string (`cpu=1,gres/gpu=2,gres/gpu:h100=2`).

    Slurm lists the untyped total *and* each typed count; the untyped total is the
    count (typed ones are summed only when no untyped entry exists), so a GPU is never
    counted twice."""
    untyped: int | None = None
    typed: dict[str, int] = {}
    for item in tres.split(","):
        key, _, value = item.strip().partition("=")
        if not value.isdigit():
            continue
        if key == "gres/gpu":
            untyped = int(value)
        elif key.startswith("gres/gpu:"):
            typed[key.split(":", 1)[1]] = int(value)
    gpu_type = next(iter(typed), None)
    return gpu_type, untyped if untyped is not None else sum(typed.values())


def gpus_from_tres_list(items: list[dict[str, Any]]) -> tuple[str | None, int]:
    """The same rule for sacct JSON's `tres.allocated` list."""
    as_text = ",".join(
        f"{t.get('type')}/{t.get('name')}={num(t.get('count')) or 0}"
        for t in items
        if t.get("type") == "gres" and t.get("name")
    )
    return gpus_from_tres(as_text)


# --- job ids --------------------------------------------------------------------------


@dataclass(frozen=True)
class JobIdParts:
    job_id: int
    #: array task ids, expanded; None when not an array expression
    tasks: tuple[int, ...] | None = None
    #: the `%N` limit of a pending array
    max_running: int | None = None
    #: heterogeneous job component (`123+1`)
    het_offset: int | None = None


_JOB_ID = re.compile(
    r"^(?P<id>\d+)(?:_(?:(?P<task>\d+)|\[(?P<range>[0-9,\-]+)(?:%(?P<max>\d+))?\]))?"
    r"(?:\+(?P<het>\d+))?$"
)


def parse_job_id(text: str) -> JobIdParts:
    """`123`, `123_4`, `20956421_[2-4%25]`, `123_[1,3-5]`, `123+1`."""
    m = _JOB_ID.match(text.strip())
    if not m:
        raise UnparseableOutput("a Slurm job id", text)
    tasks: tuple[int, ...] | None = None
    if m["task"] is not None:
        tasks = (int(m["task"]),)
    elif m["range"] is not None:
        try:
            tasks = tuple(int(t) for t in expand(f"t[{m['range']}]") for t in [t[1:]])
        except HostlistError as exc:
            raise UnparseableOutput("a Slurm job id", text) from exc
    return JobIdParts(
        int(m["id"]),
        tasks,
        int(m["max"]) if m["max"] else None,
        int(m["het"]) if m["het"] else None,
    )


def format_job_id(
    job_id: int,
    array_job_id: int | None,
    task_id: int | None,
    task_string: str = "",
    max_running: int | None = None,
) -> str:
    if array_job_id and task_id is not None:
        return f"{array_job_id}_{task_id}"
    if array_job_id and task_string:
        spec = (
            task_string
            if "%" in task_string or not max_running
            else (f"{task_string}%{max_running}")
        )
        return f"{array_job_id}_[{spec}]"
    return str(job_id)


# --- scontrol show -o ----------------------------------------------------------------


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


def _nodes_of(expr: str, raw: str) -> tuple[str, ...]:
    if expr in _NULLS:
        return ()
    try:
        return tuple(expand(expr))
    except HostlistError as exc:
        raise UnparseableOutput("a node list", raw) from exc


def _scontrol_time(value: str) -> datetime | None:
    """scontrol prints local time; the backends run it with TZ=UTC."""
    if value in _NULLS or value in ("Unknown", "None"):
        return None
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def parse_nodes(text: str) -> list[Node]:
    nodes = []
    for r in scontrol_records(text):
        try:
            state_parts = r["State"].split("+")
            gpu_type, gpus = parse_gres(r.get("Gres", ""))
            alloc_type, alloc = gpus_from_tres(r.get("AllocTRES", ""))
            nodes.append(
                Node(
                    name=r["NodeName"],
                    addr=r.get("NodeAddr", r["NodeName"]),
                    partitions=tuple(p for p in r.get("Partitions", "").split(",") if p),
                    state=state_parts[0].rstrip("*").lower(),
                    flags=frozenset(s.upper() for s in state_parts[1:]),
                    reason=strip_reason(r.get("Reason", "")),
                    gpu_type=gpu_type or alloc_type,
                    gpus=gpus,
                    gpus_alloc=alloc,
                )
            )
        except (KeyError, ValueError) as exc:
            raise UnparseableOutput("scontrol show node", str(r)) from exc
    return nodes


def strip_reason(reason: str) -> str:
    """`stb: x [root@2026-11-29T14:20:35]` -> `stb: x` (Slurm appends who and when)."""
    reason = reason.strip()
    if reason in _NULLS:
        return ""
    return re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", reason)


def parse_partitions(text: str) -> list[Partition]:
    parts = []
    for r in scontrol_records(text):
        try:
            allow = r.get("AllowAccounts", "ALL")
            parts.append(
                Partition(
                    name=r["PartitionName"],
                    nodes=_nodes_of(r.get("Nodes", ""), str(r)),
                    priority_tier=int(r.get("PriorityTier", "1")),
                    preempt_mode=r.get("PreemptMode", "OFF"),
                    allow_accounts=None if allow == "ALL" else tuple(allow.split(",")),
                    grace_time_s=int(r.get("GraceTime", "0")),
                    state=r.get("State", "UP"),
                    default=r.get("Default", "NO") == "YES",
                )
            )
        except (KeyError, ValueError) as exc:
            raise UnparseableOutput("scontrol show partition", str(r)) from exc
    return parts


def parse_reservations(text: str) -> list[Reservation]:
    out = []
    for r in scontrol_records(text):
        try:
            out.append(
                Reservation(
                    name=r["ReservationName"],
                    nodes=_nodes_of(r.get("Nodes", ""), str(r)),
                    start=_scontrol_time(r.get("StartTime", "")),
                    end=_scontrol_time(r.get("EndTime", "")),
                    flags=frozenset(f for f in r.get("Flags", "").split(",") if f),
                    users=tuple(u for u in r.get("Users", "").split(",") if u not in _NULLS),
                    state=r.get("State", ""),
                )
            )
        except (KeyError, ValueError) as exc:
            raise UnparseableOutput("scontrol show reservation", str(r)) from exc
    return out


# --- JSON ----------------------------------------------------------------------------


#: `error_number`s of a JSON answer's `errors` that are no failure: sacct over a window
#: with no job answers 9003 "Nothing found with query" (and an empty job list)
_BENIGN_ERRORS = frozenset({9003})


def load_json(text: str, what: str, key: str) -> list[dict[str, Any]]:
    """The `key` list of a Slurm JSON document. A document whose `errors` list holds a
    real error raises `ControllerUnreachable` quoting it: with the controller down,
    `squeue --json` exits 0 with no jobs and {"error": "Unspecified error", "source":
    "slurm_load_jobs"} only there, and an empty job list must never be taken for "every
    job is gone". A read that failed is retried on a later tick (reads are idempotent),
    so every such error counts as transient."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnparseableOutput(_not_json(what, text, exc), text) from exc
    if not isinstance(data, dict):
        raise UnparseableOutput(f"{what} output (not a JSON object)", text)
    try:
        errors = [
            e
            for e in data.get("errors") or []
            if not (isinstance(e, dict) and e.get("error_number") in _BENIGN_ERRORS)
        ]
    except TypeError as exc:
        raise UnparseableOutput(f"{what} output (its 'errors' is not a list)", text) from exc
    if key not in data:
        raise UnparseableOutput(f"{what} output (no {key!r} list)", text)
    items = data[key]
    if errors:
        first = errors[0]
        if isinstance(first, dict):
            words = [str(first[k]) for k in ("error", "description", "source") if first.get(k)]
            message = "; ".join(words) or json.dumps(first)
        else:
            message = str(first)
        raise ControllerUnreachable(f"{what}: {message}")
    if not isinstance(items, list):
        raise UnparseableOutput(f"{what} output ({key!r} is not a list)", text)
    return items


def _not_json(what: str, text: str, exc: json.JSONDecodeError) -> str:
    """What `UnparseableOutput` says of output that is not JSON: where the decoder stopped
    and, when that is in the output's last token (or an unterminated string), that it was
    likely cut short."""
    if not text.strip():
        return f"{what} output (empty)"
    rest = text[exc.pos :].rstrip()
    cut = exc.msg.startswith("Unterminated string") or _PARTIAL_TOKEN.fullmatch(rest)
    hint = "; the output ends there: truncated?" if cut else ""
    why = exc.msg.removesuffix(" starting at")  # "Unterminated string starting at"
    return f"{what} output (not valid JSON: {why} at char {exc.pos} of {len(text)}{hint})"


def _bad_job(command: str, exc: Exception) -> str:
    """What `UnparseableOutput` says of one job the parser cannot read, and why."""
    why = f"no field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
    return f"a job in {command} --json ({why or type(exc).__name__})"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def filter_jobs(
    jobs: Iterable[Job],
    *,
    tag: str | None = None,
    node: str | None = None,
    partition: str | None = None,
    states: Iterable[str] | None = None,
) -> list[Job]:
    """The jobs `SlurmProtocol.jobs` asks for: with the comment `tag`, on `node`, in
    `partition`, in one of `states` (Slurm state names, any case); None: any."""
    wanted = {s.upper() for s in states} if states is not None else None
    return [
        j
        for j in jobs
        if (tag is None or tag in j.tags)
        and (node is None or node in j.nodes)
        and (partition is None or j.partition == partition)
        and (wanted is None or j.state in wanted)
    ]


def parse_squeue_json(text: str) -> list[Job]:
    jobs = []
    for j in load_json(text, "squeue --json", "jobs"):
        try:
            st = states(j["job_state"])
            _, gpus = gpus_from_tres(_text(j.get("tres_alloc_str")))
            if not gpus:
                gpus = parse_gres(_text(j.get("tres_per_node")).replace("gres:", ""))[1]
            job_id = format_job_id(
                int(j["job_id"]),
                num(j.get("array_job_id")),
                num(j.get("array_task_id")),
                _text(j.get("array_task_string")),
                num(j.get("array_max_tasks")),
            )
            nodes = _text(j.get("nodes"))
            jobs.append(
                Job(
                    job_id=job_id,
                    name=_text(j.get("name")),
                    partition=_text(j.get("partition")),
                    account=_text(j.get("account")),
                    user=_text(j.get("user_name")),
                    state=shown_state(st),
                    reason=""
                    if _text(j.get("state_reason")) in _NULLS
                    else _text(j["state_reason"]),
                    nodes=_nodes_of(nodes, nodes),
                    comment=_text(j.get("comment")),
                    gpus=gpus,
                    restarts=num(j.get("restart_cnt")) or 0,
                    submit_time=timestamp(j.get("submit_time")),
                    # For a pending job squeue gives an expected start; that is not a start.
                    start_time=None if st[:1] == ["PENDING"] else timestamp(j.get("start_time")),
                    requested_nodes=_nodes_of(
                        _text(j.get("required_nodes")), _text(j.get("required_nodes"))
                    ),
                )
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UnparseableOutput(_bad_job("squeue", exc), json.dumps(j)[:2000]) from exc
    return jobs


def _sacct_comment(comment: Any) -> str:
    """The job's comment and, after a comma, its administrator comment (where
    job_submit.lua writes `stb:workload=<w>`): `{"job": "stb:triton", "administrator":
    "stb:workload=inference"}` -> `stb:triton,stb:workload=inference`. Older or newer
    shapes give a plain string. The administrator's part comes last, so its tags win
    over a user's."""
    if not isinstance(comment, dict):
        return _text(comment)
    parts = (_text(comment.get(k)).strip() for k in ("job", "administrator"))
    return ",".join(p for p in parts if p and p not in _NULLS)


def parse_sacct_json(text: str | bytes) -> list[AccountingRecord]:
    """`sacct --json` (text, or its UTF-8 bytes) -> one record per job run. Typed decoding
    (msgspec) of the fields the ledger reads; a document it cannot take whole (any other
    shape, bad input, an `errors` list with a real error) goes through
    `parse_sacct_json_plain`, which gives the same records or raises with its precise
    message."""
    try:
        doc = _SACCT_DECODER.decode(text)
        if doc.errors and any(not benign_error(e) for e in doc.errors):
            raise ValueError("errors")
        return [_sacct_record(j) for j in doc.jobs]
    except Exception:  # any doubt: the plain parser decides, and says what was wrong
        return parse_sacct_json_plain(text if isinstance(text, str) else text.decode())


def parse_sacct_json_plain(text: str) -> list[AccountingRecord]:
    """The reference parser (`json` and dicts): what `parse_sacct_json` must equal."""
    records = []
    for j in load_json(text, "sacct --json", "jobs"):
        try:
            array = j.get("array") or {}
            array_job = num(array.get("job_id")) or None
            task = num(array.get("task_id"))
            gpu_type, gpus = gpus_from_tres_list(j.get("tres", {}).get("allocated", []))
            t = j.get("time", {})
            nodes = _text(j.get("nodes"))
            comment = j.get("comment")
            st = states(j["state"])
            records.append(
                AccountingRecord(
                    cluster=_text(j.get("cluster")),
                    job_id=format_job_id(int(j["job_id"]), array_job, task),
                    array_job_id=array_job,
                    array_task_id=task,
                    name=_text(j.get("name")),
                    partition=_text(j.get("partition")),
                    account=_text(j.get("account")),
                    user=_text(j.get("user")),
                    qos=_text(j.get("qos")),
                    state=shown_state(st),
                    submit=timestamp(t.get("submission")),
                    start=timestamp(t.get("start")),
                    end=timestamp(t.get("end")),
                    elapsed_s=num(t.get("elapsed")) or 0,
                    nodes=_nodes_of(nodes, nodes),
                    gpus=gpus,
                    gpu_type=gpu_type,
                    comment=_sacct_comment(comment),
                    restarts=num(j.get("restart_cnt")) or 0,
                    eligible=timestamp(t.get("eligible")),
                )
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UnparseableOutput(_bad_job("sacct", exc), json.dumps(j)[:2000]) from exc
    return records


# --- sacct JSON, typed ------------------------------------------------------------------
#
# Only the fields parse_sacct_json reads, typed as narrowly as the plain parser's accessors
# read them; msgspec skips every other field without building it. Anything outside these
# types fails the decode and falls back to the plain parser.


class _Num(msgspec.Struct):
    """`{"set": true, "infinite": false, "number": 5}` (v0.0.39+)."""

    set: bool = True
    infinite: bool = False
    number: int | None = None


_NumField = int | _Num | None


class _State(msgspec.Struct):
    current: str | list[str]


class _Comment(msgspec.Struct):
    job: str | None = None
    administrator: str | None = None


class _Tres(msgspec.Struct):
    type: str | None = None
    name: str | None = None
    count: _NumField = None


class _TresLists(msgspec.Struct):
    allocated: list[_Tres] = []


class _Array(msgspec.Struct):
    job_id: _NumField = None
    task_id: _NumField = None


class _Time(msgspec.Struct):
    submission: _NumField = None
    eligible: _NumField = None
    start: _NumField = None
    end: _NumField = None
    elapsed: _NumField = None


class _SacctJob(msgspec.Struct):
    job_id: int
    state: str | list[str] | _State
    cluster: str | None = None
    name: str | None = None
    partition: str | None = None
    account: str | None = None
    user: str | None = None
    qos: str | None = None
    nodes: str | None = None
    comment: str | _Comment | None = None
    restart_cnt: _NumField = None
    array: _Array | None = None
    tres: _TresLists = msgspec.field(default_factory=_TresLists)
    time: _Time = msgspec.field(default_factory=_Time)


class _SacctDoc(msgspec.Struct):
    jobs: list[_SacctJob]
    errors: list[Any] | None = None


_SACCT_DECODER = msgspec.json.Decoder(_SacctDoc)


def benign_error(e: Any) -> bool:
    """An entry of a JSON answer's `errors` that is no failure (`_BENIGN_ERRORS`)."""
    return isinstance(e, dict) and e.get("error_number") in _BENIGN_ERRORS


def _tnum(value: int | _Num | None) -> int | None:
    """`num` of a typed value."""
    if value is None or type(value) is int:
        return value
    if isinstance(value, _Num):
        return None if not value.set or value.infinite else value.number
    return num(value)


def _tstamp(value: int | _Num | None) -> datetime | None:
    n = _tnum(value)
    return datetime.fromtimestamp(n, tz=UTC) if n and n < NO_VAL else None


@functools.lru_cache(maxsize=65536)
def _nodes_cached(expr: str) -> tuple[str, ...]:
    return _nodes_of(expr, expr)


@functools.lru_cache(maxsize=4096)
def _gpus_cached(tres: str) -> tuple[str | None, int]:
    return gpus_from_tres(tres)


@functools.lru_cache(maxsize=1024)
def _state_cached(state: str) -> str:
    return shown_state(states(state))


def _sacct_record(j: _SacctJob) -> AccountingRecord:
    """One typed job as `parse_sacct_json_plain` reads it (the same accessors, so the same
    record; `x or ""` is `_text(x)` for a str or None)."""
    array = j.array
    array_job = (_tnum(array.job_id) or None) if array is not None else None
    task = _tnum(array.task_id) if array is not None else None
    gres = [
        f"{t.type}/{t.name}={_tnum(t.count) or 0}"
        for t in j.tres.allocated
        if t.type == "gres" and t.name
    ]
    gpu_type, gpus = _gpus_cached(",".join(gres)) if gres else (None, 0)
    t = j.time
    submit = _tstamp(t.submission)
    # most jobs are eligible when submitted: the same instant, one datetime made
    eligible = submit if t.eligible == t.submission else _tstamp(t.eligible)
    state = j.state
    if isinstance(state, _State):
        state = state.current
    first = _state_cached(state) if isinstance(state, str) else shown_state(states(state))
    comment = j.comment
    if isinstance(comment, _Comment):
        parts = ((p or "").strip() for p in (comment.job, comment.administrator))
        comment_text = ",".join(p for p in parts if p and p not in _NULLS)
    else:
        comment_text = comment or ""
    return AccountingRecord(
        cluster=j.cluster or "",
        job_id=format_job_id(j.job_id, array_job, task),
        array_job_id=array_job,
        array_task_id=task,
        name=j.name or "",
        partition=j.partition or "",
        account=j.account or "",
        user=j.user or "",
        qos=j.qos or "",
        state=first,
        submit=submit,
        start=_tstamp(t.start),
        end=_tstamp(t.end),
        elapsed_s=_tnum(t.elapsed) or 0,
        nodes=_nodes_cached(j.nodes or ""),
        gpus=gpus,
        gpu_type=gpu_type,
        comment=comment_text,
        restarts=_tnum(j.restart_cnt) or 0,
        eligible=eligible,
    )


# --- sacctmgr show event ------------------------------------------------------------

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
                    nodes=_nodes_of(nodes, line) if kind == "Cluster" else (node,),
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


# --- sreport -P -n -t Seconds -T gres/gpu ---------------------------------------------


@dataclass(frozen=True)
class GpuUtilization:
    """One cluster's line of `sreport -T gres/gpu cluster Utilization`, GPU-seconds."""

    cluster: str
    allocated: int
    down: int
    planned_down: int
    idle: int
    planned: int
    reported: int


def parse_sreport_utilization(text: str) -> list[GpuUtilization]:
    """Lines `Cluster|TRES Name|Allocated|Down|PLND Down|Idle|Planned|Reported`."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        try:
            if len(parts) != 8 or parts[1] != "gres/gpu":
                raise ValueError(f"{len(parts)} fields, TRES {parts[1:2]}")
            a, d, pd, i, pl, r = (int(x) for x in parts[2:])
        except ValueError as exc:
            raise UnparseableOutput(f"sreport cluster Utilization ({exc})", line) from exc
        out.append(GpuUtilization(parts[0], a, d, pd, i, pl, r))
    return out


def parse_sreport_accounts(text: str) -> dict[str, int]:
    """Lines `Cluster|Account|Login|Proper Name|TRES Name|Used`: the account lines (no
    login) -> GPU-seconds."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        try:
            if len(parts) != 6 or parts[4] != "gres/gpu":
                raise ValueError(f"{len(parts)} fields, TRES {parts[4:5]}")
            used = int(parts[5])
        except ValueError as exc:
            raise UnparseableOutput(f"sreport AccountUtilizationByUser ({exc})", line) from exc
        if not parts[2]:
            out[parts[1]] = out.get(parts[1], 0) + used
    return out


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
