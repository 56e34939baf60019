"""The lab cluster's shape: nodes, pools, GPUs, ports and the files under the lab dir.

A `LabSpec` is pure data, validated on construction; `bridge.lab.render` turns it into
Slurm's configuration files and `bridge.lab.lab` brings it up. It is saved as
`lab.json` in the lab directory so `status` and `down` know what `up` made.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

POOLS = ("train", "elastic", "infer")
#: the partition (and ledger pool) of the node of MIG slices
MIG_POOL = "mig"
#: `stb lab up --mig`: one H100 cut into 4g + 2g + 1g (7 of its 7 compute slices, 70 of
#: its 80 GB)
MIG_PROFILES = ("4g.40gb", "2g.20gb", "1g.10gb")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_PROFILE = re.compile(r"^[1-7]g\.[1-9][0-9]{0,2}gb$")


class LabSpecError(ValueError):
    """A lab setting is invalid; the message names the setting."""


@dataclass(frozen=True)
class LabNode:
    name: str
    addr: str
    port: int
    pool: str


@dataclass(frozen=True)
class LabSpec:
    """What `stb lab up` builds. Defaults give the four-node lab of the design."""

    lab_dir: Path
    #: nodes in the training pool (partition `train`, drain-only lending)
    train_nodes: int = 2
    #: nodes in the elastic pool (partition `elastic`, requeueable jobs)
    elastic_nodes: int = 1
    #: nodes reserved for inference (partition `infer` only); hold the minimum replicas
    infer_nodes: int = 1
    #: fake GPUs per node (character devices); 4 is enough to show partial allocation
    gpus_per_node: int = 4
    #: GPU type named in gres, used by accounting rates
    gpu_type: str = "h100"
    #: MIG slices of one more node (`mig_nodes`: its own hidden partition `mig`, in no
    #: pool): one fake device per profile, typed `<gpu_type>_<profile>` in gres. () by
    #: default: no such node (`stb lab up --mig` gives `MIG_PROFILES`). Off by default
    #: because Slurm shows a hidden partition to root, and the lab runs as root: `stb
    #: init` would make it a pool, and the whole-GPU lab tests would see a fifth node
    mig_profiles: tuple[str, ...] = ()
    #: CPUs and memory (MiB) each node declares; slurmd is told to trust them
    cpus_per_node: int = 8
    memory_mb: int = 8192
    cluster: str = "stblab"
    #: Slurm ports: slurmctld, slurmdbd, and the first slurmd (node i uses base + i)
    ctld_port: int = 6817
    dbd_port: int = 6819
    slurmd_port_base: int = 6830
    #: slurmrestd's port on 127.0.0.1 (Slurm's documented default, 6820)
    rest_port: int = 6820
    #: seconds an elastic job gets between SIGTERM and requeue when preempted
    grace_time_s: int = 5
    #: team accounts registered in slurmdbd (plus `bridge`, which owns Triton jobs)
    accounts: tuple[str, ...] = ("team-vision", "team-nlp", "team-research")
    #: MariaDB database for slurmdbd; a fresh name per new lab directory, so a new lab
    #: never sees job ids of an old one (Slurm restarts numbering with its state)
    db_name: str = field(default_factory=lambda: f"stb_lab_{secrets.token_hex(4)}")
    ctld_host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])

    def __post_init__(self) -> None:
        for name in ("train_nodes", "elastic_nodes", "infer_nodes"):
            if getattr(self, name) < 0:
                raise LabSpecError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.infer_nodes < 1:
            raise LabSpecError("infer_nodes must be >= 1: Triton's reserved node")
        if not 1 <= self.node_count <= 250:
            raise LabSpecError(f"the lab holds 1 to 250 nodes, got {self.node_count}")
        if not 1 <= self.gpus_per_node <= 16:
            raise LabSpecError(f"gpus_per_node must be 1..16, got {self.gpus_per_node}")
        for profile in self.mig_profiles:
            if not _PROFILE.match(profile):
                raise LabSpecError(
                    f"mig_profiles: {profile!r} is not a MIG profile such as 1g.10gb"
                )
        if len(self.mig_profiles) > 16:
            raise LabSpecError(f"mig_profiles: at most 16 slices, got {len(self.mig_profiles)}")
        for name in ("gpu_type", "cluster", "db_name"):
            if not _NAME.match(getattr(self, name)):
                raise LabSpecError(
                    f"{name} must be lower-case letters, digits, '-' or '_', "
                    f"got {getattr(self, name)!r}"
                )
        for acct in self.accounts:
            if not _NAME.match(acct):
                raise LabSpecError(f"account name {acct!r} is not a valid Slurm account")
        if len(str(self.lab_dir / "run" / "munge.socket")) > 100:
            raise LabSpecError(
                f"lab_dir {self.lab_dir} is too long for a Unix socket path; "
                "choose a shorter one (--dir or STB_LAB_DIR)"
            )
        if self.grace_time_s < 0:
            raise LabSpecError(f"grace_time_s must be >= 0, got {self.grace_time_s}")

    @property
    def node_count(self) -> int:
        return self.train_nodes + self.elastic_nodes + self.infer_nodes

    @property
    def nodes(self) -> list[LabNode]:
        """Nodes n1..nN: training first, then elastic, then reserved inference."""
        pools = (
            ["train"] * self.train_nodes
            + ["elastic"] * self.elastic_nodes
            + ["infer"] * self.infer_nodes
        )
        return [
            LabNode(f"n{i}", f"127.0.1.{i}", self.slurmd_port_base + i, pool)
            for i, pool in enumerate(pools, start=1)
        ]

    @property
    def mig_nodes(self) -> list[LabNode]:
        """The node of MIG slices (after `nodes`; none without `mig_profiles`): pool `mig`,
        which no configured pool names."""
        if not self.mig_profiles:
            return []
        i = self.node_count + 1
        return [LabNode(f"n{i}", f"127.0.1.{i}", self.slurmd_port_base + i, MIG_POOL)]

    @property
    def all_nodes(self) -> list[LabNode]:
        """Every node Slurm runs: `nodes`, then `mig_nodes`."""
        return self.nodes + self.mig_nodes

    def mig_types(self) -> list[str]:
        """The MIG node's gres types, one per slice (`h100_1g.10gb`)."""
        return [f"{self.gpu_type}_{p}" for p in self.mig_profiles]

    def mig_gres(self) -> str:
        """The MIG node's `Gres=`: each slice type with its count, in the order given."""
        types = self.mig_types()
        return ",".join(f"gpu:{t}:{types.count(t)}" for t in dict.fromkeys(types))

    def pool_nodes(self, pool: str) -> list[LabNode]:
        return [n for n in self.nodes if n.pool == pool]

    def partition_nodes(self, partition: str) -> list[LabNode]:
        """`infer` spans the reserved nodes and the elastic nodes it may preempt;
        `scavenger` (work that yields to any other: staging) the elastic nodes."""
        if partition == "infer":
            return self.pool_nodes("infer") + self.pool_nodes("elastic")
        if partition == "scavenger":
            return self.pool_nodes("elastic")
        if partition == MIG_POOL:
            return self.mig_nodes
        return self.pool_nodes(partition)

    # Files under the lab directory: the one place each path is named.
    @property
    def etc(self) -> Path:
        return self.lab_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def run_dir(self) -> Path:
        return self.lab_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.lab_dir / "log"

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.etc / "munge.key"

    @property
    def dev_dir(self) -> Path:
        return self.lab_dir / "dev"

    @property
    def triton_dir(self) -> Path:
        return self.lab_dir / "triton"

    @property
    def api_dir(self) -> Path:
        """The daemon API's tokens (`bridge.lab.tokens`)."""
        return self.lab_dir / "api"

    @property
    def triton_key_file(self) -> Path:
        return self.triton_dir / "api.key"

    @property
    def job_submit_lua(self) -> Path:
        """Slurm reads job_submit.lua from the directory of slurm.conf."""
        return self.etc / "job_submit.lua"

    def hook_script(self, hook: str) -> Path:
        """The Prolog or Epilog wrapper slurmd runs (hook: "prolog" or "epilog")."""
        return self.etc / f"stb-{hook}"

    @property
    def gpu_spool(self) -> Path:
        """Where the GPU sampler's Prolog/Epilog keep samples, records and logs."""
        return self.lab_dir / "spool" / "gpu-usage"

    @property
    def mysql_dir(self) -> Path:
        return self.lab_dir / "mysql"

    @property
    def jwt_key(self) -> Path:
        """The HS256 key slurmctld and slurmdbd sign and check JWTs with
        (`AuthAltParameters=jwt_key=`), 0600 and owned by SlurmUser (root in the lab)."""
        return self.etc / "jwt_hs256.key"

    @property
    def rest_url(self) -> str:
        """Where the lab's slurmrestd listens (loopback only)."""
        return f"http://127.0.0.1:{self.rest_port}"

    def rest_env(self) -> dict[str, str]:
        """The settings of the slurmrestd backend (`STB_SLURM_BACKEND=rest`) for this lab:
        its URL and the user its tokens are for (the lab's jobs run as root); the backend
        mints tokens with `scontrol token`, which needs `SLURM_CONF` (in `env()`)."""
        return self.env() | {"STB_SLURM_REST_URL": self.rest_url, "STB_SLURM_REST_USER": "root"}

    def env(self) -> dict[str, str]:
        """Environment a Slurm client needs to talk to this lab."""
        return {"SLURM_CONF": str(self.slurm_conf), "STB_LAB_DIR": str(self.lab_dir)}

    def save(self) -> None:
        data = asdict(self)
        data["lab_dir"] = str(self.lab_dir)
        data["accounts"] = list(self.accounts)
        data["mig_profiles"] = list(self.mig_profiles)
        (self.lab_dir / "lab.json").write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, lab_dir: Path) -> LabSpec | None:
        path = lab_dir / "lab.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["lab_dir"] = Path(data["lab_dir"])
        data["accounts"] = tuple(data["accounts"])
        if "mig_profiles" in data:
            data["mig_profiles"] = tuple(data["mig_profiles"])
        return cls(**data)
