"""What the policy asks for. Each action is a value with a `key`, so the reconciler can
carry it out idempotently (a retry after a crash finds the work already done)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lend:
    """Lend `node` (of `pool`, by `lend_mode`) to Triton and place `models` on it: the
    whole node, `gpus` of its GPUs (a partial lend: the node's other GPUs go on running
    its jobs), or with `members` a gang of whole nodes serving one replica."""

    node: str
    pool: str
    lend_mode: str
    models: tuple[str, ...]
    reason: str
    gpus: int | None = None
    #: a gang's other nodes (a replica that spans nodes, `bridge.policy.gang`: one Slurm
    #: job on `node` and these, whole); () for a lend of one node
    members: tuple[str, ...] = ()
    #: the GRES type its `gpus` are of (a lend of MIG slices: `--gres=gpu:<type>:k`,
    #: `bridge.policy.typed.lend_type`); None: any GPU
    gpu_type: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the lend takes: `node` first, then a gang's `members`."""
        return (self.node, *self.members)

    @property
    def key(self) -> str:
        return f"lend:{self.node}:{','.join(self.models)}"


@dataclass(frozen=True)
class Return:
    """Take the lease's replica out of routing, drain it, and give the node back."""

    lease_id: int
    reason: str

    @property
    def key(self) -> str:
        return f"return:{self.lease_id}"


@dataclass(frozen=True)
class Place:
    """Give a serving lease's replica the models `models` in place of those it holds (model
    placement: a shift in the model mix met on a node already lent, not by another lend).
    The replica keeps serving throughout: each model it gains is loaded (Triton's explicit
    model control) and enters routing once ready; each model it drops leaves routing
    first, and is unloaded once its requests in flight have finished. The lease's models
    become `models` (recorded in its history), so its next return and the ledger's model
    split read the new set."""

    lease_id: int
    models: tuple[str, ...]
    reason: str

    @property
    def key(self) -> str:
        return f"place:{self.lease_id}:{','.join(self.models)}"


@dataclass(frozen=True)
class StartBaseline:
    """Submit the baseline Triton job of a reserved node (none runs there)."""

    node: str
    reason: str

    @property
    def key(self) -> str:
        return f"baseline:{self.node}"


Action = Lend | Return | Place | StartBaseline
