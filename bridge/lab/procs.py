"""The lab's own processes: started detached with a pid file each, stopped by pid.

Every daemon the lab starts is recorded as `run/<name>.pid` holding its pid and the
executable path, so `down` stops exactly what `up` started and never a stranger that
reused a pid. Each carries `STB_LAB_DIR=<lab>` in its environment; `marked()` finds
any process (slurmstepd, a job's tritonserver) that inherited it, for the final sweep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int
    exe: str


def _state(pid: int) -> str | None:
    """The kernel's one-letter state of pid, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    state = _state(pid)
    if state == "Z":
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reap our own zombie child
        return False
    return state is not None


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


class ProcTable:
    """Pid files of one lab's processes under `run_dir`."""

    def __init__(self, run_dir: Path, log_dir: Path, marker: str) -> None:
        self.run_dir = run_dir
        self.log_dir = log_dir
        self.marker = marker  # value of STB_LAB_DIR given to every process

    def _pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.lab-pid"

    def get(self, name: str) -> Proc | None:
        """The recorded process if it still runs the recorded executable."""
        path = self._pidfile(name)
        try:
            pid_s, exe = path.read_text().split("\n", 1)
            pid = int(pid_s)
        except (FileNotFoundError, ValueError):
            return None
        exe = exe.strip()
        if not pid_alive(pid) or os.path.realpath(_exe(pid)) != os.path.realpath(exe):
            return None
        return Proc(name, pid, exe)

    def all(self) -> list[Proc]:
        names = sorted(p.name.removesuffix(".lab-pid") for p in self.run_dir.glob("*.lab-pid"))
        return [p for n in names if (p := self.get(n))]

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        """Start argv detached (own session), output appended to log/<name>.out."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        full_env = os.environ | env | {"STB_LAB_DIR": self.marker}
        with open(self.log_dir / f"{name}.out", "ab") as out:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                close_fds=True,
            )
        exe = os.path.realpath(_exe(child.pid) or argv[0])
        tmp = self._pidfile(name).with_suffix(".tmp")
        tmp.write_text(f"{child.pid}\n{exe}\n")
        tmp.replace(self._pidfile(name))
        return Proc(name, child.pid, exe)

    def stop(self, name: str, timeout_s: float = 15.0) -> bool:
        """SIGTERM the recorded process, SIGKILL after timeout_s. True if one was running."""
        proc = self.get(name)
        self._pidfile(name).unlink(missing_ok=True)
        if proc is None:
            return False
        terminate([proc.pid], timeout_s)
        return True

    def marked(self) -> list[int]:
        """Pids of live processes whose environment carries this lab's marker."""
        needle = f"STB_LAB_DIR={self.marker}".encode()
        found = []
        me = os.getpid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                env = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle in env.split(b"\0") and pid_alive(int(entry.name)):
                found.append(int(entry.name))
        return found


def terminate(pids: list[int], timeout_s: float = 15.0) -> None:
    """SIGTERM pids, wait up to timeout_s, then SIGKILL whatever still runs."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
