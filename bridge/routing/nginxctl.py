"""Install a routing file into a running nginx: test, swap, graceful reload.

`NginxControl` is called by `bridge.routing.publisher` (the daemon, each tick the table
changes); `NginxProcess` runs a lab nginx whose every file lives under one prefix folder
(lab tests, the lab cluster). Commands run as argument lists with a timeout, no shell.

Installing a candidate file: `nginx -t` can only test the file that the main configuration
includes, so the candidate is written and fsynced beside the live file, swapped in by
rename (the previous file kept as a hard link), tested with `nginx -t -c <main conf>`, and
on failure the previous file is renamed back and nginx's own words are raised. nginx reads
the file only on reload, and the bridge reloads only after a passing test; at every instant
the path holds one whole file. Reload is SIGHUP to the master (from its pid file): the
master starts new workers with the new configuration, old workers stop accepting, finish
their in-flight requests and exit. `reload()` returns once new workers run and no old one
accepts, so a replica removed from the table gets no new connection after it returns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bridge.routing.errors import NginxConfigRejected, NginxUnavailable
from bridge.routing.files import fsync_dir, write_durably

COMMAND_TIMEOUT_S = 10.0
"""Bound on one nginx command (`-t`, `-s quit`); a config test takes milliseconds."""


def find_nginx() -> str:
    """The nginx binary on PATH, else Debian's /usr/sbin/nginx (root's PATH has it, a
    user's PATH often does not)."""
    return shutil.which("nginx") or "/usr/sbin/nginx"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def child_pids(pid: int) -> set[int]:
    """Pids whose parent is `pid`, from /proc."""
    kids: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.add(int(entry.name))
    return kids


def _accepting(worker: int) -> bool:
    """Whether an nginx worker still takes new connections: a worker told to quit
    retitles itself "nginx: worker process is shutting down"."""
    try:
        title = Path(f"/proc/{worker}/cmdline").read_bytes()
    except OSError:
        return False
    return bool(title) and b"shutting down" not in title


def _tail(path: Path | None, lines: int = 5) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class NginxControl:
    """One running nginx, as the bridge sees it: its main configuration and pid file."""

    main_conf: Path
    """The main configuration (`-c`); it includes the routing file."""
    pid_file: Path
    """The master's pid file (the `pid` directive of `main_conf`)."""
    prefix: Path | None = None
    """nginx's prefix (`-p`) when relative paths in `main_conf` need one."""
    error_log: Path | None = None
    """Startup error log (`-e`); also read to explain a failed reload."""
    nginx_bin: str = field(default_factory=find_nginx)
    reload_timeout_s: float = 5.0
    """Seconds to wait for a new worker after SIGHUP: nginx starts one in milliseconds;
    none after seconds means the reload failed (the master logs why)."""

    def argv(self, *extra: str) -> list[str]:
        argv = [self.nginx_bin]
        if self.prefix is not None:
            argv += ["-p", f"{self.prefix}/"]
        if self.error_log is not None:
            argv += ["-e", str(self.error_log)]
        return [*argv, "-c", str(self.main_conf), *extra]

    def test(self) -> None:
        """`nginx -t` of the main configuration as it is on disk; NginxConfigRejected
        quoting nginx when it fails."""
        try:
            proc = subprocess.run(
                self.argv("-t", "-q"),
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NginxConfigRejected(str(self.main_conf), f"nginx -t did not run: {exc}") from exc
        if proc.returncode != 0:
            words = (proc.stderr.strip() or proc.stdout.strip()) or f"exit {proc.returncode}"
            raise NginxConfigRejected(str(self.main_conf), words)

    def install(self, path: Path, text: str) -> None:
        """Make `text` the content of `path` if nginx accepts it; otherwise leave the
        previous file (or no file) in place and raise NginxConfigRejected."""
        new = path.with_name(f".{path.name}.new")
        prev = path.with_name(f".{path.name}.prev")
        write_durably(new, text.encode())
        prev.unlink(missing_ok=True)
        had_old = path.exists()
        if had_old:
            os.link(path, prev)
        try:
            os.replace(new, path)
            try:
                self.test()
            except NginxConfigRejected as exc:
                if had_old:
                    os.replace(prev, path)
                else:
                    path.unlink(missing_ok=True)
                raise NginxConfigRejected(str(path), exc.output) from None
        finally:
            new.unlink(missing_ok=True)
            prev.unlink(missing_ok=True)
            fsync_dir(path.parent)

    def master_pid(self) -> int:
        """The running master's pid; NginxUnavailable when there is none."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise NginxUnavailable(f"no nginx pid in {self.pid_file}: {exc}") from exc
        exe = ""
        with contextlib.suppress(OSError):
            exe = os.readlink(f"/proc/{pid}/exe")
        if not _alive(pid) or os.path.basename(exe) != os.path.basename(self.nginx_bin):
            raise NginxUnavailable(f"nginx pid {pid} from {self.pid_file} is not running")
        return pid

    def reload(self) -> float:
        """Graceful reload; returns the seconds until it took effect: the master runs a
        new worker and every old worker has stopped accepting (its title says
        "shutting down"; it still finishes the requests it holds)."""
        pid = self.master_pid()
        before = child_pids(pid)
        start = time.monotonic()
        os.kill(pid, signal.SIGHUP)
        deadline = start + self.reload_timeout_s
        while time.monotonic() < deadline:
            kids = child_pids(pid)
            if kids - before and not any(_accepting(k) for k in kids & before):
                return time.monotonic() - start
            if not _alive(pid):
                break
            time.sleep(0.002)
        raise NginxUnavailable(
            f"nginx {pid} did not switch to new workers within {self.reload_timeout_s}s of "
            f"SIGHUP; its log says: {_tail(self.error_log)!r}"
        )


class NginxProcess:
    """A lab nginx with every file under `prefix`: conf/nginx.conf (main),
    conf/routing.conf (what the bridge publishes), run/nginx.pid, logs/, temp/.

    Started as `nginx -p PREFIX -e LOG -c CONF` (nginx daemonizes; its pid file says who
    the master is) and stopped with `nginx -s quit` (graceful). As root, the workers run
    as root too (`user root;`) so they can use temp paths under a private folder.
    """

    def __init__(
        self,
        prefix: Path,
        *,
        routing_conf: Path | None = None,
        nginx_bin: str | None = None,
        worker_processes: int = 1,
    ) -> None:
        self.prefix = prefix.resolve()
        self.worker_processes = worker_processes
        self.main_conf = self.prefix / "conf" / "nginx.conf"
        self.routing_conf = (routing_conf or self.prefix / "conf" / "routing.conf").resolve()
        """The file the publisher writes (the bridge config's `routing.nginx_conf`)."""
        self.control = NginxControl(
            main_conf=self.main_conf,
            pid_file=self.prefix / "run" / "nginx.pid",
            prefix=self.prefix,
            error_log=self.prefix / "logs" / "error.log",
            nginx_bin=nginx_bin or find_nginx(),
        )

    def render_main(self) -> str:
        p = self.prefix
        temp = " ".join(
            f"{kind}_temp_path {p}/temp/{kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        return "\n".join(
            [
                "# Rendered by bridge.routing.nginxctl.NginxProcess: a lab nginx under one prefix.",
                *(["user root;"] if os.geteuid() == 0 else []),
                f"worker_processes {self.worker_processes};",
                f"pid {self.control.pid_file};",
                f"error_log {self.control.error_log} notice;",
                # an old worker keeps its open connections this long after a reload (each
                # lend and return reloads): longer than the longest LLM stream, as the
                # daemon's drain (`[leases] drain_timeout_s`) waits for it
                "worker_shutdown_timeout 600s;",
                # An overloaded model queues hundreds of requests, each holding a client
                # and an upstream connection: 1024 ran out in the lab's load step.
                "worker_rlimit_nofile 32768;",
                "events { worker_connections 8192; }",
                "http {",
                '    log_format stb \'$remote_addr [$time_iso8601] "$request" $status '
                "$upstream_addr $request_time';",
                f"    access_log {p}/logs/access.log stb;",
                f"    {temp}",
                f"    include {self.routing_conf};",
                "}",
                "",
            ]
        )

    def pid(self) -> int | None:
        try:
            return self.control.master_pid()
        except NginxUnavailable:
            return None

    def start(self, timeout_s: float = 5.0) -> int:
        """Start nginx (idempotent: returns the running master's pid if there is one)."""
        if (pid := self.pid()) is not None:
            return pid
        for sub in ("conf", "run", "logs", "temp"):
            (self.prefix / sub).mkdir(parents=True, exist_ok=True)
        self.routing_conf.parent.mkdir(parents=True, exist_ok=True)
        self.main_conf.write_text(self.render_main())
        if not self.routing_conf.exists():
            self.routing_conf.write_text("# no routes published yet\n")
        try:
            proc = subprocess.run(
                self.control.argv(), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
            )
        except OSError as exc:  # no binary there, or not executable
            raise NginxUnavailable(
                f"nginx did not start: {self.control.nginx_bin}: {exc.strerror}"
                " (install nginx; `stb lab up` installs nginx-light)"
            ) from exc
        if proc.returncode != 0:
            raise NginxUnavailable(f"nginx did not start: {proc.stderr.strip()}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (pid := self.pid()) is not None:
                return pid
            time.sleep(0.01)
        log = _tail(self.control.error_log)
        raise NginxUnavailable(f"nginx wrote no live pid in {timeout_s}s: {log}")

    def reload(self) -> float:
        return self.control.reload()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful quit; SIGTERM (fast shutdown), then SIGKILL, each after `timeout_s`."""
        pid = self.pid()
        if pid is None:
            return
        subprocess.run(
            self.control.argv("-s", "quit"), capture_output=True, timeout=COMMAND_TIMEOUT_S
        )
        for sig in (signal.SIGTERM, signal.SIGKILL, None):
            deadline = time.monotonic() + timeout_s
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if not _alive(pid):
                return
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        raise NginxUnavailable(f"nginx {pid} outlived SIGKILL")

    def __enter__(self) -> NginxProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
