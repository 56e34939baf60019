"""Several real `stb daemon` processes on the lab against one PostgreSQL database: the
high-availability setup of a site, on one host. For the HA lab test and
`bench/failover.py`.

`scratch_database()` makes a PostgreSQL database of its own (dropped afterwards) on the
local server or `$STB_TEST_POSTGRES_URL`; `Instance` is one daemon (its own nginx,
exporter port and work folder, the shared database), started, killed with SIGKILL, and
read through its /healthz and /metrics. `cancel_triton_jobs` clears the Triton jobs they
leave.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bridge.lab.demo import daemon_toml
from bridge.lab.spec import LabSpec
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import TRITON_TAG

ADMIN_URL = os.environ.get("STB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class NoPostgres(RuntimeError):
    """No PostgreSQL server answers; the message says where it was looked for."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def scratch_database(admin_url: str = ADMIN_URL) -> Iterator[str]:
    """A new PostgreSQL database (`stb_ha_<random>`); its SQLAlchemy URL. Dropped after."""
    try:
        psycopg.connect(admin_url, autocommit=True, connect_timeout=3).close()
    except psycopg.Error as exc:
        raise NoPostgres(f"no PostgreSQL answers at {admin_url}: {exc}") from exc
    name = f"stb_ha_{secrets.token_hex(4)}"
    base = admin_url.rsplit("/", 1)[0]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
    finally:
        # a connection of its own: the server may have restarted meanwhile (a test does)
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cancel_triton_jobs(spec: LabSpec, timeout_s: float = 60) -> None:
    """Cancel every Triton job the daemons left (the baselines they start on the reserved
    node outlive them by design) and wait until Slurm has let them go, so the next user
    of the lab finds its ports free."""
    cli = SlurmCLI(env=spec.env())
    for job in cli.jobs(tag=TRITON_TAG):
        cli.cancel(job.job_id)
    deadline = time.monotonic() + timeout_s
    while cli.jobs(tag=TRITON_TAG) and time.monotonic() < deadline:
        time.sleep(0.5)


@dataclass
class Instance:
    """One `stb daemon` of the pair (or more), with everything but the database its own."""

    name: str
    spec: LabSpec
    work: Path
    database_url: str
    tick_s: float = 2
    exporter: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    proc: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.work / "bridge.toml"

    @property
    def log(self) -> Path:
        return self.work / "daemon.log"

    def start(self) -> Instance:
        self.work.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            daemon_toml(
                self.spec,
                self.work,
                listen=f"127.0.0.1:{free_port()}",
                exporter=self.exporter,
                tick_s=self.tick_s,
                ingest_interval_s=0,
                database_url=self.database_url,
                instance=self.name,
            )
        )
        stb = str(Path(sys.executable).with_name("stb"))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [stb, "daemon", "-c", str(self.config)],
                env=os.environ | self.spec.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def kill(self) -> None:
        """SIGKILL: the host is gone (its nginx, a separate process, stays up)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (the lease is handed over at once), then nginx."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        prefix = self.work / "nginx"
        if (prefix / "run" / "nginx.pid").exists():
            subprocess.run(
                [
                    "nginx",
                    "-p",
                    str(prefix),
                    "-c",
                    str(prefix / "conf" / "nginx.conf"),
                    "-s",
                    "quit",
                ],
                capture_output=True,
                check=False,
            )

    def health(self) -> dict[str, Any] | None:
        try:
            doc = httpx.get(f"http://{self.exporter}/healthz", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None
        return dict(doc)

    def role(self) -> str | None:
        health = self.health()
        return None if health is None else str(health.get("role"))

    def metric(self, name: str) -> float | None:
        try:
            text = httpx.get(f"http://{self.exporter}/metrics", timeout=2).text
        except httpx.HTTPError:
            return None
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name:
                    return float(s.value)
        return None

    def wait_role(self, role: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.role() == role:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"daemon {self.name} exited: see {self.log}")
            time.sleep(0.1)
        raise TimeoutError(f"daemon {self.name} not {role} within {timeout_s:g}s: see {self.log}")


__all__ = ["Instance", "NoPostgres", "cancel_triton_jobs", "free_port", "scratch_database"]
