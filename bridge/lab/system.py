"""Host preparation for the lab: Debian packages, fake GPU devices, the munge key, and
finding (or providing) a MariaDB for slurmdbd. Each step is idempotent.

Called by `bridge.lab.lab.up`. Needs root: it installs packages and makes device nodes.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bridge.lab.spec import LabSpec

#: Debian packages the lab needs (binaries they provide are checked first).
PACKAGES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "sbatch": "slurm-client",
    "munged": "munge",
    "nginx": "nginx-light",
    "prometheus": "prometheus",
    # the C compiler builds the Triton key shim (bridge.daemon.keyshim)
    "cc": "gcc",
}
GPU_MAJOR = 195  # the NVIDIA character-device major number, for realism only

Say = Callable[[str], None]


class LabSystemError(RuntimeError):
    """The host cannot be prepared; the message says what to do."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabSystemError(
            "the lab needs root (it installs packages, makes device nodes and runs Slurm's "
            "daemons); run it with sudo"
        )


def _which(binary: str) -> bool:
    return bool(
        shutil.which(binary)
        or any(Path(d, binary).exists() for d in ("/usr/sbin", "/sbin", "/usr/bin"))
    )


def apt_install(packages: list[str], say: Say) -> None:
    if not packages:
        return
    if not shutil.which("apt-get"):
        raise LabSystemError(f"missing packages {packages} and no apt-get to install them")
    say(f"installing Debian packages: {' '.join(packages)}")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise LabSystemError(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")


def ensure_packages(say: Say) -> None:
    """Install the Slurm, munge, nginx, Prometheus and C compiler packages that are
    missing, and the libpython that Triton's Python-backend stub links against."""
    missing = sorted({pkg for binary, pkg in PACKAGES.items() if not _which(binary)})
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    libpython = f"libpython{ver}.so.1.0"
    if not any(
        Path(d, libpython).exists()
        for d in (
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
        )
    ):
        missing.append(f"libpython{ver}")
    if not Path("/usr/include/stdio.h").exists():  # libc's headers, for the key shim
        missing.append("libc6-dev")
    apt_install(missing, say)


def make_gpu_devices(spec: LabSpec) -> None:
    """Character devices standing in for GPUs: <lab>/dev/<node>-gpu<i>."""
    spec.dev_dir.mkdir(parents=True, exist_ok=True)
    for n_index, node in enumerate(spec.nodes):
        for i in range(spec.gpus_per_node):
            path = spec.dev_dir / f"{node.name}-gpu{i}"
            if path.exists():
                if stat.S_ISCHR(path.stat().st_mode):
                    continue
                path.unlink()
            try:
                os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(GPU_MAJOR, n_index * 16 + i))
            except PermissionError as exc:
                raise LabSystemError(
                    f"cannot mknod {path}: {exc}; the lab needs CAP_MKNOD (root outside a "
                    "restricted container)"
                ) from exc


def make_munge_key(spec: LabSpec) -> None:
    if spec.munge_key.exists() and spec.munge_key.stat().st_size >= 32:
        return
    spec.etc.mkdir(parents=True, exist_ok=True)
    tmp = spec.munge_key.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
    tmp.replace(spec.munge_key)


def mysql_answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when a MySQL-protocol server greets on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            greeting = s.recv(128)
    except OSError:
        return False
    return len(greeting) > 5 and greeting[4] in (10, 0xFF)


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def mariadb_server_argv(spec: LabSpec, port: int) -> list[str]:
    """Install mariadb-server if needed, initialize a datadir under the lab, and return
    the command that runs a lab-owned mariadbd on 127.0.0.1:port."""
    if not _which("mariadbd"):
        apt_install(["mariadb-server"], lambda m: None)
    datadir = spec.mysql_dir / "data"
    if not (datadir / "mysql").is_dir():
        datadir.mkdir(parents=True, exist_ok=True)
        init = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
        done = subprocess.run(
            [
                init,
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise LabSystemError(f"mariadb-install-db failed:\n{done.stderr[-2000:]}")
    mariadbd = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
    return [
        mariadbd,
        "--no-defaults",
        f"--datadir={datadir}",
        "--user=root",
        "--bind-address=127.0.0.1",
        f"--port={port}",
        f"--socket={spec.mysql_dir / 'mysqld.sock'}",
        f"--pid-file={spec.mysql_dir / 'mysqld.pid'}",
        f"--log-error={spec.log_dir / 'mariadb.log'}",
    ]
