"""The batch access log's reader (`bridge.routing.batchlog`) on literal lines and real
files: per model passed and refused requests, a window between two reads, the first read
from the end, a line not yet finished kept for the next read, a rotated or cut file read
from its start, a backlog skipped, and unknown (never zero) counts when the log cannot be
read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bridge.routing.batchlog import BatchCounts, BatchLog, count, parse_line


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
