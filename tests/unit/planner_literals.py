"""Literal Slurm jobs for the planner's and the rollouts' tests (not a test module)."""

from __future__ import annotations

from bridge.daemon.planner import LeaseRecord
from bridge.slurm.model import BASELINE_TAG, TRITON_TAG, Job, lease_tag


def job(
    job_id: str = "100",
    *,
    of: LeaseRecord | None = None,
    on: str = "n3",
    state: str = "RUNNING",
    reason: str = "None",
    comment: str | None = None,
) -> Job:
    """A Triton job; `of` tags it with that lease's ref (else a baseline job)."""
    if comment is None:
        tag = lease_tag((of.id, int(of.created_at))) if of is not None else BASELINE_TAG
        comment = f"{TRITON_TAG},{tag}"
    running = state == "RUNNING"
    return Job(
        job_id,
        "stb-triton",
        "infer",
        "bridge",
        "root",
        state,
        reason,
        (on,) if running else (),
        comment,
        4,
        0,
        None,
        None,
        requested_nodes=(on,),
    )
