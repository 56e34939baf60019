"""The lab's process table: start detached, find by pid file, stop by pid only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bridge.lab.procs import ProcTable, pid_alive


def test_start_get_stop(tmp_path: Path) -> None:
    table = ProcTable(tmp_path / "run", tmp_path / "log", marker=str(tmp_path))
    proc = table.start("sleeper", ["sleep", "60"], {})
    assert table.get("sleeper") == proc
    # Popen returns once exec has closed its error pipe, which the kernel does before it
    # writes the new image's environment: for a moment /proc/PID/environ reads empty.
    deadline = time.monotonic() + 5
    while proc.pid not in table.marked() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.pid in table.marked()
    assert table.stop("sleeper", timeout_s=5)
    assert not pid_alive(proc.pid)
    assert table.get("sleeper") is None
    assert not table.stop("sleeper")  # stopping twice is harmless


def test_a_recycled_pid_is_not_taken_for_ours(tmp_path: Path) -> None:
    table = ProcTable(tmp_path / "run", tmp_path / "log", marker=str(tmp_path))
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # A pid file naming a live process that runs another executable.
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "ghost.lab-pid").write_text(f"{stranger.pid}\n/usr/sbin/slurmd\n")
        assert table.get("ghost") is None
        table.stop("ghost")
        assert stranger.poll() is None  # not killed
    finally:
        stranger.kill()
        stranger.wait()


def test_marker_finds_descendants_that_inherit_it(tmp_path: Path) -> None:
    table = ProcTable(tmp_path / "run", tmp_path / "log", marker=str(tmp_path))
    table.start("parent", ["sh", "-c", "sleep 60 & wait"], {})
    try:
        deadline = time.monotonic() + 5
        while len(table.marked()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(table.marked()) >= 2  # the shell and its sleep
        assert os.getpid() not in table.marked()
    finally:
        from bridge.lab.procs import terminate

        terminate(table.marked(), timeout_s=5)
    assert table.marked() == []
