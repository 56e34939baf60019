"""Staging jobs: the Slurm job that copies one model version into one node's weight
cache (`deploy/slurm/stage-weights.sbatch`, which runs `python -m bridge.weights.stage`).

`staging_job` builds its `JobSpec`, `submit_staging` submits it through any backend of
the Slurm protocol. The job runs on the target node only (`--nodelist`), asks for no
GPU, in `[weights]`'s partition (else the node's pool's), account (else the bridge's:
staging is booked as serving overhead), QOS and `--nice` (the lowest priority: it starts
only where nothing else waits, and elastic/scavenger QOS lets anything preempt it), is
requeueable (a stage is idempotent: a preempted one starts over, its partial copy
removed) and bounded in time. Its name starts with `stb-staging-` and its comment holds
`stb:staging`, so `squeue`, `sacct` and the ledger tell it from other work.
Called by the daemon's staging step and by `stb weights stage --job`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bridge.config import WeightsConfig
from bridge.slurm.model import STAGING_NAME_PREFIX, STAGING_TAG, JobSpec
from bridge.slurm.protocol import SlurmProtocol


def staging_name(model: str, version: int) -> str:
    return f"{STAGING_NAME_PREFIX}-{model}-{version}"


def staging_job(
    cfg: WeightsConfig,
    *,
    node: str,
    model: str,
    version: int,
    source: str,
    account: str,
    partition: str | None = None,
    python: str = sys.executable,
    log_dir: Path | None = None,
    evict: tuple[tuple[str, int], ...] = (),
) -> JobSpec:
    """The JobSpec of one staging job (module docstring). `source` is the shared
    repository (folder or URL), `account` the bridge's (used unless `cfg.account`),
    `partition` the target node's pool's (used unless `cfg.partition`); `evict`: the
    (model, version) copies the job removes first, for room (the daemon's cache plan)."""
    if cfg.cache_root is None:
        raise ValueError("weights.cache_root is not set: there is no cache to stage into")
    part = cfg.partition or partition
    if not part:
        raise ValueError(f"no partition for the staging job on {node}: set weights.partition")
    env = {
        "STB_PYTHON": python,
        "STB_WEIGHTS_SOURCE": source,
        "STB_WEIGHTS_CACHE": str(cfg.cache_root),
        "STB_WEIGHTS_MODEL": model,
        "STB_WEIGHTS_VERSION": str(version),
        "STB_WEIGHTS_BANDWIDTH": f"{cfg.bandwidth_bytes_s:.0f}",
        "STB_WEIGHTS_BUDGET": str(cfg.budget_bytes),
    }
    if evict:  # ';' between: sbatch's --export splits on commas
        env["STB_WEIGHTS_EVICT"] = ";".join(f"{m}/{v}" for m, v in evict)
    return JobSpec(
        partition=part,
        account=cfg.account or account,
        script=str(cfg.sbatch_script.resolve()),
        name=staging_name(model, version),
        comment=STAGING_TAG,
        nodelist=(node,),
        requeue=True,
        output=str(log_dir.resolve() / "stage-%j.log") if log_dir else None,
        time_limit_min=cfg.time_limit_min,
        qos=cfg.qos,
        nice=cfg.nice,
        env=env,
    )


def submit_staging(slurm: SlurmProtocol, spec: JobSpec) -> str:
    """Submit a staging job built by `staging_job`; its job id (the protocol's errors
    pass through: a refused submit is the caller's to record)."""
    if spec.comment != STAGING_TAG or not (spec.name or "").startswith(STAGING_NAME_PREFIX):
        raise ValueError("submit_staging takes a JobSpec made by staging_job")
    return slurm.submit(spec)
