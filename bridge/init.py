"""`stb init` and `stb config check --live`: a starting configuration from the cluster as
Slurm describes it, and the configuration checked against the live cluster.

Pure: partitions and nodes in (`bridge.slurm.model`, from `scontrol show partition/node`
through any backend or recorded output), text and problems out. Called by
`bridge.config_cli` (the two commands) and tested on recorded lab output.

How `propose` reads the cluster (each choice is written into the TOML as a comment):

- Only partitions with GPU nodes become pools; a partition without GPUs is skipped, and
  said. So is a partition below others on all its nodes (each of its GPU nodes is in
  another lendable partition of a higher PriorityTier): work there yields to theirs, a
  scavenger partition, the one the weight cache's staging jobs belong in (written as a
  commented `[weights] partition`); its nodes are pooled by the partition above.
- The reserved inference pool: the partition whose `AllowAccounts` is the bridge's account
  alone (the one `job_submit.lua` and the design keep for Triton jobs); failing that, a
  partition whose name starts with "infer". Its partition is also where the Triton jobs
  go (`[triton] partition`). None found: an `InitError` saying how to make one.
- Every other GPU partition: `PreemptMode=REQUEUE` -> lend mode "preempt" (its jobs are
  requeueable: the bridge requeues them and submits Triton on the node), anything else
  (OFF, SUSPEND, CANCEL, GANG) -> "drain" (no job is ever killed: the node is fenced and
  lent once free), the gentle choice when the partition does not say its jobs may go.
- cost_rank: the reserved pool 0, preempt pools 1, drain pools 2 (the policy lends the
  lowest rank first: elastic work before training).
- Pool names: training, elastic and inference when there is one partition of each kind
  (drain, preempt, reserved), else the partitions' own names.
- GPU types (from each node's gres) are listed for `stb rates add`.
- Models are not written: the daemon reads each model's SLO and replica bounds from its
  `config.pbtxt` in the model repository (`stb.slo_p99_ms`, ...); the models found are
  listed in a comment, and a `[models.NAME]` table overrides them for this site.

`live_problems` says what would stop the configuration working on this cluster: a pool's
partition missing or without GPU nodes; the Triton partition missing or closed to the
bridge's account; a preempt pool's node outside the Triton partition (a preempt lend
submits the Triton job there with `-w NODE`); a drain pool's partition closed to the
bridge's account (a drain lend runs the Triton job there, in the lease's reservation); a
preempt pool whose partition does not requeue; a drain pool whose jobs the Triton
partition would preempt (its PreemptMode is not OFF and the Triton partition's
PriorityTier is higher: Slurm itself would requeue training jobs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from bridge.config import BridgeConfig
from bridge.slurm.model import Node, Partition


class InitError(ValueError):
    """The cluster gives no configuration to start from; the message says why and what
    to do."""


#: lend mode -> cost rank (`PoolConfig.cost_rank`: lower is lent first)
COST_RANK = {"reserved": 0, "preempt": 1, "drain": 2}
#: a pool's name when its partition is the only one of its lend mode
ROLE_NAME = {"reserved": "inference", "preempt": "elastic", "drain": "training"}


@dataclass(frozen=True)
class ProposedPool:
    name: str
    partition: str
    lend_mode: str
    cost_rank: int
    nodes: tuple[str, ...]
    gpus: int
    #: why this lend mode, as the TOML's comment says it
    why: str


@dataclass
class Proposal:
    pools: list[ProposedPool]
    #: the partition and account of the Triton jobs
    triton_partition: str
    account: str
    gpu_types: dict[str, int]
    #: model -> where its SLO comes from ("config.pbtxt stb.slo_p99_ms = 100", ...)
    models: dict[str, str] = field(default_factory=dict)
    #: what was left out, and why
    notes: list[str] = field(default_factory=list)
    #: a partition below others on all its nodes: staging's (`[weights] partition`)
    scavenger: str | None = None


def _gpu_nodes(partition: Partition, nodes: Mapping[str, Node]) -> list[Node]:
    return [nodes[n] for n in partition.nodes if n in nodes and nodes[n].gpus > 0]


def _reserved(partitions: Sequence[Partition], account: str) -> Partition | None:
    own = [p for p in partitions if p.allow_accounts == (account,)]
    if len(own) == 1:
        return own[0]
    named = [p for p in partitions if p.name.startswith("infer")]
    return named[0] if len(named) == 1 and not own else None


def propose(
    partitions: Sequence[Partition],
    nodes: Sequence[Node],
    *,
    account: str = "bridge",
    models: Mapping[str, str] | None = None,
) -> Proposal:
    """The starting configuration's choices (see the module docstring)."""
    by_name = {n.name: n for n in nodes}
    gpu_partitions = []
    notes = []
    for p in partitions:
        if _gpu_nodes(p, by_name):
            gpu_partitions.append(p)
        else:
            notes.append(f"partition {p.name}: no node with GPUs, not a pool")
    if not gpu_partitions:
        raise InitError("no partition has a node with GPUs (gres/gpu): nothing to pool")
    reserved = _reserved(gpu_partitions, account)
    if reserved is None:
        raise InitError(
            f"no partition is kept for the bridge: make one whose AllowAccounts is "
            f"{account!r} alone, with the reserved inference nodes and the lendable ones "
            "and a PriorityTier above theirs (deploy/lab/templates/slurm.conf.in shows one)"
        )
    scavengers = _scavengers(gpu_partitions, reserved, by_name)
    for low, above in scavengers.items():
        notes.append(
            f"partition {low}: below {', '.join(above)} on all its nodes (a lower PriorityTier): "
            "work there yields to theirs, not a pool (the weight cache's staging jobs may "
            "run there: [weights] partition)"
        )
    gpu_partitions = [p for p in gpu_partitions if p.name not in scavengers]
    modes: dict[str, tuple[str, str]] = {}
    for p in gpu_partitions:
        if p is reserved:
            modes[p.name] = (
                "reserved",
                f"AllowAccounts={account} only: the bridge's own partition, its Triton jobs "
                "run here",
            )
        elif p.preempt_mode.upper().startswith("REQUEUE"):
            modes[p.name] = (
                "preempt",
                "PreemptMode=REQUEUE: its jobs are requeueable, so the bridge may requeue them "
                "and lend the node at once",
            )
        else:
            modes[p.name] = (
                "drain",
                f"PreemptMode={p.preempt_mode}: its jobs do not say they may be requeued, so "
                "the node is fenced and lent once its jobs end (no job killed)",
            )
    count = {m: sum(1 for mode, _ in modes.values() if mode == m) for m in COST_RANK}
    pools = []
    for p in gpu_partitions:
        mode, why = modes[p.name]
        name = ROLE_NAME[mode] if count[mode] == 1 else p.name
        gpu_nodes = _gpu_nodes(p, by_name)
        pool = ProposedPool(
            name=name,
            partition=p.name,
            lend_mode=mode,
            cost_rank=COST_RANK[mode],
            nodes=tuple(n.name for n in gpu_nodes),
            gpus=sum(n.gpus for n in gpu_nodes),
            why=why,
        )
        pools.append(pool)
    lendable = {n for pool in pools if pool.lend_mode != "reserved" for n in pool.nodes}
    for i, pool in enumerate(pools):
        shared = [n for n in pool.nodes if n in lendable]
        if pool.lend_mode == "reserved" and shared:
            own = [n for n in pool.nodes if n not in lendable]
            pools[i] = replace(
                pool,
                why=f"{pool.why}; {','.join(shared)} also in a lendable pool (lent there), "
                f"{','.join(own) or 'none'} reserved for the baseline replicas",
            )
    names = [pool.name for pool in pools]
    if len(set(names)) != len(names):  # a role name equal to another partition's name
        pools = [replace(pool, name=pool.partition) for pool in pools]
    gpu_types: dict[str, int] = {}
    for n in nodes:
        if n.gpus > 0:
            gpu_types[n.gpu_type or "gpu"] = gpu_types.get(n.gpu_type or "gpu", 0) + n.gpus
    return Proposal(
        pools,
        reserved.name,
        account,
        gpu_types,
        dict(models or {}),
        notes,
        scavenger=next(iter(scavengers), None),
    )


def _scavengers(
    partitions: Sequence[Partition], reserved: Partition, nodes: Mapping[str, Node]
) -> dict[str, list[str]]:
    """Per partition below others on all its GPU nodes, the partitions above it there:
    each of its GPU nodes is in another non-reserved partition of a higher PriorityTier."""
    out: dict[str, list[str]] = {}
    others = [p for p in partitions if p is not reserved]
    for p in others:
        above: list[str] = []
        for n in _gpu_nodes(p, nodes):
            over = [
                q.name
                for q in others
                if q is not p and q.priority_tier > p.priority_tier and n.name in q.nodes
            ]
            if not over:
                break
            above += [q for q in over if q not in above]
        else:
            out[p.name] = above
    return out


def render(proposal: Proposal, *, source: str) -> str:
    """The proposal as a bridge TOML, each choice explained in a comment."""
    lines = [
        f"# A starting configuration for the bridge, written by `stb init` from {source}.",
        "# Every field and its default: bridge/config.py. Check it against the cluster with",
        "#   stb config check THIS_FILE --live",
        "",
    ]
    for pool in proposal.pools:
        lines += [
            f"# {pool.partition}: {len(pool.nodes)} GPU node(s), {pool.gpus} GPUs. {pool.why}.",
            f"[pools.{pool.name}]",
            f'partition = "{pool.partition}"',
            f'lend_mode = "{pool.lend_mode}"',
            f"cost_rank = {pool.cost_rank}",
            "",
        ]
    lines += [
        f"# Triton jobs go to the bridge's own partition, as account {proposal.account}.",
        "[triton]",
        f'partition = "{proposal.triton_partition}"',
        f'account = "{proposal.account}"',
        "",
    ]
    types = ", ".join(f"{t} ({n} GPUs)" for t, n in sorted(proposal.gpu_types.items()))
    lines.append(f"# GPU types (price them with `stb rates add`): {types}")
    if proposal.models:
        lines.append(
            "# Models in the repository; the daemon reads each one's SLO and replica bounds "
            "from its config.pbtxt"
        )
        lines.append("# (a [models.NAME] table here overrides them for this site):")
        lines += [f"#   {m}: {where}" for m, where in sorted(proposal.models.items())]
    else:
        lines.append("# No model in the repository yet: publish with `stb models publish`.")
    if proposal.scavenger is not None:
        lines += [
            "# The node-local weight cache (off until cache_root is set): its staging jobs "
            "yield to any other",
            "# work in the scavenger partition.",
            "# [weights]",
            '# cache_root = "/local/stb-weights"',
            f'# partition = "{proposal.scavenger}"',
        ]
    lines += [f"# Left out: {note}" for note in proposal.notes]
    return "\n".join(lines) + "\n"


def live_problems(
    config: BridgeConfig, partitions: Sequence[Partition], nodes: Sequence[Node]
) -> list[str]:
    """What would stop `config` working on this cluster ([] when nothing)."""
    parts = {p.name: p for p in partitions}
    by_name = {n.name: n for n in nodes}
    out = []
    triton = parts.get(config.triton.partition)
    account = config.triton.account
    if triton is None:
        out.append(f"[triton] partition {config.triton.partition!r} does not exist")
    elif triton.allow_accounts is not None and account not in triton.allow_accounts:
        allowed = ",".join(triton.allow_accounts)
        out.append(
            f"[triton] partition {triton.name} allows accounts {allowed}, not the bridge's "
            f"{account!r}: its Triton jobs would be refused"
        )
    for name, pool in config.pools.items():
        p = parts.get(pool.partition)
        if p is None:
            out.append(f"pools.{name}: partition {pool.partition!r} does not exist")
            continue
        gpu_nodes = _gpu_nodes(p, by_name)
        if not gpu_nodes:
            out.append(f"pools.{name}: partition {p.name} has no node with GPUs")
        if pool.lend_mode == "reserved" or triton is None:
            continue
        outside = [n.name for n in gpu_nodes if n.name not in triton.nodes]
        if pool.lend_mode == "preempt" and outside:
            out.append(
                f"pools.{name}: node(s) {','.join(outside)} are not in the Triton partition "
                f"{triton.name}: a preempt lend submits its Triton job there with -w NODE"
            )
        if (
            pool.lend_mode == "drain"
            and p.allow_accounts is not None
            and account not in p.allow_accounts
        ):
            out.append(
                f"pools.{name}: partition {p.name} allows accounts "
                f"{','.join(p.allow_accounts)}, not the bridge's {account!r}: a drain lend "
                "runs its Triton job there, in the lease's reservation"
            )
        mode = p.preempt_mode.upper()
        if pool.lend_mode == "preempt" and not mode.startswith("REQUEUE"):
            out.append(
                f"pools.{name}: lend mode preempt, but partition {p.name} has "
                f"PreemptMode={p.preempt_mode}: its jobs are not requeueable (use drain, or "
                "PreemptMode=REQUEUE)"
            )
        if pool.lend_mode == "drain" and mode != "OFF" and triton.priority_tier > p.priority_tier:
            out.append(
                f"pools.{name}: lend mode drain, but partition {p.name} has "
                f"PreemptMode={p.preempt_mode} under the Triton partition's higher "
                f"PriorityTier ({triton.priority_tier} > {p.priority_tier}): Slurm would "
                "preempt its jobs for a Triton job (set PreemptMode=OFF there)"
            )
    return out


__all__ = ["InitError", "Proposal", "ProposedPool", "live_problems", "propose", "render"]
