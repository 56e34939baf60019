"""`stb lab up | down | status`: the one-host lab cluster's lifecycle.

`up` is idempotent: each daemon is started only when its pid file does not name a live
process, configuration is rendered from templates and refused if it would change under
running daemons. slurmrestd (the REST backend's server) is started last, on the lab's
loopback port, as an unprivileged user, where it and the auth/jwt plugin are installed.
`down` cancels the lab's jobs, stops exactly the recorded daemons, and sweeps any process
that still carries the lab's marker (slurmstepd, tritonserver).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bridge.lab import procs, render, system, triton
from bridge.lab.slurmctl import SlurmCommandError, slurm
from bridge.lab.spec import LabSpec
from bridge.lab.tokens import ensure_tokens

Say = Callable[[str], None]

#: Start order; `down` stops in reverse.
DAEMONS = ("mariadb", "munged", "slurmdbd", "slurmctld", "slurmrestd")


class LabError(RuntimeError):
    """The lab could not be brought up or down; the message says why and where to look."""


@dataclass(frozen=True)
class DaemonStatus:
    name: str
    pid: int | None
    log: Path


def _table(spec: LabSpec) -> procs.ProcTable:
    return procs.ProcTable(spec.run_dir, spec.log_dir, str(spec.lab_dir))


def _wait(
    what: str,
    ok: Callable[[], bool],
    timeout_s: float,
    log: Path,
    table: procs.ProcTable | None = None,
    name: str = "",
) -> None:
    """Poll ok() until true; fail early, quoting the logs, if the daemon died."""
    deadline = time.monotonic() + timeout_s
    died = False
    while time.monotonic() < deadline:
        if ok():
            return
        if table is not None and table.get(name) is None:
            died = True
            break
        time.sleep(0.2)
    tails = []
    for path in (log, log.with_name(f"{name}.out")):
        if name and path.exists():
            tails.append(
                f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            )
    reason = "exited" if died else f"did not come up within {timeout_s:.0f}s"
    raise LabError(f"{what} {reason}; see {log}:\n" + "\n".join(tails))


def db_settings() -> render.DbSettings:
    """MariaDB for slurmdbd: STB_LAB_DB_HOST/PORT/USER/PASSWORD, else root@127.0.0.1:3306."""
    return render.DbSettings(
        host=os.environ.get("STB_LAB_DB_HOST", "127.0.0.1"),
        port=int(os.environ.get("STB_LAB_DB_PORT", "3306")),
        user=os.environ.get("STB_LAB_DB_USER", "root"),
        password=os.environ.get("STB_LAB_DB_PASSWORD", ""),
    )


def _write_configs(spec: LabSpec, db: render.DbSettings, running: bool, jwt: bool) -> None:
    files = {
        spec.slurm_conf: (render.slurm_conf(spec, jwt=jwt), 0o644),
        spec.etc / "gres.conf": (render.gres_conf(spec), 0o644),
        spec.etc / "slurmdbd.conf": (render.slurmdbd_conf(spec, db, jwt=jwt), 0o600),
    }
    cgroup = render.cgroup_conf(system.slurm_release())  # Slurm 24.05 and later only
    if cgroup is not None:
        files[spec.etc / "cgroup.conf"] = (cgroup, 0o644)
    # Read afresh by Slurm at each use (slurmctld reloads job_submit.lua when it changes,
    # slurmd runs the hooks per job): updated even under running daemons.
    live = {
        spec.job_submit_lua: (render.job_submit_lua(), 0o644),
        **{
            spec.hook_script(hook): (render.hook_script(spec, hook, sys.executable), 0o755)
            for hook in render.HOOKS
        },
    }
    changed = [p for p, (text, _) in files.items() if not p.exists() or p.read_text() != text]
    if changed and running:
        raise LabError(
            f"the lab is running with other settings ({', '.join(p.name for p in changed)} "
            "would change); run `stb lab down` first"
        )
    changed += [p for p, (text, _) in live.items() if not p.exists() or p.read_text() != text]
    for path, (text, mode) in (files | live).items():
        if path in changed:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            os.chmod(tmp, mode)
            tmp.replace(path)


def _slurmd_name(node: str) -> str:
    return f"slurmd-{node}"


def _bin(name: str) -> str:
    for d in ("/usr/sbin", "/usr/bin", "/sbin"):
        if Path(d, name).exists():
            return str(Path(d, name))
    found = shutil.which(name)
    if not found:
        raise LabError(f"{name} is not installed")
    return found


def _start(
    table: procs.ProcTable, name: str, argv: list[str], env: dict[str, str], say: Say
) -> bool:
    if table.get(name):
        return False
    proc = table.start(name, argv, env)
    say(f"started {name} (pid {proc.pid})")
    return True


def _ensure_associations(spec: LabSpec, say: Say) -> None:
    """Register the cluster, the accounts and root as a user of each, once."""
    clusters = slurm(spec, "sacctmgr", "-n", "-P", "list", "cluster", "format=cluster")
    if spec.cluster not in clusters.split():
        slurm(spec, "sacctmgr", "-i", "add", "cluster", spec.cluster)
        say(f"registered cluster {spec.cluster} in slurmdbd")
    have = set(slurm(spec, "sacctmgr", "-n", "-P", "list", "account", "format=account").split())
    for acct in ("bridge", *spec.accounts):
        if acct not in have:
            slurm(
                spec,
                "sacctmgr",
                "-i",
                "add",
                "account",
                acct,
                f"cluster={spec.cluster}",
                f"description=lab account {acct}",
                "organization=stblab",
            )
            say(f"registered account {acct}")
    users = set(slurm(spec, "sacctmgr", "-n", "-P", "list", "assoc", "format=account,user").split())
    wanted = ["bridge", *spec.accounts]
    if any(f"{acct}|root" not in users for acct in wanted):
        default = spec.accounts[0] if spec.accounts else "bridge"
        out = slurm(
            spec,
            "sacctmgr",
            "-i",
            "add",
            "user",
            "root",
            "account=" + ",".join(wanted),
            f"defaultaccount={default}",
            f"cluster={spec.cluster}",
            check=False,
        )
        if "Nothing new added" not in out and "Associations" not in out:
            raise LabError(f"could not add user root to the lab accounts: {out.strip()}")


def _nodes_up(spec: LabSpec) -> bool:
    try:
        out = slurm(spec, "sinfo", "-a", "-h", "-N", "-o", "%N %t", timeout_s=10)
    except SlurmCommandError:
        return False
    states = dict(line.split() for line in out.splitlines() if line.strip())
    wanted = {n.name for n in spec.all_nodes}
    return wanted <= states.keys() and not any(
        states[n].rstrip("*~#!%$@^-").startswith(("down", "unk", "fail", "inval", "no_"))
        or states[n].endswith("*")
        for n in wanted
    )


def up(spec: LabSpec, say: Say = print, install: bool = True) -> None:
    """Bring the lab up (or finish bringing it up). Safe to run again."""
    system.require_root()
    if install:
        system.ensure_packages(say)
    for d in (
        spec.etc,
        spec.run_dir,
        spec.log_dir,
        spec.lab_dir / "spool" / "ctld",
        spec.gpu_spool,
        spec.triton_dir,
    ):
        d.mkdir(parents=True, exist_ok=True)
    old = LabSpec.load(spec.lab_dir)
    if old is not None:
        spec = dataclasses.replace(spec, db_name=old.db_name)  # the lab keeps its database
    table = _table(spec)
    running = bool(table.all())
    if old is not None and old != spec and running:
        raise LabError("the lab is running with another shape; run `stb lab down` first")
    spec.save()
    ensure_tokens(spec.api_dir)
    system.make_munge_key(spec)
    jwt = system.has_plugin("auth_jwt.so")
    if jwt:
        system.make_jwt_key(spec)
    system.make_gpu_devices(spec)
    system.ensure_system_user(system.TRITON_USER)  # for `[triton] run_as` (issue 33)
    for node in spec.all_nodes:
        (spec.lab_dir / "spool" / f"slurmd-{node.name}").mkdir(parents=True, exist_ok=True)

    db = db_settings()
    if not system.mysql_answers(db.host, db.port) or table.get("mariadb"):
        if db.host not in ("127.0.0.1", "localhost"):
            raise LabError(f"no MariaDB answers at {db.host}:{db.port}")
        argv = system.mariadb_server_argv(spec, db.port)
        _start(table, "mariadb", argv, {}, say)
        _wait(
            "MariaDB",
            lambda: system.mysql_answers(db.host, db.port),
            60,
            spec.log_dir / "mariadb.log",
            table,
            "mariadb",
        )
    if not table.get("slurmdbd"):
        system.create_database(db.host, db.port, db.user, db.password, spec.db_name)
    _write_configs(spec, db, running, jwt)

    env = spec.env()
    _start(
        table,
        "munged",
        [
            _bin("munged"),
            "--foreground",
            "--force",
            f"--key-file={spec.munge_key}",
            f"--socket={spec.munge_socket}",
            f"--pid-file={spec.run_dir / 'munged.pid'}",
            f"--log-file={spec.log_dir / 'munged.log'}",
            f"--seed-file={spec.run_dir / 'munged.seed'}",
        ],
        env,
        say,
    )
    _wait("munged", spec.munge_socket.exists, 20, spec.log_dir / "munged.log", table, "munged")

    _start(table, "slurmdbd", [_bin("slurmdbd"), "-D"], env, say)
    _wait(
        "slurmdbd",
        lambda: system.port_open("127.0.0.1", spec.dbd_port),
        60,
        spec.log_dir / "slurmdbd.log",
        table,
        "slurmdbd",
    )
    _ensure_associations(spec, say)

    conf = str(spec.slurm_conf)
    _start(table, "slurmctld", [_bin("slurmctld"), "-D", "-f", conf], env, say)
    _wait(
        "slurmctld",
        lambda: "is UP" in slurm(spec, "scontrol", "ping", check=False, timeout_s=5),
        60,
        spec.log_dir / "slurmctld.log",
        table,
        "slurmctld",
    )
    for node in spec.all_nodes:
        _start(
            table,
            _slurmd_name(node.name),
            [_bin("slurmd"), "-D", "-N", node.name, "-f", conf],
            env,
            say,
        )
    _wait("the slurmd of every node", lambda: _nodes_up(spec), 60, spec.log_dir / "slurmctld.log")
    if jwt and system.rest_available():
        _start_rest(spec, table, say)
    else:
        say("slurmrestd or the auth/jwt plugin is not installed: no REST API in this lab")
    triton.prepare(spec)
    try:  # the Python a Triton job of `[triton] run_as = "stb-triton"` serves with
        triton.server_python(spec)
    except triton.TritonLabError as exc:
        say(f"no Python for the Triton user ({exc}): tests of [triton] run_as skip")


@dataclass(frozen=True)
class RestDaemon:
    """How the lab runs slurmrestd: its command, its environment, and as whom."""

    argv: list[str]
    env: dict[str, str]
    #: the user it serves as: the lab's unprivileged one, or root when that user cannot
    #: read slurm.conf
    user: str


def rest_daemon(conf: Path, port: int) -> RestDaemon:
    """slurmrestd on 127.0.0.1:`port` with `conf`, JWT authentication only (rest_auth/jwt:
    each request carries X-SLURM-USER-NAME and X-SLURM-USER-TOKEN, which slurmctld and
    slurmdbd check), `SLURM_JWT=daemon` so it talks to Slurm with its callers' tokens, not
    munge (slurmrestd(8)).

    It refuses to serve as root or SlurmUser, so it drops to the lab's unprivileged user
    (`-u`/`-g`), and it reads slurm.conf after it dropped: where that user cannot reach
    the file (a checkout under a 0700 home), it stays root with the documented
    `SLURMRESTD_SECURITY=disable_user_check` instead, and says so in `user`."""
    argv = [_bin("slurmrestd"), "-f", str(conf), "-a", "rest_auth/jwt"]
    env = {"SLURM_CONF": str(conf), "SLURM_JWT": "daemon"}
    if system.readable_by_others(conf):
        user = system.ensure_rest_user()
        argv += ["-u", user, "-g", user]
    else:
        user = "root"
        env["SLURMRESTD_SECURITY"] = "disable_user_check"
    return RestDaemon([*argv, f"127.0.0.1:{port}"], env, user)


def _start_rest(spec: LabSpec, table: procs.ProcTable, say: Say) -> None:
    """The lab's slurmrestd (`rest_daemon`) on its loopback port."""
    daemon = rest_daemon(spec.slurm_conf, spec.rest_port)
    if daemon.user == "root" and not table.get("slurmrestd"):
        say(f"slurmrestd runs as root: the user {system.REST_USER} cannot read {spec.slurm_conf}")
    _start(table, "slurmrestd", daemon.argv, spec.env() | daemon.env, say)
    _wait(
        "slurmrestd",
        lambda: system.port_open("127.0.0.1", spec.rest_port),
        30,
        spec.log_dir / "slurmrestd.out",
        table,
        "slurmrestd",
    )


def _cancel_jobs(spec: LabSpec, say: Say, timeout_s: float = 60.0) -> None:
    """Cancel every job in the lab's queue and wait until none runs any more."""
    try:
        ids = slurm(spec, "squeue", "-h", "-o", "%A", timeout_s=10).split()
        if not ids:
            return
        slurm(spec, "scancel", *ids)
        say(f"cancelled the lab's jobs: {' '.join(ids)}")
    except SlurmCommandError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not slurm(spec, "squeue", "-h", "-o", "%A", timeout_s=10).split():
                return
        except SlurmCommandError:
            return
        time.sleep(0.5)


def down(spec: LabSpec, say: Say = print) -> None:
    """Stop every process the lab started; leaves configuration and state on disk."""
    system.require_root()
    table = _table(spec)
    if table.get("slurmctld"):
        _cancel_jobs(spec, say)
    for node in reversed(spec.all_nodes):
        if table.stop(_slurmd_name(node.name)):
            say(f"stopped {_slurmd_name(node.name)}")
    for name in reversed(DAEMONS):
        if table.stop(name, timeout_s=30):
            say(f"stopped {name}")
    stray = table.marked()
    if stray:
        procs.terminate(stray, timeout_s=10)
        say(f"stopped {len(stray)} leftover lab process(es): {' '.join(map(str, stray))}")
    router = left_router(spec)
    if router is not None:
        procs.terminate([router], timeout_s=10)
        say(f"stopped the lab's nginx {router}, left by a bridge that did not close it")


def left_router(spec: LabSpec) -> int | None:
    """The pid of an nginx still running on the lab's routing prefix (`<lab>/nginx`,
    `managed_nginx_prefix`), or None. A bridge started on the lab (the demo, a bench, a
    test) starts it and stops it when it closes; one killed before it closed leaves it
    holding the routing port, without the lab's marker in its environment."""
    prefix = spec.lab_dir / "nginx"
    try:
        pid = int((prefix / "run" / "nginx.pid").read_text().strip())
        # nginx writes its title over its arguments ("nginx: master process
        # /usr/sbin/nginx -p PREFIX/ ..."): the prefix is a word of the one string
        words = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").split()
    except (OSError, ValueError):
        return None
    # (a pid gone, or a zombie's, has no words: not the lab's nginx)
    return pid if bytes(prefix) in {w.rstrip(b"/") for w in words} else None


def status(spec: LabSpec) -> list[DaemonStatus]:
    table = _table(spec)
    names = [*DAEMONS, *(_slurmd_name(n.name) for n in spec.all_nodes)]
    logs = {
        "mariadb": "mariadb.log",
        "munged": "munged.log",
        "slurmdbd": "slurmdbd.log",
        "slurmctld": "slurmctld.log",
        "slurmrestd": "slurmrestd.out",  # it logs to stderr
    }
    out = []
    for name in names:
        proc = table.get(name)
        log = spec.log_dir / logs.get(name, f"{name}.log")
        if name == "mariadb" and proc is None:
            continue  # an existing MariaDB is used; the lab did not start one
        if name == "slurmrestd" and proc is None and not system.rest_available():
            continue  # not installed (`--no-install`): the lab runs without it
        out.append(DaemonStatus(name, proc.pid if proc else None, log))
    return out


def is_up(spec: LabSpec) -> bool:
    return all(d.pid is not None for d in status(spec)) and _nodes_up(spec)


def lab_processes(spec: LabSpec) -> list[int]:
    """Every live process of this lab: recorded daemons and marked descendants."""
    table = _table(spec)
    return sorted({p.pid for p in table.all()} | set(table.marked()))
