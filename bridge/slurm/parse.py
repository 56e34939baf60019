"""What every parser of Slurm's output shares, pure: the scalar accessors that take both
OpenAPI shapes of Slurm's JSON (22.05's v0.0.38, and v0.0.39+ where numbers become
`{"set", "infinite", "number"}` and states become lists), GPU counts from gres and TRES
strings, job ids (array and heterogeneous), node lists and reasons, and the loading of a
JSON document (`load_json`: its `errors` list, its job list).

One parser per command, each tested on recorded real output: `bridge.slurm.scontrol`
(`scontrol show ... -o`, `scontrol token`, `scontrol show config`), `bridge.slurm.squeue`
and `bridge.slurm.sacct` (their `--json`), `bridge.slurm.sacctmgr` (`show event`),
`bridge.slurm.sreport`; slurmrestd's answers are `bridge.slurm.rest_parse`'s. Fields the
parsers do not read are ignored, so newer releases that add fields parse as before.

Anything unexpected raises `UnparseableOutput` quoting the raw text; for JSON it also says
what was wrong (not valid JSON, and where: output cut short reads as "truncated?"; not an
object; no job list).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.slurm.errors import ControllerUnreachable, UnparseableOutput
from bridge.slurm.hostlist import HostlistError, expand

#: what Slurm prints for "no value"
NULLS = {"", "(null)", "N/A", "n/a", "None", "None assigned"}
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


def run_end(end: datetime | None, limit_min: int | None, pending: bool) -> datetime | None:
    """`Job.end_time` from Slurm's `end` and time limit (minutes; None when unlimited or
    unset, as 22.05's JSON gives UNLIMITED): None while pending (Slurm's end is then an
    estimate) and without a limit (slurmctld then sets the end to the start plus a year,
    `job_end_time_reset`: no real end)."""
    if pending or limit_min is None or limit_min >= NO_VAL:
        return None
    return end


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
    for entry in split_gres(gres):
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


def split_gres(gres: str) -> list[str]:
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
    return [e.strip() for e in out if e.strip() and e.strip() not in NULLS]


def gpus_from_tres(tres: str) -> tuple[str | None, int]:
    """GPU (type, count) from a TRES string (`cpu=1,gres/gpu=2,gres/gpu:h100=2`).

    Slurm lists the untyped total *and* each typed count; the untyped total is the
    count (typed ones are summed only when no untyped entry exists), so a GPU is never
    counted twice."""
    untyped: int | None = None
    for item in tres.split(","):
        key, _, value = item.strip().partition("=")
        if key == "gres/gpu" and value.isdigit():
            untyped = int(value)
    typed = gpu_types_of(tres)
    gpu_type = next(iter(typed), None)
    return gpu_type, untyped if untyped is not None else sum(typed.values())


def gpu_types_of(tres: str) -> dict[str, int]:
    """The typed GPU counts of a TRES string (`gres/gpu=2,gres/gpu:h100_1g.10gb=1,
    gres/gpu:h100_2g.20gb=1` -> `{"h100_1g.10gb": 1, "h100_2g.20gb": 1}`), in its order:
    a node's AllocTRES, or a job's allocated TRES (which names the MIG slices it holds
    even where it asked for any GPU)."""
    typed: dict[str, int] = {}
    for item in tres.split(","):
        key, _, value = item.strip().partition("=")
        if key.startswith("gres/gpu:") and value.isdigit():
            name = key.split(":", 1)[1]
            typed[name] = typed.get(name, 0) + int(value)
    return typed


def tres_list_text(items: list[dict[str, Any]]) -> str:
    """sacct JSON's `tres.allocated` list as the TRES string its gres entries make
    (`[{"type": "gres", "name": "gpu:a100_3g.20gb", "count": 1}]` ->
    `gres/gpu:a100_3g.20gb=1`); counts in either OpenAPI shape."""
    return ",".join(
        f"{t.get('type')}/{t.get('name')}={num(t.get('count')) or 0}"
        for t in items
        if t.get("type") == "gres" and t.get("name")
    )


def gpus_from_tres_list(items: list[dict[str, Any]]) -> tuple[str | None, int]:
    """The same rule for sacct JSON's `tres.allocated` list."""
    return gpus_from_tres(tres_list_text(items))


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


# --- node lists and reasons ---------------------------------------------------------


def nodes_of(expr: str, raw: str) -> tuple[str, ...]:
    """The node names of a hostlist expression (`n[1-3]`; none for Slurm's nulls), or
    `UnparseableOutput` quoting `raw`."""
    if expr in NULLS:
        return ()
    try:
        return tuple(expand(expr))
    except HostlistError as exc:
        raise UnparseableOutput("a node list", raw) from exc


def strip_reason(reason: str) -> str:
    """`stb: x [root@2026-11-29T14:20:35]` -> `stb: x` (Slurm appends who and when)."""
    reason = reason.strip()
    if reason in NULLS:
        return ""
    return re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", reason)


# --- JSON documents ------------------------------------------------------------------


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


def bad_job(command: str, exc: Exception) -> str:
    """What `UnparseableOutput` says of one job the parser cannot read, and why."""
    why = f"no field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
    return f"a job in {command} --json ({why or type(exc).__name__})"


def as_text(value: Any) -> str:
    """A JSON field as text ("" for null)."""
    return "" if value is None else str(value)


def benign_error(e: Any) -> bool:
    """An entry of a JSON answer's `errors` that is no failure (`_BENIGN_ERRORS`)."""
    return isinstance(e, dict) and e.get("error_number") in _BENIGN_ERRORS
