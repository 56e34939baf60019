"""What the fault cases use to make faults and read outcomes on the lab.

- Lab daemons: `stop_lab_daemon` stops one of the lab's recorded daemons (slurmctld,
  slurmdbd) by its pid file, as `stb lab down` would; `restart_lab` starts whatever is
  missing again (`stb lab up` without installing: idempotent).
- `TcpForwarder`: a loopback TCP relay (e.g. to PostgreSQL) that a test pauses: open
  connections are cut and new ones refused, then it listens again on the same port.
- `DaemonProc`: a real `stb daemon` subprocess and its exporter (`/metrics`, `/healthz`).
- `tritonserver_pids`: the tritonserver processes bound to one node's address.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bridge.lab import lab as lab_mod
from bridge.lab.procs import ProcTable
from bridge.lab.spec import LabSpec
from bridge.paths import project_root

K = TypeVar("K")


def until(what: str, cond: Callable[[], bool], timeout_s: float, step: float = 0.2) -> float:
    """Poll cond() until true; returns the seconds it took, fails naming `what`."""
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s:g}s"
        time.sleep(step)
    return time.monotonic() - start


# ---- lab daemons ------------------------------------------------------------------------


def _table(spec: LabSpec) -> ProcTable:
    return ProcTable(spec.run_dir, spec.log_dir, str(spec.lab_dir))


def lab_daemon_running(spec: LabSpec, name: str) -> bool:
    return _table(spec).get(name) is not None


def stop_lab_daemon(spec: LabSpec, name: str) -> None:
    """SIGTERM the lab's `name` (its pid file says which process), SIGKILL after 15 s."""
    assert _table(spec).stop(name), f"the lab's {name} was not running"


def restart_lab(spec: LabSpec) -> None:
    """Start every lab daemon that is not running and wait until the nodes are up."""
    lab_mod.up(spec, say=lambda _m: None, install=False)


def lab_env(spec: LabSpec) -> dict[str, str]:
    """The environment of a subprocess that talks to the lab (SLURM_CONF, STB_HOME)."""
    return dict(os.environ) | spec.env() | {"STB_HOME": str(project_root())}


def stb() -> str:
    return str(Path(sys.executable).with_name("stb"))


def stb_ingest(spec: LabSpec, config: Path, since: datetime, until: datetime) -> tuple[int, str]:
    """`stb accounting ingest` of [since, until) with `config` against the lab: its exit
    status and what it printed."""
    done = subprocess.run(
        [stb(), "accounting", "ingest", "--since", since.isoformat(),
         "--until", until.isoformat(), "-c", str(config)],
        env=lab_env(spec), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


# ---- Triton processes ---------------------------------------------------------------------


def tritonserver_pids(addr: str) -> list[int]:
    """Pids of the tritonserver processes bound to `addr` (a node's loopback address)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and os.path.basename(argv[0]) == b"tritonserver"
            and f"--http-address={addr}".encode() in argv
        ):
            found.append(int(entry.name))
    return found


# ---- a pausable TCP forwarder ---------------------------------------------------------------


class TcpForwarder:
    """Relays 127.0.0.1:<port> to `target`. `pause()` cuts every open connection and closes
    the listening socket (new connections are refused); `resume()` listens again on the
    same port. Loopback only; one thread per direction of each connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        assert target[0].startswith("127."), "loopback targets only"
        self.target = target
        self.port = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.accepted = 0

    def start(self) -> TcpForwarder:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by pause()/close()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # paused meanwhile
                    client.close()
                    upstream.close()
                    return
                self._conns |= {client, upstream}
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([src], [], [], 1.0)
                if not ready:
                    if src.fileno() < 0:
                        return
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            self._drop(src)
            self._drop(dst)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def pause(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = set(self._conns), set()
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave
            # the socket listening until that accept() returned
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in conns:
            self._drop(sock)

    def resume(self) -> None:
        assert self._listener is None, "not paused"
        self.start()

    def close(self) -> None:
        self.pause()

    def refuses(self) -> bool:
        """Whether a new connection is refused right now."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return True
        return False


# ---- the daemon subprocess and its metrics ------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    """One scrape of the daemon's /metrics: (sample name, labels) -> value."""

    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = float(s.value)
        return cls(out)

    def sum(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def by(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, ls), v in self.samples.items():
            if n == name:
                key = dict(ls).get(label, "")
                out[key] = out.get(key, 0.0) + v
        return out

    def ticks(self) -> dict[str, float]:
        """stb_ticks_total by outcome."""
        return self.by("stb_ticks_total", "outcome")

    def step_errors(self) -> dict[tuple[str, str], float]:
        """stb_step_errors_total by (step, kind)."""
        out: dict[tuple[str, str], float] = {}
        for (n, ls), v in self.samples.items():
            if n == "stb_step_errors_total":
                d = dict(ls)
                key = (d.get("step", ""), d.get("kind", ""))
                out[key] = out.get(key, 0.0) + v
        return out


def delta(after: Mapping[K, float], before: Mapping[K, float]) -> dict[K, float]:
    """after - before, key by key (a missing key counts 0); zero entries left out."""
    out = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}
    return {k: v for k, v in out.items() if v}


class DaemonProc:
    """`stb daemon -c config` as a subprocess; output appended to `log`."""

    def __init__(self, config: Path, env: Mapping[str, str], log: Path) -> None:
        self.config = config
        self.env = dict(env)
        self.log_path = log
        doc = tomllib.loads(config.read_text())
        self.exporter = doc["daemon"]["exporter_listen"]
        self.listen = doc["routing"]["listen"]
        self.database_url = doc["database_url"]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> DaemonProc:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [stb(), "daemon", "-c", str(self.config)],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def metrics(self) -> Metrics | None:
        try:
            r = httpx.get(f"http://{self.exporter}/metrics", timeout=3)
        except httpx.HTTPError:
            return None
        return Metrics.parse(r.text) if r.status_code == 200 else None

    def must_metrics(self) -> Metrics:
        deadline = time.monotonic() + 10
        while True:
            m = self.metrics()
            if m is not None:
                return m
            assert self.alive(), f"the daemon exited:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"no /metrics from the daemon:\n{self.log_tail()}"
            time.sleep(0.2)

    def healthz(self) -> int | None:
        try:
            return httpx.get(f"http://{self.exporter}/healthz", timeout=3).status_code
        except httpx.HTTPError:
            return None


def infer_through(endpoint: str, model: str = "busy", n: int = 10) -> list[tuple[int, str]]:
    """n inference requests through nginx (no keep-alive): (status, X-Stb-Upstream)."""
    out = []
    body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    for _ in range(n):
        try:
            r = httpx.post(f"http://{endpoint}/v2/models/{model}/infer", json=body, timeout=10)
            out.append((r.status_code, r.headers.get("X-Stb-Upstream", "")))
        except httpx.HTTPError as exc:
            out.append((0, type(exc).__name__))
    return out
