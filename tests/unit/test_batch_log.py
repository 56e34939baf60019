"""The batch access log's reader (`bridge.routing.batchlog`) on literal lines and real
files: per model passed and refused requests, a window between two reads, the first read
from the end, a line not yet finished kept for the next read, a rotated or cut file read
from its start, a backlog skipped, and unknown (never zero) counts when the log cannot be
read; the newer lines' job (old lines name none), the answered requests per hour, model
and job a tallying log keeps for the ledger, and a read resumed at a stored position."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bridge.routing.batchlog import (
    BatchCounts,
    BatchLine,
    BatchLog,
    answered,
    count,
    parse_entry,
    parse_line,
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("1764860000.123 200 /batch/v2/models/echo/infer", ("echo", 200)),
        ("1764860000.123 429 /batch/v2/models/llama-3.1-8b/generate?x=1", ("llama-3.1-8b", 429)),
        ("1764860000.123 200 /batch/v2/models/echo", ("echo", 200)),
        ("1764860000.123 200 /v2/models/echo/infer", None),  # not the batch route
        ("1764860000.123 200 /batch/v2/models/", None),
        ("1764860000.123 2x0 /batch/v2/models/echo/infer", None),
        ("garbage", None),
        ("", None),
    ],
)
def test_parse_line(line: str, expected: tuple[str, int] | None) -> None:
    assert parse_line(line) == expected


def test_count_passed_and_refused_per_model() -> None:
    lines = [
        "1.0 200 /batch/v2/models/a/infer",
        "1.1 429 /batch/v2/models/a/infer",
        "1.2 503 /batch/v2/models/b/infer",
        "1.3 200 /batch/v2/models/a/infer",
        "torn li",
    ]
    assert count(lines) == ({"a": 2, "b": 1}, {"a": 1})


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_reads_forward_from_the_end_with_a_window(tmp_path: Path) -> None:
    path = tmp_path / "batch.log"
    path.write_text("0.1 200 /batch/v2/models/old/infer\n")
    log = BatchLog(path)
    assert log.read(100.0) == BatchCounts(None)  # the first read: what was there is history
    _append(path, "1.0 200 /batch/v2/models/a/infer\n1.1 429 /batch/v2/models/a/infer\n1.2 2")
    got = log.read(105.0)
    assert got == BatchCounts(5.0, {"a": 1}, {"a": 1})
    assert got.rates() == {"a": 0.2}
    _append(path, "00 /batch/v2/models/b/infer\n")  # the torn line, finished
    assert log.read(110.0) == BatchCounts(5.0, {"b": 1}, {})
    assert log.read(112.0) == BatchCounts(2.0, {}, {})  # nothing new: a measured zero
    assert log.read(112.0).rates() is None  # no time passed: no rate


def test_a_rotated_or_cut_log_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "batch.log"
    path.write_text("0.1 200 /batch/v2/models/a/infer\n" * 3)
    log = BatchLog(path)
    log.read(0.0)
    os.rename(path, tmp_path / "batch.log.1")  # logrotate's move
    path.write_text("1.0 200 /batch/v2/models/a/infer\n")
    assert log.read(10.0) == BatchCounts(10.0, {"a": 1}, {})
    _append(path, "1.5 200 /batch/v2/models/b/infer\n" * 2)
    assert log.read(15.0) == BatchCounts(5.0, {"b": 2}, {})
    path.write_text("")  # copytruncate's cut, then one line: shorter than was read
    _append(path, "2.0 200 /batch/v2/models/c/infer\n")
    assert log.read(20.0) == BatchCounts(5.0, {"c": 1}, {})


def test_unreadable_or_backlogged_logs_give_unknown_counts(tmp_path: Path) -> None:
    path = tmp_path / "batch.log"
    log = BatchLog(path, max_bytes=100)
    assert log.read(0.0).window_s is None  # no file yet (nginx not reloaded)
    path.write_text("")
    log.read(1.0)
    _append(path, "1.0 200 /batch/v2/models/a/infer\n" * 10)  # 330 bytes > 100
    assert log.read(2.0) == BatchCounts(None)
    _append(path, "1.0 200 /batch/v2/models/a/infer\n")
    assert log.read(3.0) == BatchCounts(1.0, {"a": 1}, {})
    path.unlink()
    assert log.read(4.0) == BatchCounts(None)
    assert BatchCounts(None).rates() is None


# --- the new format: the job each request named, for the ledger ---------------------------

H10 = 1764842400.0  # 2025-12-04 10:00 UTC, an hour's start


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # the older three fields still read: no job named
        (f"{H10 + 1} 200 /batch/v2/models/echo/infer", BatchLine("echo", 200, H10 + 1, "")),
        (f"{H10} 200 /batch/v2/models/echo/infer 1234 0.012", BatchLine("echo", 200, H10, "1234")),
        # an array task; two upstreams tried (nginx writes "a, b")
        (f"{H10} 200 /batch/v2/models/e/infer 88_3 0.002, 0.010", BatchLine("e", 200, H10, "88_3")),
        (f"{H10} 429 /batch/v2/models/e/infer - -", BatchLine("e", 429, H10, "")),
        # a job field that is no job id is not taken as one (the request still counts)
        (f"{H10} 200 /batch/v2/models/e/infer 12;rm 0.1", BatchLine("e", 200, H10, "")),
        (f"{H10} 200 /batch/v2/models/e/infer _12 0.1", BatchLine("e", 200, H10, "")),
        (f"x{H10} 200 /batch/v2/models/e/infer 12 0.1", BatchLine("e", 200, None, "12")),
        (f"{H10} 200 /v2/models/e/infer 12 0.1", None),
    ],
)
def test_parse_entry_reads_old_and_new_lines(line: str, expected: BatchLine | None) -> None:
    assert parse_entry(line) == expected


def test_answered_counts_status_200_per_hour_model_and_job() -> None:
    lines = [
        f"{H10 + 5} 200 /batch/v2/models/a/infer 7 0.01",
        f"{H10 + 3599.9} 200 /batch/v2/models/a/infer 7 0.01",
        f"{H10 + 3600} 200 /batch/v2/models/a/infer 7 0.01",  # the next hour
        f"{H10 + 6} 429 /batch/v2/models/a/infer 7 -",  # refused: not answered
        f"{H10 + 7} 500 /batch/v2/models/a/infer 7 0.01",  # failed: not answered
        f"{H10 + 8} 200 /batch/v2/models/a/infer",  # an old line: no job
        f"{H10 + 9} 200 /batch/v2/models/b/infer 8 0.01",
    ]
    hour = datetime.fromtimestamp(H10, UTC)
    assert answered(lines) == {
        (hour, "a", "7"): 2,
        (hour + timedelta(hours=1), "a", "7"): 1,
        (hour, "a", ""): 1,
        (hour, "b", "8"): 1,
    }


def test_a_tallying_log_keeps_answered_requests_and_resumes_at_a_position(tmp_path: Path) -> None:
    path = tmp_path / "batch.log"
    path.write_text(f"{H10} 200 /batch/v2/models/old/infer 1 0.1\n")
    log = BatchLog(path)
    log.tally = True
    assert log.position() is None
    log.read(0.0)  # from the end: nothing taken
    assert not log.answered and log.position() == (os.stat(path).st_ino, path.stat().st_size)
    _append(path, f"{H10} 200 /batch/v2/models/a/infer 5 0.1\n{H10} 200 /batch/v2/mo")
    log.read(1.0)
    hour = datetime.fromtimestamp(H10, UTC)
    assert log.answered == {(hour, "a", "5"): 1}
    inode, offset = log.position()  # type: ignore[misc]
    assert offset == len(path.read_bytes()) - len(f"{H10} 200 /batch/v2/mo")  # a torn line waits
    # a daemon that restarts resumes where the stored counts end: the torn line, finished,
    # and what came after are counted once; the first read gives no rates
    _append(path, f"dels/a/infer 5 0.1\n{H10} 200 /batch/v2/models/b/infer 6 0.1\n")
    again = BatchLog(path)
    again.tally = True
    again.resume(inode, offset)
    assert again.read(2.0) == BatchCounts(None)
    assert again.answered == {(hour, "a", "5"): 1, (hour, "b", "6"): 1}
    with pytest.raises(ValueError, match="negative"):
        again.resume(inode, -1)
    # another file at the path (rotated while the daemon was down): read from its start
    os.rename(path, tmp_path / "batch.log.1")
    path.write_text(f"{H10} 200 /batch/v2/models/c/infer 9 0.1\n")
    third = BatchLog(path)
    third.tally = True
    third.resume(inode, offset)
    third.read(3.0)
    assert third.answered == {(hour, "c", "9"): 1}
    # without tally nothing is kept
    plain = BatchLog(path)
    plain.resume(inode, 0)
    plain.read(4.0)
    assert not plain.answered
