"""Count the batch route's requests from nginx's batch access log.

Triton counts a model's requests whoever sent them: a batch request through
`/batch/v2/models/<model>/...` and an online one are the same request to it, and its
metrics cannot tell them apart (a request parameter or a response header is no count).
nginx can: every batch location writes one line per request to the batch access log
(`bridge.routing.nginx`, format `$msec $status $request_uri`). The reconciler reads the
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
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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


def parse_line(line: str) -> tuple[str, int] | None:
    """(model, HTTP status) of one log line (`$msec $status $request_uri`); None for a
    line of another shape or a path that names no model."""
    parts = line.split()
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    uri = parts[2].split("?", 1)[0]
    if not uri.startswith(_MODELS):
        return None
    model = uri[len(_MODELS) :].split("/", 1)[0]
    return (model, int(parts[1])) if model else None


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


class BatchLog:
    """The batch access log at `path`, read forward one pass at a time."""

    def __init__(self, path: Path, max_bytes: int = MAX_READ_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._inode: int | None = None
        self._offset = 0
        self._last_at: float | None = None
        self._rest = b""

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
        if not known or last is None:
            return BatchCounts(None)
        passed, refused = count(complete.decode("utf-8", "replace").splitlines())
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
