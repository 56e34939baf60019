"""The advisory window replayed through the simulator: what lending would have done to
the models' SLOs and to the batch queues, beside no lending, on the same fleet, jobs and
load.

Called by `stb advise report` (`bridge.advise.cli`), which reads its inputs: the
advisory's samples (`bridge.advise.summary.arrivals`: the load), Slurm's nodes now (the
fleet, each in its configured pool) and sacct's records of the window (the batch jobs).
Two set-ups of `bridge.sim.engine.Engine`, as `bridge.sim.labcheck` builds its twin of
the lab: `lending`, the bridge's configuration as it is, and `no lending`, the same with
`max_lent_nodes = 0` (the simulator's separate set-up: nothing is lent, on the same
nodes). Both run the real policy on the simulator's timing (`Timing()`, the bench's
medians).

What the replay cannot know, and says in its notes: the arrivals are what Triton
answered plus its queue's growth (requests refused upstream, or that nginx held, are not
in them); a model without a measured compute time is given 1 ms a request; the fleet is
Slurm's nodes now, not as they were over the window; batch jobs come from sacct, so a job
still pending at the window's end (its run time unknown) is left out and one still
running counts its run so far.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from bridge.advise.summary import HOLD_S, Arrivals, Summary
from bridge.config import BridgeConfig, ModelConfig, pool_of
from bridge.sim.engine import Engine, Setup, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.inputs import jobs_from_records, partition_kinds
from bridge.sim.result import PolicyResult
from bridge.sim.workload import ArrivalSeries, JobKind, SimJob
from bridge.slurm.model import AccountingRecord, Node
from bridge.triton.catalog import site_models

#: the kind of batch work a pool's nodes run, by its lend mode (the simulator names a
#: node's batch partition after the jobs it takes; a reserved pool takes none)
KIND_OF_MODE: dict[str, JobKind] = {"drain": "training", "preempt": "elastic"}
#: a model's service time when the advisory never measured its compute time
DEFAULT_SERVICE_MS = 1.0


@dataclass
class Replay:
    start: datetime
    end: datetime
    nodes: dict[str, int]
    jobs: int
    service_ms: dict[str, float]
    #: the set-ups' results: "no lending" and "lending"
    results: dict[str, PolicyResult]
    notes: list[str] = field(default_factory=list)


def sim_nodes(nodes: Sequence[Node], config: BridgeConfig) -> list[SimNode]:
    """Slurm's nodes in the configured pools, as the simulator's (same names and GPUs)."""
    out: list[SimNode] = []
    for node in sorted(nodes, key=lambda n: n.name):
        pool = pool_of(node, config)
        if pool is None:
            continue
        kind = KIND_OF_MODE.get(config.pools[pool].lend_mode)
        out.append(SimNode(len(out), node.name, pool, kind, max(1, node.gpus)))
    return out


def sim_jobs(
    records: Sequence[AccountingRecord],
    start: datetime,
    end: datetime,
    config: BridgeConfig,
) -> list[SimJob]:
    """The window's batch jobs as the simulator's, from sacct's records, by the
    simulator's own reader (`bridge.sim.inputs.jobs_from_records`: a requeued job is one
    job, a job running at the start is carried in, Triton's jobs are left out). Raises
    `InputError` for a GPU job of a partition no pool names."""
    return jobs_from_records(
        records, start=start, end=end, kind_of_partition=partition_kinds(config)
    )


def replay(
    config: BridgeConfig,
    nodes: Sequence[Node],
    records: Sequence[AccountingRecord],
    load: Arrivals,
    summary: Summary,
    timing: Timing | None = None,
    models: Mapping[str, ModelConfig] | None = None,
) -> Replay:
    """Run the window twice on the simulator, with and without lending. `models`: the
    models scaled, with their facts (default: `config`'s repository merged with its
    TOML, as the daemon reads them)."""
    specs = dict(site_models(config).scaled if models is None else models)
    notes: list[str] = []
    fleet = sim_nodes(nodes, config)
    kinds = {n.partition for n in fleet if n.partition}
    end = load.start + timedelta(seconds=load.steps * load.step_s)
    jobs = sim_jobs(records, load.start, end, config)
    dropped = [j for j in jobs if j.kind not in kinds]
    if dropped:
        notes.append(f"{len(dropped)} batch jobs of a kind no node of the fleet runs: left out")
        jobs = [j for j in jobs if j.kind in kinds]
    service_ms: dict[str, float] = {}
    for name in specs:
        seen = summary.models.get(name)
        if seen is not None and seen.compute_ms is not None:
            service_ms[name] = seen.compute_ms
        else:
            service_ms[name] = DEFAULT_SERVICE_MS
            notes.append(f"{name}: no compute time measured; {DEFAULT_SERVICE_MS:g} ms a request")
    if load.covered < load.steps:
        notes.append(
            f"samples cover {load.covered} of {load.steps} steps of {load.step_s:g} s: "
            f"gaps over {HOLD_S:g} s count as no load"
        )
    series = ArrivalSeries(
        load.step_s,
        {m: np.asarray(load.rates.get(m, [0.0] * load.steps), float) for m in specs},
    )
    instances = [m.instances for m in specs.values() if m.instances]

    def setup(name: str, description: str, cfg: BridgeConfig) -> Setup:
        return Setup(
            name=name,
            description=description,
            config=cfg,
            nodes=fleet,
            jobs=jobs,
            arrivals=series,
            service_s={m: ms / 1000.0 for m, ms in service_ms.items()},
            horizon_s=load.steps * load.step_s,
            timing=timing or Timing(),
            service_cv2=config.policy.service_cv2,
            series_step_s=max(config.tick_s, 60.0),
            replica_servers=max(instances) if instances else None,
            models=specs,
        )

    none_config = config.model_copy(
        update={"policy": config.policy.model_copy(update={"max_lent_nodes": 0})}
    )
    setups = [
        setup("no lending", "nothing lent (max_lent_nodes = 0), same fleet", none_config),
        setup("lending", "the bridge's policy as configured", config),
    ]
    results = {s.name: Engine(s).run() for s in setups}
    pools: dict[str, int] = {}
    for n in fleet:
        pools[n.pool] = pools.get(n.pool, 0) + 1
    notes.append("the fleet is Slurm's nodes now; the load, Triton's answers plus its queue")
    return Replay(load.start, end, pools, len(jobs), service_ms, results, notes)


__all__ = ["KIND_OF_MODE", "Replay", "replay", "sim_jobs", "sim_nodes"]
