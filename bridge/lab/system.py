"""Host preparation for the lab: Debian packages, fake GPU devices, the munge and JWT
keys, slurmrestd's and the Triton servers' unprivileged users, and finding (or
providing) a MariaDB for slurmdbd. Each step is idempotent.

Called by `bridge.lab.lab.up`. Needs root: it installs packages and makes device nodes.
"""

from __future__ import annotations

import os
import re
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
    # the REST API daemon (`STB_SLURM_BACKEND=rest`) and the auth/jwt plugin it needs
    "slurmrestd": "slurmrestd",
    "nginx": "nginx-light",
    "prometheus": "prometheus",
    # the C compiler builds the Triton key shim (bridge.daemon.keyshim)
    "cc": "gcc",
}
#: Slurm plugins the lab needs, by file name, and the Debian package of each
PLUGINS = {"auth_jwt.so": "slurm-wlm-jwt-plugin"}
#: Where Debian's Slurm packages put their plugins (PluginDir)
PLUGIN_DIRS = (
    "/usr/lib/x86_64-linux-gnu/slurm-wlm",
    "/usr/lib/aarch64-linux-gnu/slurm-wlm",
    "/usr/lib/slurm",
    "/usr/lib64/slurm",
)
#: The unprivileged user (and group) slurmrestd runs as: it refuses root and SlurmUser
#: (slurmrestd(8), -u and -g), and needs no file of the lab's after it starts
REST_USER = "stb-rest"
#: the user a lab Triton job with `[triton] run_as` serves as (made by `stb lab up`)
TRITON_USER = "stb-triton"
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
    missing = sorted(
        {pkg for binary, pkg in PACKAGES.items() if not _which(binary)}
        | {pkg for plugin, pkg in PLUGINS.items() if not has_plugin(plugin)}
    )
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


def slurm_release() -> tuple[int, int]:
    """The installed Slurm's (major, minor), from `slurmctld -V` ("slurm 24.11.5")."""
    ctld = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
    try:
        out = subprocess.run([ctld, "-V"], capture_output=True, text=True, timeout=30).stdout
    except OSError as exc:
        raise LabSystemError(f"cannot run {ctld} -V: {exc}") from exc
    m = re.search(r"(\d+)\.(\d+)", out)
    if not m:
        raise LabSystemError(f"{ctld} -V printed no release: {out.strip()!r}")
    return int(m[1]), int(m[2])


def has_plugin(name: str) -> bool:
    """Whether a Slurm plugin (e.g. "auth_jwt.so") is installed."""
    return any(Path(d, name).exists() for d in PLUGIN_DIRS)


def rest_available() -> bool:
    """Whether the lab can run slurmrestd: the daemon and the auth/jwt plugin are
    installed (`stb lab up` installs both; `--no-install` may leave them out)."""
    return _which("slurmrestd") and has_plugin("auth_jwt.so")


def readable_by_others(path: Path) -> bool:
    """Whether a user with no rights of its own (slurmrestd's) can read `path`: the file
    readable by others and every folder above it searchable by others."""
    path = path.resolve()
    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)
    except OSError:
        return False


def make_jwt_key(spec: LabSpec) -> None:
    """The HS256 key of the lab's JWTs: 32 random bytes, mode 0600, owned by SlurmUser
    (root here), as Slurm's JWT guide makes it. Made once, kept afterwards (tokens signed
    with it stay valid across `down` and `up`)."""
    key = spec.jwt_key
    if key.exists() and key.stat().st_size >= 32:
        os.chmod(key, 0o600)
        return
    spec.etc.mkdir(parents=True, exist_ok=True)
    tmp = key.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    tmp.replace(key)


def ensure_rest_user() -> str:
    """The system user and group slurmrestd drops to (`REST_USER`), made when missing:
    no home, no login shell, no other rights."""
    return ensure_system_user(REST_USER)


def ensure_system_user(name: str) -> str:
    """The system user and group `name`, made when missing: no home, no login shell, no
    other rights (slurmrestd's `REST_USER`; the Triton servers' `TRITON_USER`)."""
    done = subprocess.run(["id", "-u", name], capture_output=True, text=True)
    if done.returncode != 0:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        argv = [useradd, "--system", "--user-group", "--no-create-home",
                "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                name]  # fmt: skip
        made = subprocess.run(argv, capture_output=True, text=True)
        if made.returncode != 0:
            raise LabSystemError(f"{' '.join(argv)} failed: {made.stderr.strip()}")
    return name


def make_gpu_devices(spec: LabSpec) -> None:
    """Character devices standing in for GPUs: <lab>/dev/<node>-gpu<i>."""
    spec.dev_dir.mkdir(parents=True, exist_ok=True)
    devices = {n.name: spec.gpus_per_node for n in spec.nodes}
    devices.update({n.name: len(spec.mig_profiles) for n in spec.mig_nodes})
    for n_index, node in enumerate(spec.all_nodes):
        for i in range(devices[node.name]):
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


def create_database(host: str, port: int, user: str, password: str, name: str) -> None:
    """`CREATE DATABASE IF NOT EXISTS name` with the mariadb client (installed when
    missing), before slurmdbd first starts. slurmdbd would create it itself, but it does so
    by retrying its failed connection on the same client handle, and MariaDB's client
    library of Debian trixie and later (Connector/C 3.4, MariaDB 11.8) then refuses every
    result on that handle ("Number of columns in result (=1) set execeeds maxmimum allowed
    number of columns (=0)", error 5027): slurmdbd 24.11 and 26.05 exit at start. A
    database that exists makes that first connection succeed."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise LabSystemError(f"database name {name!r} must be letters, digits or '_'")
    if not (shutil.which("mariadb") or shutil.which("mysql")):
        apt_install(["mariadb-client"], lambda m: None)
    client = shutil.which("mariadb") or shutil.which("mysql") or "/usr/bin/mariadb"
    argv = [client, "--no-defaults", "--protocol=TCP", f"--host={host}", f"--port={port}",
            f"--user={user}", "-e", f"CREATE DATABASE IF NOT EXISTS `{name}`"]  # fmt: skip
    env = os.environ | ({"MYSQL_PWD": password} if password else {})
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise LabSystemError(
            f"could not create database {name} on {host}:{port}: {done.stderr.strip()}"
        )


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
