"""What a lease's sync asks for: the commands an actuator carries out through an adapter
(submit a Triton job, cancel it, unload its models, fence or unfence its node, put its
replica in or out of routing, ...), the `Move` a lease's state makes once they have all
succeeded, and the `Step` that holds both.

Pure values. Made by the per-state sync (`bridge.policy.leasesync`) and the planner's
orphan pass (`bridge.daemon.planner`); carried out by the daemon's actuator
(`bridge.daemon.actuator`, through Slurm, Triton and routing), the advisory's shadow book
(`bridge.advise.shadow`, on its modelled timing) and the simulator (`bridge.sim.engine`,
on its simulated fleet).
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.lifecycle import LeaseState


@dataclass(frozen=True)
class Fence:
    """Create the drain-mode reservation that holds `node` (and a gang's `members`) for
    the lease."""

    step = "fence"
    reservation: str
    node: str
    duration_s: int
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Submit:
    """Submit the lease's Triton job on its node; its job id goes into the move."""

    step = "submit"
    node: str
    models: tuple[str, ...]
    #: how the job's tag names the lease (`LeaseView.ref`, `bridge.slurm.model.lease_tag`)
    ref: tuple[int, int]
    pool: str
    reservation: str | None
    #: GPUs of the node the job asks for (`--gres=gpu:k`, the node shared with its other
    #: jobs); None: the whole node (`--exclusive`, every GPU)
    gpus: int | None = None
    #: a gang's other nodes: the job asks for `-N n` on `node` and these, whole
    members: tuple[str, ...] = ()
    #: the job asks for the highest priority Slurm lets an administrator set
    #: (`--priority=TOP`): a drain-mode lend of some of a node's GPUs, pending on its
    #: node until jobs there end, is then the first job Slurm gives those GPUs to
    top: bool = False
    #: the GRES type its `gpus` are of (`--gres=gpu:<type>:k`: a lend of MIG slices,
    #: `LeaseView.gpu_type`); None: any GPU
    gpu_type: str | None = None
    #: the port slot its server listens on (`LeaseView.slot`, `bridge.triton.ports`)
    slot: int = 0


@dataclass(frozen=True)
class Requeue:
    """Requeue the jobs running on a preempt-mode lend's node (a partial lend's: those
    `bridge.policy.victims.choose_victims` picks to free its GPUs), right after its Triton job
    is submitted there: Slurm's own requeue (the job gets SIGTERM and KillWait to
    checkpoint, then runs again), without waiting for slurmctld's periodic preemption
    pass (18-33 s on the lab, 3.8 s this way)."""

    step = "requeue"
    node: str
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class SubmitBaseline:
    """Submit a reserved node's baseline Triton job (no lease)."""

    step = "baseline"
    node: str


@dataclass(frozen=True)
class Cancel:
    step = "cancel"
    job_id: str


@dataclass(frozen=True)
class Unload:
    """Unload the lease's models from its server, then forget the bridge's connection."""

    step = "unload"
    address: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class Unfence:
    """Delete a bridge reservation."""

    step = "unfence"
    reservation: str


@dataclass(frozen=True)
class Resume:
    """Resume a node the bridge drained (an `stb:` drain reason) that no lease holds."""

    step = "unfence"
    node: str


@dataclass(frozen=True)
class RouteIn:
    """Publish routing with the lease's replica in it (before it counts as serving)."""

    step = "route"
    lease_id: int


@dataclass(frozen=True)
class RouteOut:
    """Publish routing without the lease's replica (before it drains)."""

    step = "route"
    lease_id: int


@dataclass(frozen=True)
class Adopt:
    """Record a lease for a tagged Triton job that no lease holds (a lend whose record was
    lost), as submitted with that job."""

    step = "adopt"
    job_id: str
    node: str
    pool: str
    lend_mode: str
    #: the job's other nodes (a gang's)
    members: tuple[str, ...] = ()
    #: the GPUs of its node the job holds, where fewer than the node's (a partial lend's
    #: job); None: the whole node
    gpus: int | None = None


Command = (
    Fence
    | Submit
    | Requeue
    | SubmitBaseline
    | Cancel
    | Unload
    | Unfence
    | Resume
    | RouteIn
    | RouteOut
    | Adopt
)


@dataclass(frozen=True)
class Move:
    """A state change of a lease: `old` is the state the plan was made from (the store
    refuses the move if another writer got there first)."""

    lease_id: int
    old: LeaseState
    new: LeaseState
    reason: str
    slurm_job_id: str | None = None


@dataclass(frozen=True)
class Step:
    """Commands, in order, then the move they lead to (None: no move yet). `lease_id` is
    None for steps no lease holds (orphans, baselines). `note` is a line for the tick's
    events when the step carries no move."""

    lease_id: int | None
    commands: tuple[Command, ...] = ()
    move: Move | None = None
    note: str = ""
    #: a failure of this step fails the lease (False for routing steps, whose failure
    #: says nothing about the lease)
    fails_lease: bool = True
