"""`sacct --json` -> one `AccountingRecord` per job run: what the ledger ingests
(`accounting.prepare`), the simulator replays and the lab's demo reads; slurmrestd's
`GET slurmdb jobs` gives the same document (`bridge.slurm.rest`).

The ledger reads a million records at a time, so the document is decoded typed, with
msgspec, into only the fields the parser reads (`parse_sacct_json`); any document that does
not fit those types is read again by the plain parser (`parse_sacct_json_plain`, `json` and
`bridge.slurm.parse`'s accessors), which gives the same records or the precise error, so
both return exactly the same (tests/unit/test_sacct_fast_reader.py).
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from typing import Any

import msgspec

from bridge.slurm.errors import UnparseableOutput
from bridge.slurm.model import AccountingRecord
from bridge.slurm.parse import (
    NO_VAL,
    NULLS,
    as_text,
    bad_job,
    benign_error,
    format_job_id,
    gpus_from_tres,
    gpus_from_tres_list,
    load_json,
    nodes_of,
    num,
    shown_state,
    states,
    timestamp,
    tres_list_text,
)


def _sacct_comment(comment: Any) -> str:
    """The job's comment and, after a comma, its administrator comment (where
    job_submit.lua writes `stb:workload=<w>`): `{"job": "stb:triton", "administrator":
    "stb:workload=inference"}` -> `stb:triton,stb:workload=inference`. Older or newer
    shapes give a plain string. The administrator's part comes last, so its tags win
    over a user's."""
    if not isinstance(comment, dict):
        return as_text(comment)
    parts = (as_text(comment.get(k)).strip() for k in ("job", "administrator"))
    return ",".join(p for p in parts if p and p not in NULLS)


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
            allocated = j.get("tres", {}).get("allocated", [])
            gpu_type, gpus = gpus_from_tres_list(allocated)
            t = j.get("time", {})
            nodes = as_text(j.get("nodes"))
            comment = j.get("comment")
            st = states(j["state"])
            records.append(
                AccountingRecord(
                    cluster=as_text(j.get("cluster")),
                    job_id=format_job_id(int(j["job_id"]), array_job, task),
                    array_job_id=array_job,
                    array_task_id=task,
                    name=as_text(j.get("name")),
                    partition=as_text(j.get("partition")),
                    account=as_text(j.get("account")),
                    user=as_text(j.get("user")),
                    qos=as_text(j.get("qos")),
                    state=shown_state(st),
                    submit=timestamp(t.get("submission")),
                    start=timestamp(t.get("start")),
                    end=timestamp(t.get("end")),
                    elapsed_s=num(t.get("elapsed")) or 0,
                    nodes=nodes_of(nodes, nodes),
                    gpus=gpus,
                    gpu_type=gpu_type,
                    comment=_sacct_comment(comment),
                    restarts=num(j.get("restart_cnt")) or 0,
                    eligible=timestamp(t.get("eligible")),
                    gpu_tres=tres_list_text(allocated),
                )
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UnparseableOutput(bad_job("sacct", exc), json.dumps(j)[:2000]) from exc
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
    return nodes_of(expr, expr)


@functools.lru_cache(maxsize=4096)
def _gpus_cached(tres: str) -> tuple[str | None, int]:
    return gpus_from_tres(tres)


@functools.lru_cache(maxsize=1024)
def _state_cached(state: str) -> str:
    return shown_state(states(state))


def _sacct_record(j: _SacctJob) -> AccountingRecord:
    """One typed job as `parse_sacct_json_plain` reads it (the same accessors, so the same
    record; `x or ""` is `as_text(x)` for a str or None)."""
    array = j.array
    array_job = (_tnum(array.job_id) or None) if array is not None else None
    task = _tnum(array.task_id) if array is not None else None
    gres = [
        f"{t.type}/{t.name}={_tnum(t.count) or 0}"
        for t in j.tres.allocated
        if t.type == "gres" and t.name
    ]
    gpu_tres = ",".join(gres)
    gpu_type, gpus = _gpus_cached(gpu_tres) if gres else (None, 0)
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
        comment_text = ",".join(p for p in parts if p and p not in NULLS)
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
        gpu_tres=gpu_tres,
    )
