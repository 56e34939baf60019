"""The fleet's shape from Slurm's own listing (`scontrol show node -o`, `scontrol show
partition -o`, parsed by the Slurm adapter's parsers): which nodes, how many GPUs each,
which of the bridge's pools each is in (the daemon's rule,
`bridge.daemon.observation.pool_of`). Called by `stb simulate --fleet-nodes`."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from bridge.config import BridgeConfig, pool_of
from bridge.sim.inputs.common import InputError, read_text
from bridge.slurm.errors import SlurmError
from bridge.slurm.scontrol import parse_nodes, parse_partitions

T = TypeVar("T")


@dataclass(frozen=True)
class FleetNode:
    name: str
    gpus: int
    partitions: tuple[str, ...]
    #: the bridge's pool it is in (`pool_of`: a lendable pool before the reserved one)
    pool: str
    #: Slurm's base state when recorded (idle, mixed, down, ...) and its DRAIN flag
    state: str
    drained: bool


@dataclass(frozen=True)
class FleetShape:
    """The nodes of a site's fleet the bridge's pools hold, and what the report says."""

    nodes: tuple[FleetNode, ...]
    about: Mapping[str, object] = field(default_factory=dict)

    def gpu_counts(self) -> Counter[int]:
        """Nodes by their GPU count."""
        return Counter(n.gpus for n in self.nodes)

    @property
    def gpus_per_node(self) -> int:
        """The one GPU count of every node; `InputError` for a mixed fleet (the simulator's
        nodes all have one count)."""
        counts = self.gpu_counts()
        if len(counts) != 1:
            mix = ", ".join(
                f"{n} node{'s' if n != 1 else ''} of {g} GPUs" for g, n in sorted(counts.items())
            )
            raise InputError(
                f"the fleet mixes GPU counts ({mix}); the simulator's nodes have one: "
                "give --gpus-per-node to simulate them all with that many"
            )
        return next(iter(counts))

    def pools(self) -> dict[str, int]:
        return dict(sorted(Counter(n.pool for n in self.nodes).items()))


def _parsed(parse: Callable[[str], list[T]], text: str, source: str, none: str) -> list[T]:
    """`parse(text)`, the Slurm parser's error and an empty answer (`none` says why) as
    `InputError`s naming `source`."""
    try:
        out = parse(text)
    except SlurmError as exc:
        raise InputError(f"{source}: {exc}") from None
    if not out:
        raise InputError(f"{source}: {none}")
    return out


def fleet_from_scontrol(
    nodes_text: str,
    partitions_text: str | None,
    config: BridgeConfig,
    *,
    nodes_source: str = "scontrol show node",
    partitions_source: str = "scontrol show partition",
) -> FleetShape:
    """The fleet as Slurm lists it (`scontrol show node -o`, optionally `scontrol show
    partition -o`, parsed by the Slurm adapter's parsers), each node in the bridge's pool
    for its partitions (`config.pools`, the daemon's rule). The partitions' `Nodes=` say
    which node is in which partition where given, else each node's `Partitions=`. Nodes in
    no pool or with no GPU are left out and counted; a pool whose partition Slurm does not
    have, a partition naming a node the node list lacks, or no node in any pool is refused."""
    nodes = _parsed(
        parse_nodes, nodes_text, nodes_source, "no node (is it `scontrol show node -o` output?)"
    )
    names = Counter(n.name for n in nodes)
    twice = [n for n, k in names.items() if k > 1]
    if twice:
        raise InputError(f"{nodes_source}: node {twice[0]} is listed {names[twice[0]]} times")
    known = {p for n in nodes for p in n.partitions}
    if partitions_text is not None:
        parts = _parsed(parse_partitions, partitions_text, partitions_source, "no partition")
        member: dict[str, list[str]] = defaultdict(list)
        for p in parts:
            for name in p.nodes:
                if name not in names:
                    raise InputError(
                        f"{partitions_source}: partition {p.name} lists node {name}, which "
                        f"{nodes_source} does not have"
                    )
                member[name].append(p.name)
        nodes = [replace(n, partitions=tuple(member.get(n.name, ()))) for n in nodes]
        known = {p.name for p in parts}
    for pool_name, pool in config.pools.items():
        if pool.partition not in known:
            raise InputError(
                f"pool {pool_name!r}: partition {pool.partition!r} is not in "
                f"{partitions_source if partitions_text is not None else nodes_source} (it "
                f"has {', '.join(sorted(known)) or 'none'}): give --config with the site's pools"
            )
    kept: list[FleetNode] = []
    left: Counter[str] = Counter()
    for n in nodes:
        in_pool = pool_of(n, config)
        if in_pool is None:
            left[f"in no pool (partitions {','.join(n.partitions) or 'none'})"] += 1
        elif n.gpus <= 0:
            left["no GPU"] += 1
        else:
            kept.append(FleetNode(n.name, n.gpus, n.partitions, in_pool, n.state, n.drained))
    if not kept:
        raise InputError(f"{nodes_source}: no node with GPUs is in a pool of the configuration")
    shape = FleetShape(tuple(kept))
    sources = [nodes_source] + ([partitions_source] if partitions_text is not None else [])
    about: dict[str, object] = {
        "source": sources,
        "nodes": len(kept),
        "gpus": sum(n.gpus for n in kept),
        "nodes_by_gpus": {str(g): k for g, k in sorted(shape.gpu_counts().items())},
        "pools": shape.pools(),
        "partitions": dict(sorted(Counter(p for n in kept for p in n.partitions).items())),
        "states": dict(sorted(Counter(_state(n) for n in kept).items())),
        "left_out": dict(sorted(left.items())),
    }
    return replace(shape, about=about)


def _state(node: FleetNode) -> str:
    return f"{node.state}+drain" if node.drained else node.state


def read_fleet(nodes_path: Path, partitions_path: Path | None, config: BridgeConfig) -> FleetShape:
    """`fleet_from_scontrol` of recorded outputs (files), named by their file names."""
    parts = read_text(partitions_path, "partitions file") if partitions_path else None
    return fleet_from_scontrol(
        read_text(nodes_path, "nodes file"),
        parts,
        config,
        nodes_source=f"nodes file {nodes_path.name}",
        partitions_source=f"partitions file {partitions_path.name}" if partitions_path else "",
    )
