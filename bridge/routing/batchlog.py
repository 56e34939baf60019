"""Count the batch route's requests from nginx's batch access log.

Triton counts a model's requests whoever sent them: a batch request through
`/batch/v2/models/<model>/...` and an online one are the same request to it, and its
metrics cannot tell them apart (a request parameter or a response header is no count).
nginx can: every batch location writes one line per request to the batch access log
(`bridge.routing.nginx`, format `$msec $status $request_uri $stb_batch_job
$upstream_response_time`; lines of the older format, the first three fields, still read).
The reconciler reads the
lines appended since its last pass (`BatchLog.read`) and gets, per model, the batch
requests nginx passed to the replicas and those it refused (429, the gate closed); the
batch gate's rule (`bridge.policy.batch`) takes the passed ones' rate off each model's
measured rate to see the online load alone.

Reading: from the offset of the last read; the first read starts at the file's end (what
was logged before this daemon started is not this pass's load); a file replaced (another
inode: logrotate) or cut shorter is read from its start; a line not yet finished waits for
the next read; at most `max_bytes` a read (a backlog beyond that is skipped and the window
marked unknown). A log that cannot be read gives unknown counts, never zero: the rule then
takes the whole measured load as online, which closes the gate sooner, never later.

For the ledger (`tally`): the requests answered (status 200) per hour of `$msec`, model
and the batch job the request named (the client's `X-Stb-Job` header, which nginx logs
only as digits and underscores, else `-`; a field of anything else, `-` and an old line
name no job: ""), kept in `answered` until the caller has stored them, with the log's
`position` (inode, bytes read up to the last complete line) to store beside them; a
daemon that restarts `resume`s from the stored position instead of the log's end, so
what was logged while it was down is counted once (a backlog over `max_bytes` excepted).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bridge.routing.nginx import BATCH_PREFIX

#: the largest read of one pass (bytes): about 300,000 lines of the log's format
MAX_READ_BYTES = 16 * 1024 * 1024
_MODELS = f"{BATCH_PREFIX}/v2/models/"


@dataclass(frozen=True)
class BatchCounts:
    """The batch route's requests over one window, per model."""

    #: seconds the window spans (between two reads); None: no window (the first read, a
    #: log that could not be read, or a backlog skipped): the counts are unknown
    window_s: float | None
    #: requests nginx passed to a model's replicas (any status but 429)
    passed: Mapping[str, int] = field(default_factory=dict)
    #: requests answered 429: the gate was closed
    refused: Mapping[str, int] = field(default_factory=dict)

    def rates(self) -> dict[str, float] | None:
        """Per model, the passed requests per second over the window; None when the
        window is unknown."""
        if self.window_s is None or self.window_s <= 0:
            return None
        return {m: n / self.window_s for m, n in self.passed.items()}


#: a job id as the ledger keys it: Slurm's `123` or an array task's `123_4`
JOB_ID_RE = re.compile(r"[0-9][0-9_]{0,63}")


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One batch request as its log line says it."""

    model: str
    status: int
    #: when nginx logged it (`$msec`, epoch seconds); None where the field is not a time
    at: float | None
    #: the batch job it named ("": none, or a field that is no job id)
    job: str = ""


def parse_entry(line: str) -> BatchLine | None:
    """One log line: `$msec $status $request_uri` (the older format) or that followed by
    the job (`$stb_batch_job`) and anything (`$upstream_response_time`, which may hold
    spaces); None for a line of another shape or a path that names no model."""
    parts = line.split()
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    uri = parts[2].split("?", 1)[0]
    if not uri.startswith(_MODELS):
        return None
    model = uri[len(_MODELS) :].split("/", 1)[0]
    if not model:
        return None
    try:
        at: float | None = float(parts[0])
    except ValueError:
        at = None
    job = parts[3] if len(parts) > 3 and JOB_ID_RE.fullmatch(parts[3]) else ""
    return BatchLine(model, int(parts[1]), at, job)


def parse_line(line: str) -> tuple[str, int] | None:
    """(model, HTTP status) of one log line (`parse_entry`)."""
    got = parse_entry(line)
    return None if got is None else (got.model, got.status)


def count(lines: Iterable[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per model, the (passed, refused) requests the lines record."""
    passed: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    for line in lines:
        got = parse_line(line)
        if got is None:
            continue
        model, status = got
        (refused if status == 429 else passed)[model] += 1
    return dict(passed), dict(refused)


def hour_of(at: float) -> datetime:
    """The UTC hour bucket of an epoch time."""
    return datetime.fromtimestamp(int(at // 3600) * 3600, UTC)


def answered(lines: Iterable[str]) -> Counter[tuple[datetime, str, str]]:
    """Per (hour bucket, model, job) the requests the lines record answered (status 200;
    a line with no time is left out)."""
    out: Counter[tuple[datetime, str, str]] = Counter()
    for line in lines:
        got = parse_entry(line)
        if got is not None and got.status == 200 and got.at is not None:
            out[(hour_of(got.at), got.model, got.job)] += 1
    return out


class BatchLog:
    """The batch access log at `path`, read forward one pass at a time."""

    def __init__(self, path: Path, max_bytes: int = MAX_READ_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        #: count the answered requests for the ledger (`answered`)
        self.tally = False
        #: answered requests read and not yet stored (the caller clears what it stored)
        self.answered: Counter[tuple[datetime, str, str]] = Counter()
        self._inode: int | None = None
        self._offset = 0
        self._last_at: float | None = None
        self._rest = b""

    def resume(self, inode: int, offset: int) -> None:
        """Start the next read at `offset` of the file `inode` (where the stored counts
        end) instead of the log's end; another file there now is read from its start."""
        if offset < 0:
            raise ValueError(f"a batch log position cannot be negative: {offset}")
        self._inode, self._offset, self._rest = inode, offset, b""

    def position(self) -> tuple[int, int] | None:
        """(inode, bytes read up to the end of the last complete line); None before the
        first read or after a failed one."""
        if self._inode is None:
            return None
        return self._inode, self._offset - len(self._rest)

    def read(self, now: float) -> BatchCounts:
        """The requests logged since the last read, `now` on the caller's clock (seconds;
        the window is the time between two reads)."""
        last, self._last_at = self._last_at, now
        try:
            data, known = self._new_bytes()
        except OSError:
            self._inode, self._rest = None, b""
            return BatchCounts(None)
        complete, _, self._rest = (self._rest + data).rpartition(b"\n")
        lines = complete.decode("utf-8", "replace").splitlines() if known else []
        if self.tally:
            self.answered.update(answered(lines))
        if not known or last is None:
            return BatchCounts(None)
        passed, refused = count(lines)
        return BatchCounts(now - last, passed, refused)

    def _new_bytes(self) -> tuple[bytes, bool]:
        """The bytes appended since the last read, and whether they are all of them."""
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            if self._inode is None:  # the first read: from the end
                self._inode, self._offset = st.st_ino, st.st_size
                return b"", False
            if st.st_ino != self._inode or st.st_size < self._offset:  # rotated, cut
                self._inode, self._offset, self._rest = st.st_ino, 0, b""
            if st.st_size - self._offset > self.max_bytes:  # a backlog: skipped
                self._offset, self._rest = st.st_size, b""
                return b"", False
            f.seek(self._offset)
            data = f.read(st.st_size - self._offset)
            self._offset += len(data)
            return data, True
