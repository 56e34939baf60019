"""What the bridge needs from Slurm, as one narrow interface.

Contract, for every backend:
- Each call is one batched query or one command against the controller; nothing is
  cached between calls, so every observation is fresh (external truth wins).
- Reads return immutable records (`bridge.slurm.model`), times in UTC.
- Writes are idempotent where Slurm allows: draining a drained node, resuming an idle
  node, cancelling a finished job or deleting a missing reservation is not an error.
  `submit` is not idempotent: callers key submissions (job name / comment) and look for
  an existing job first.
- Failures are typed: `ControllerUnreachable` (transient: retry on a later tick),
  `CommandRejected` (permanent: Slurm refused, its words quoted), `UnparseableOutput`
  (the raw text quoted). Nothing else escapes.
- Drain reasons and reservation names the bridge sets begin with `stb:` / `stb-`, so the
  reconciler can tell its own fences from an administrator's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, Unpack

from bridge.slurm.model import (
    AccountingRecord,
    Job,
    JobFilter,
    JobSpec,
    Node,
    Partition,
    Reservation,
    ReservationSpec,
    SlurmEvent,
)


class SlurmProtocol(Protocol):
    def version(self) -> str:
        """Slurm's release, e.g. "22.05.8"."""
        ...

    def cluster_name(self) -> str:
        """The cluster's name (slurm.conf's ClusterName): the name slurmdbd keys its jobs,
        events and rollups by."""
        ...

    def nodes(self) -> list[Node]:
        """Every node: address, partitions, state and flags, reason, GPU gres."""
        ...

    def partitions(self) -> list[Partition]: ...

    def jobs(self, **filters: Unpack[JobFilter]) -> list[Job]:
        """Jobs in the controller's queue (finished ones until MinJobAge), filtered by
        keyword (`JobFilter`): `tag` is a comment tag such as "stb:triton"; `states` are
        Slurm state names."""
        ...

    def submit(self, spec: JobSpec) -> str:
        """Submit a batch job; returns its job id."""
        ...

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        """Cancel a job, or only send it `signal` (e.g. "TERM") when given."""
        ...

    def requeue(self, job_id: str) -> None: ...

    def drain(self, node: str, reason: str) -> None:
        """Stop new work on a node; running jobs go on. The reason gets the `stb:` prefix."""
        ...

    def resume(self, node: str) -> None:
        """Undo a drain."""
        ...

    def reservations(self) -> list[Reservation]: ...

    def create_reservation(self, spec: ReservationSpec) -> None:
        """Reserve the spec's nodes from now for its duration_s seconds for its users."""
        ...

    def delete_reservation(self, name: str) -> None: ...

    def accounting(self, since: datetime, until: datetime) -> list[AccountingRecord]:
        """Every job allocation that ran in [since, until), one record per run (requeued
        jobs have several), from slurmdbd."""
        ...

    def events(self, since: datetime, until: datetime) -> list[SlurmEvent]:
        """The events slurmdbd recorded that overlap [since, until): the cluster's
        registered TRES and node list over time, and each node's down, drain and fail
        stretches (the ledger's capacity and down time, as sreport counts them)."""
        ...
