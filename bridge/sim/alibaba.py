"""The Alibaba GPU trace v2023's pod list (`shared/traces/alibaba_gpu2023_tasks.csv`, see
its SOURCES.md) read into the GPU tasks that ran: `bridge.sim.workload.alibaba_jobs`
replays them as batch jobs. Pure parsing; a malformed file is a ValueError naming it and
the line.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TraceTask:
    """One GPU task of the Alibaba trace that ran."""

    #: creation_time: seconds from the trace's start
    submit_s: float
    #: deletion_time - scheduled_time
    duration_s: float
    gpus: int
    #: LS, BE, Burstable or Guaranteed
    qos: str


_ALIBABA_COLUMNS = ("num_gpu", "qos", "creation_time", "scheduled_time", "deletion_time")


def _field(path: Path, line: int, column: str, raw: str) -> float | None:
    """A non-negative number, or None for an empty field; else ValueError naming where."""
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{path}: line {line}: {column} {raw!r} is not a number >= 0")
    return value


def read_alibaba_tasks(path: Path) -> list[TraceTask]:
    """The GPU tasks that ran, from an Alibaba GPU trace v2023 pod list, by submit time.

    Skips tasks with no GPU (num_gpu 0), never scheduled (empty scheduled_time), with no
    deletion_time or with deletion_time <= scheduled_time. Tolerates CRLF, a missing final
    newline, a byte-order mark, blank lines and empty unused fields. Raises ValueError
    naming the file (and line) for a missing column, a row with fewer fields than the
    header, an empty num_gpu or creation_time, a field that is not a number >= 0, a
    fractional num_gpu, or no usable task at all.
    """
    tasks: list[TraceTask] = []
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next((row for row in reader if any(c.strip() for c in row)), None)
            if header is None:
                raise ValueError(f"{path}: empty file (no header)")
            names = [c.strip() for c in header]
            missing = [c for c in _ALIBABA_COLUMNS if c not in names]
            if missing:
                raise ValueError(f"{path}: no column {', '.join(missing)} in header {names}")
            cols = [names.index(c) for c in _ALIBABA_COLUMNS]
            for row in reader:
                if not any(c.strip() for c in row):
                    continue
                line = reader.line_num
                if len(row) < len(names):
                    raise ValueError(
                        f"{path}: line {line}: {len(row)} fields, the header has {len(names)}"
                    )
                gpus_raw, qos, *times_raw = (row[i].strip() for i in cols)
                gpus = _field(path, line, "num_gpu", gpus_raw)
                created, scheduled, deleted = (
                    _field(path, line, c, raw)
                    for c, raw in zip(_ALIBABA_COLUMNS[2:], times_raw, strict=True)
                )
                if gpus is None or created is None:
                    what = "num_gpu" if gpus is None else "creation_time"
                    raise ValueError(f"{path}: line {line}: empty {what}")
                if not gpus.is_integer():
                    raise ValueError(f"{path}: line {line}: num_gpu {gpus_raw!r} is fractional")
                if gpus == 0 or scheduled is None or deleted is None or deleted <= scheduled:
                    continue
                tasks.append(TraceTask(created, deleted - scheduled, int(gpus), qos))
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"trace {path} is not UTF-8 text: {exc}") from None
    if not tasks:
        raise ValueError(f"{path}: no usable task (a GPU task with a start and an end)")
    tasks.sort(key=lambda t: t.submit_s)
    return tasks
