"""Renders the lab's Slurm configuration from `deploy/lab/templates/*.in`.

Pure: takes a `LabSpec` and database settings, returns file contents. `bridge.lab.lab`
writes them. Templates use `string.Template` placeholders (`$name`); a placeholder
without a value is an error, never an empty setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

from bridge.lab.spec import MIG_POOL, LabSpec
from bridge.paths import slurm_plugins_dir, templates_dir
from bridge.slurm.hostlist import compress


@dataclass(frozen=True)
class DbSettings:
    """Where slurmdbd keeps its tables (MariaDB over TCP)."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""


#: Slurm fills lower weights first: Triton lands on reserved inference nodes before it
#: takes an elastic node. The node of MIG slices is in its own partition only.
_WEIGHT = {"infer": 1, "elastic": 10, "train": 20, MIG_POOL: 30}


def _template(name: str) -> Template:
    return Template((templates_dir() / name).read_text())


#: Prolog/Epilog of the lab: seconds before `timeout` stops the sampler's hook (Python
#: start-up and NVML take well under a second; the epilog waits at most 3 s for the sampler)
HOOK_TIMEOUT_S = 20
HOOKS = ("prolog", "epilog")


def _common(spec: LabSpec) -> dict[str, str]:
    return {
        "lab": str(spec.lab_dir),
        "cluster": spec.cluster,
        "ctld_host": spec.ctld_host,
        "ctld_port": str(spec.ctld_port),
        "dbd_port": str(spec.dbd_port),
        "munge_socket": str(spec.munge_socket),
        "slurm_user": "root",
        "gpu_type": spec.gpu_type,
        "accounting_tres": accounting_tres(spec),
    }


def accounting_tres(spec: LabSpec) -> str:
    """`AccountingStorageTRES`: gres/gpu, and each GPU type, the MIG slices' included
    (sacct shows a typed `gres/gpu:<type>` only for a type listed here: what the ledger
    books a slice by)."""
    types = [spec.gpu_type, *dict.fromkeys(spec.mig_types())]
    return ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in types)])


def _gres(spec: LabSpec, pool: str) -> str:
    if pool == MIG_POOL:
        return spec.mig_gres()
    return f"gpu:{spec.gpu_type}:{spec.gpus_per_node}"


def _auth_alt(spec: LabSpec, jwt: bool) -> str:
    """The auth/jwt lines of slurm.conf and slurmdbd.conf: JWTs are an alternative to
    munge (which stays every daemon's and client's own), for slurmrestd's callers
    (`scontrol token` mints them). Without the auth/jwt plugin, a comment saying so."""
    if not jwt:
        return "# auth/jwt is not installed (slurm-wlm-jwt-plugin): no slurmrestd in this lab"
    return f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={spec.jwt_key}"


def gpu_device(spec: LabSpec, node: str, index: int) -> str:
    return str(spec.dev_dir / f"{node}-gpu{index}")


def slurm_conf(spec: LabSpec, *, jwt: bool = True) -> str:
    """slurm.conf; `jwt`: accept JWTs beside munge (slurmrestd's callers)."""
    nodes = [
        f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={spec.ctld_host} Port={n.port} "
        f"CPUs={spec.cpus_per_node} RealMemory={spec.memory_mb} "
        f"Gres={_gres(spec, n.pool)} Feature=pool_{n.pool} "
        f"Weight={_WEIGHT[n.pool]} State=UNKNOWN"
        for n in spec.all_nodes
    ]
    infer_accounts = "bridge"
    settings = {
        "train": "PriorityTier=1 PreemptMode=OFF",
        "elastic": f"Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={spec.grace_time_s}",
        "infer": f"PriorityTier=10 PreemptMode=OFF AllowAccounts={infer_accounts}",
        # the lowest tier: any job of the other partitions preempts a job here at once
        # (the bridge's staging jobs: bridge.slurm.staging)
        "scavenger": "PriorityTier=0 PreemptMode=REQUEUE GraceTime=0",
        # the node of MIG slices (`stb lab up --mig`), in no pool; hidden from users (not
        # from root or SlurmUser, so the lab, run as root, sees it)
        MIG_POOL: "Hidden=YES PriorityTier=1 PreemptMode=OFF",
    }
    parts = [
        f"PartitionName={name} Nodes={compress(n.name for n in spec.partition_nodes(name))} "
        f"{extra} MaxTime=INFINITE State=UP"
        for name, extra in settings.items()
        if spec.partition_nodes(name)
    ]
    values = _common(spec) | {
        "node_lines": "\n".join(nodes),
        "partition_lines": "\n".join(parts),
        "prolog": str(spec.hook_script("prolog")),
        "epilog": str(spec.hook_script("epilog")),
        "auth_alt": _auth_alt(spec, jwt),
    }
    return _template("slurm.conf.in").substitute(values)


def gres_conf(spec: LabSpec) -> str:
    lines = [
        f"NodeName={n.name} Name=gpu Type={spec.gpu_type} "
        f"File={spec.dev_dir}/{n.name}-gpu[0-{spec.gpus_per_node - 1}]"
        if spec.gpus_per_node > 1
        else f"NodeName={n.name} Name=gpu Type={spec.gpu_type} File={gpu_device(spec, n.name, 0)}"
        for n in spec.nodes
    ]
    # a MIG slice is a gres/gpu of its profile's type, one device each (AutoDetect=off:
    # slurmd takes the types and files as written)
    lines += [
        f"NodeName={n.name} Name=gpu Type={t} File={gpu_device(spec, n.name, i)}"
        for n in spec.mig_nodes
        for i, t in enumerate(spec.mig_types())
    ]
    return _template("gres.conf.in").substitute(gres_lines="\n".join(lines))


def slurmdbd_conf(spec: LabSpec, db: DbSettings, *, jwt: bool = True) -> str:
    """slurmdbd.conf; `jwt` as in `slurm_conf` (slurmrestd's /slurmdb/ calls carry it)."""
    values = _common(spec) | {
        "auth_alt": _auth_alt(spec, jwt),
        "db_host": db.host,
        "db_port": str(db.port),
        "db_user": db.user,
        "db_pass_line": f"StoragePass={db.password}" if db.password else "",
        "db_name": spec.db_name,
    }
    return _template("slurmdbd.conf.in").substitute(values)


#: The first Slurm release whose slurmd loads a cgroup plugin at start even under
#: proctrack/pgid and task/none, and that takes `CgroupPlugin=disabled` (24.05)
CGROUP_DISABLED_SINCE = (24, 5)


def cgroup_conf(release: tuple[int, int]) -> str | None:
    """cgroup.conf for Slurm `release` (major, minor): `CgroupPlugin=disabled` from 24.05
    on; None before (22.05 reads no cgroup.conf here and knows no `disabled`)."""
    if release < CGROUP_DISABLED_SINCE:
        return None
    return _template("cgroup.conf.in").template


def job_submit_lua() -> str:
    """The bridge's job_submit.lua, as shipped in slurm_plugins/ (the lab copies it)."""
    return (slurm_plugins_dir() / "job_submit.lua").read_text()


def hook_script(spec: LabSpec, hook: str, python: str) -> str:
    """The Prolog or Epilog wrapper: runs slurm_plugins/gpu_sampler.py with `python` (a
    Python with nvidia-ml-py), the lab's GPU spool, and a time bound."""
    if hook not in HOOKS:
        raise ValueError(f"hook must be one of {HOOKS}, got {hook!r}")
    script = str(slurm_plugins_dir() / "gpu_sampler.py")
    for value in (python, str(spec.gpu_spool), script):
        if "'" in value:
            raise ValueError(f"cannot quote {value!r} in a shell script")
    return _template("gpu-hook.sh.in").substitute(
        Hook=hook.capitalize(),
        hook=hook,
        spool=str(spec.gpu_spool),
        python=python,
        script=script,
        timeout_s=str(HOOK_TIMEOUT_S),
    )
