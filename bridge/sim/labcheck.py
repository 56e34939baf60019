"""The simulator checked against the lab: the simulated twin of a lab scenario, and the
side-by-side comparison of what each run decided.

A lab scenario (tests/lab/test_sim_vs_lab.py reads one: the README's demo,
`bridge.lab.showcase`) drives the real reconciler on the lab cluster; this module builds
the `Setup` that mirrors it and compares the two runs:

- `lab_models`: the models the reconciler scales (the repository's with the TOML's
  overrides);
- `lab_setup`: the lab's nodes (names, pools, partitions, GPUs) from its `LabSpec` and
  the bridge configuration the reconciler ran with (same tick, pools, policy; the models
  it scaled: the repository's facts merged with the TOML's overrides);
  the models' service times and instances from the Triton model repository; the jobs
  (`showcase_jobs`: the showcase's training and elastic jobs) and the load
  (`arrivals_from_offsets`: the load generator's own schedule, counted per step);
- `simulate`: runs the engine and also keeps what the lab test records on its side, the
  lease state changes and each tick's model samples (`TracingEngine`);
- `replayed_timing`: the Slurm and Triton delays a lab lease actually took (preemption,
  Triton start, cancel), so the simulator can be run with the lab's own delays as well as
  with the bench's medians (`Timing()`);
- `compare_decisions`: pairs the lab's decisions with the simulator's in order and says
  how each pair differs (kind, node, pool, models, time beyond a tolerance);
- `format_decisions`, `format_transitions`, `format_samples`: the two timelines as text.

Pure apart from reading the model repository: no Slurm, Triton or network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bridge.config import BridgeConfig, ModelConfig
from bridge.daemon.launcher import start_models
from bridge.lab.spec import LabSpec
from bridge.lifecycle import LeaseState
from bridge.paths import model_repository
from bridge.policy import Action, Lend, Return, StartBaseline
from bridge.sim.engine import Engine, Setup, SimLease, Timing
from bridge.sim.fleet import SimNode
from bridge.sim.result import Decision, PolicyResult
from bridge.sim.workload import ArrivalSeries, SimJob
from bridge.triton.catalog import ModelCatalog
from bridge.triton.repository import parameters, read_config

#: the lab's Slurm partition of each pool -> the kind of batch job that runs there
#: (the simulator names a node's batch partition after the jobs it takes)
JOB_KIND = {"train": "training", "elastic": "elastic"}
#: the model parameter that sets a lab model's service time (triton_repo/busy)
SERVICE_PARAMETER = "service_time_ms"
#: service time of a model without that parameter (echo: Triton's own overhead)
DEFAULT_SERVICE_MS = 1.0


# ---- the lab's fleet, jobs and load ---------------------------------------------------


def node_pools(spec: LabSpec, config: BridgeConfig) -> dict[str, str]:
    """Lab node name -> the configured pool the reconciler puts it in: the pool whose
    partition holds the node, a lendable pool before the reserved one (the elastic nodes
    are in the `infer` partition too), as `bridge.daemon.observe.pool_of` does."""
    out: dict[str, str] = {}
    for node in spec.nodes:
        partitions = {p for p in ("train", "elastic", "infer") if node in spec.partition_nodes(p)}
        matches = [
            (pool.lend_mode == "reserved", name)
            for name, pool in config.pools.items()
            if pool.partition in partitions
        ]
        if not matches:
            raise ValueError(f"lab node {node.name}: no configured pool holds its partitions")
        out[node.name] = min(matches)[1]
    return out


def sim_nodes(spec: LabSpec, config: BridgeConfig) -> list[SimNode]:
    """The lab's nodes as simulated nodes, same names, pools and GPUs. A reserved node
    takes no batch job; the others take the jobs of their own Slurm partition."""
    pools = node_pools(spec, config)
    nodes = []
    for i, node in enumerate(spec.nodes):
        pool = pools[node.name]
        reserved = config.pools[pool].lend_mode == "reserved"
        partition = None if reserved else JOB_KIND.get(node.pool)
        nodes.append(SimNode(i, node.name, pool, partition, spec.gpus_per_node))
    return nodes


def showcase_jobs(
    spec: LabSpec,
    *,
    submit_s: float = 0.0,
    duration_s: float = 1800.0,
    training_ids: Sequence[str] = (),
    elastic_id: str = "",
) -> list[SimJob]:
    """The showcase's batch work (`bridge.lab.showcase`): one whole-node training job on
    every training node and one whole-node elastic job (`sleep 1800`). Ids default to
    train-<node> and elastic; pass Slurm's to line them up with the lab's."""
    gpus = spec.gpus_per_node
    train = spec.pool_nodes("train")
    ids = list(training_ids) or [f"train-{n.name}" for n in train]
    if len(ids) != len(train):
        raise ValueError(f"{len(ids)} training job ids for {len(train)} training nodes")
    jobs = [SimJob(job_id, "training", submit_s, duration_s, gpus) for job_id in ids]
    if spec.pool_nodes("elastic"):
        jobs.append(SimJob(elastic_id or "elastic", "elastic", submit_s, duration_s, gpus))
    return jobs


def arrivals_from_offsets(
    offsets: Mapping[str, Sequence[float]],
    models: Sequence[str],
    step_s: float,
    horizon_s: float,
) -> ArrivalSeries:
    """Per model, the requests of a load generator's schedule (seconds from the load's
    start) counted in ceil(horizon_s / step_s) steps of `step_s` from 0, as requests per
    second. A model without offsets gets no load; offsets past the last step are left out."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a finite number > 0, got {step_s!r}")
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ValueError(f"horizon_s must be a finite number > 0, got {horizon_s!r}")
    unknown = sorted(set(offsets) - set(models))
    if unknown:
        raise ValueError(f"offsets for models that are not configured: {', '.join(unknown)}")
    steps = max(1, math.ceil(horizon_s / step_s - 1e-9))
    edges = np.arange(steps + 1) * step_s
    rates: dict[str, npt.NDArray[np.float64]] = {}
    for model in models:
        times = np.asarray(offsets.get(model, ()), dtype=float)
        # half-open steps: numpy's last bin would also take a request at the horizon
        counts, _ = np.histogram(times[(times >= 0) & (times < edges[-1])], bins=edges)
        rates[model] = counts.astype(float) / step_s
    return ArrivalSeries(step_s=step_s, rates=rates)


def model_service(
    models: Sequence[str], repo: Path | None = None, default_ms: float = DEFAULT_SERVICE_MS
) -> tuple[dict[str, float], int]:
    """Per model, its service time in seconds (the `service_time_ms` parameter of its
    config.pbtxt, else `default_ms`), and the model instances one replica runs (the
    largest instance_group count: the lab's models have one instance each)."""
    repo = repo or model_repository()
    service: dict[str, float] = {}
    instances = 1
    for model in models:
        cfg = read_config(repo / model)
        raw = parameters(repo / model).get(SERVICE_PARAMETER, "")
        service[model] = (float(raw) if raw.strip() else default_ms) / 1000.0
        counts = [g.count for g in cfg.instance_group if g.count > 0]
        instances = max([instances, *counts])
    return service, instances


def lab_models(config: BridgeConfig, repo: Path | None = None) -> dict[str, ModelConfig]:
    """The models the lab's reconciler scales with `config` that its baselines serve: the
    repository's (`repo`, default: the project's) facts merged with the TOML's overrides,
    less a model kept out of the servers started for every model (`stb.load_at_start`
    false: the lab's LLM, which no scenario of the twin loads)."""
    repo = repo or model_repository()
    scaled = ModelCatalog(repo, config.models, say=False).facts().scaled
    started = start_models(repo)
    return {m: c for m, c in scaled.items() if started is None or m in started}


def lab_setup(
    spec: LabSpec,
    config: BridgeConfig,
    jobs: Sequence[SimJob],
    arrivals: ArrivalSeries,
    horizon_s: float,
    *,
    timing: Timing | None = None,
    repo: Path | None = None,
    name: str = "lab-twin",
) -> Setup:
    """The simulator's twin of a lab run with `config` (the reconciler's configuration,
    used as is: tick, pools, policy) and the repository `repo` (default: the project's):
    the models are those the reconciler scales, the repository's facts with the TOML's
    overrides (the one merge, `bridge.modelfacts`). Each replica runs the repository's
    model instances (busy: one, 20 ms a request, deterministic: cv2 0)."""
    specs = lab_models(config, repo)
    models = list(specs)
    service, instances = model_service(models, repo)
    return Setup(
        name=name,
        description=f"the lab ({len(spec.nodes)} nodes) as the simulator sees it",
        config=config,
        nodes=sim_nodes(spec, config),
        jobs=list(jobs),
        arrivals=arrivals,
        service_s=service,
        horizon_s=horizon_s,
        timing=timing or Timing(),
        service_cv2=0.0,
        series_step_s=max(config.tick_s, 60.0),
        replica_servers=instances,
        models=specs,
    )


# ---- the simulated run, traced --------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """A lease entering a state. `lease` is its rank among the run's leases (1: the first
    lend), so the lab's and the simulator's leases pair up whatever their ids."""

    at_s: float
    lease: int
    node: str
    #: a plain string naming a state (the lab's history) is made a `LeaseState`
    state: LeaseState

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", LeaseState(self.state))


@dataclass(frozen=True)
class Sample:
    """One tick's reading of one model, as the policy saw it."""

    at_s: float
    p99_ms: float | None
    mean_ms: float | None
    rate: float | None
    pending: float | None


@dataclass
class SimTrace:
    result: PolicyResult
    transitions: list[Transition] = field(default_factory=list)
    samples: dict[str, list[Sample]] = field(default_factory=dict)


class TracingEngine(Engine):
    """The engine, keeping the lease state changes and each tick's model samples (what
    the lab test reads from the lease store and the observer). It hooks the engine's
    `_act`, `_move` and `_serve` and changes nothing they do."""

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.transitions: list[Transition] = []
        self.samples: dict[str, list[Sample]] = {m: [] for m in self.models}
        self._rank: dict[int, int] = {}

    def _act(self, action: Action) -> None:
        before = set(self.leases)
        super()._act(action)
        for lease_id in sorted(set(self.leases) - before):
            lease = self.leases[lease_id]
            self._rank[lease_id] = len(self._rank) + 1
            self._note(lease, lease.state)

    def _move(self, lease: SimLease, state: LeaseState) -> None:
        super()._move(lease, state)
        self._note(lease, state)

    def _note(self, lease: SimLease, state: LeaseState) -> None:
        rank = self._rank.get(lease.lease_id, lease.lease_id)
        self.transitions.append(Transition(self.now, rank, lease.node.name, state))

    def _serve(self, k: int) -> None:
        super()._serve(k)
        for m in self.models:
            s = self.history[m][-1]
            self.samples[m].append(Sample(s.at, s.p99_ms, s.mean_ms, s.request_rate, s.pending))


def replayed_timing(
    transitions: Sequence[Transition],
    tick_s: float,
    base: Timing | None = None,
    *,
    lease: int = 1,
    preempted: bool = True,
) -> Timing:
    """The delays one lab lease actually took, as a `Timing` that makes the simulator's
    lease see each state at the same tick as the lab's did.

    The lab sees a step at the first tick after it happened, so a step seen at tick t
    happened in (t - tick_s, t]: the Triton job ran at the midpoint of the tick before
    `starting` was seen (`preempt_start_s`, or `slurm_start_s` for a lend of a free node
    when not `preempted`), was ready a tick before `serving` (`triton_ready_s`), and was
    gone a tick before `returned` (`cancel_s`). Steps the lease did not reach keep
    `base`'s values (default: the bench's `Timing()`)."""
    base = base or Timing()
    seen: dict[LeaseState, float] = {}
    for t in transitions:
        if t.lease == lease:
            seen.setdefault(t.state, t.at_s)
    half = tick_s / 2.0
    changes: dict[str, Any] = {}  # (Any: `replace` checks each against its field's type)
    S = LeaseState
    if S.SUBMITTED in seen and S.STARTING in seen:
        start = max(0.0, seen[S.STARTING] - seen[S.SUBMITTED] - half)
        changes["preempt_start_s" if preempted else "slurm_start_s"] = start
        if S.SERVING in seen:
            changes["triton_ready_s"] = max(0.0, seen[S.SERVING] - seen[S.STARTING])
    if S.RELEASING in seen and S.RETURNED in seen:
        changes["cancel_s"] = max(0.0, seen[S.RETURNED] - seen[S.RELEASING] - half)
    return replace(base, **changes)


def simulate(setup: Setup) -> SimTrace:
    engine = TracingEngine(setup)
    result = engine.run()
    return SimTrace(result, engine.transitions, engine.samples)


# ---- the comparison -------------------------------------------------------------------


def decision_of(
    action: Action, at_s: float, lease_of: Callable[[int], tuple[str, Sequence[str]]]
) -> Decision:
    """A reconciler action as the simulator records it. `lease_of(lease_id)` gives a
    returned lease's node and models (the lab reads them from its lease store)."""
    if isinstance(action, Lend):
        return Decision(at_s, "lend", action.node, tuple(action.models), action.reason)
    if isinstance(action, Return):
        node, models = lease_of(action.lease_id)
        return Decision(at_s, "return", node, tuple(models), action.reason)
    if isinstance(action, StartBaseline):
        return Decision(at_s, "baseline", action.node, (), action.reason)
    raise TypeError(f"not a policy action: {action!r}")


@dataclass(frozen=True)
class Tolerance:
    """How far apart in time (seconds, either way) a pair of decisions may be: per kind,
    else `default_s`."""

    default_s: float
    per_kind: Mapping[str, float] = field(default_factory=dict)

    def of(self, kind: str) -> float:
        return self.per_kind.get(kind, self.default_s)


@dataclass(frozen=True)
class Row:
    """The index-th decision of each run (None where that run has fewer)."""

    index: int
    lab: Decision | None
    sim: Decision | None
    lab_pool: str
    sim_pool: str
    #: sim time minus lab time (None when one side is missing)
    delta_s: float | None
    #: what differs, "" when the pair agrees
    difference: str

    @property
    def ok(self) -> bool:
        return not self.difference


def compare_decisions(
    lab: Sequence[Decision],
    sim: Sequence[Decision],
    pools: Mapping[str, str],
    tolerance: Tolerance,
) -> list[Row]:
    """Pair the two sequences in order. A pair agrees when kind, node, pool (`pools`:
    node -> pool) and models are the same and the times are within the kind's tolerance."""
    rows = []
    for i in range(max(len(lab), len(sim))):
        a = lab[i] if i < len(lab) else None
        b = sim[i] if i < len(sim) else None
        pa = pools.get(a.node, "?") if a and a.node else ""
        pb = pools.get(b.node, "?") if b and b.node else ""
        delta = None
        diffs: list[str] = []
        if a is None or b is None:
            diffs.append("only in the simulator" if a is None else "only on the lab")
        else:
            delta = b.at_s - a.at_s
            if a.kind != b.kind:
                diffs.append(f"kind {a.kind} vs {b.kind}")
            if a.node != b.node:
                diffs.append(f"node {a.node} vs {b.node}")
            if pa != pb:
                diffs.append(f"pool {pa} vs {pb}")
            if tuple(sorted(a.models)) != tuple(sorted(b.models)):
                diffs.append(f"models {','.join(a.models)} vs {','.join(b.models)}")
            limit = tolerance.of(a.kind)
            if abs(delta) > limit + 1e-9:
                side = "later" if delta > 0 else "earlier"
                diffs.append(f"sim {abs(delta):.1f}s {side} (tolerance {limit:g}s)")
        rows.append(Row(i + 1, a, b, pa, pb, delta, "; ".join(diffs)))
    return rows


# ---- printing -------------------------------------------------------------------------


def _t(at_s: float | None) -> str:
    return "-" if at_s is None else f"{at_s:6.1f}"


def _num(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def format_decisions(rows: Sequence[Row]) -> str:
    """The decisions side by side: lab | simulator | difference."""

    def side(d: Decision | None, pool: str) -> list[str]:
        if d is None:
            return ["-", "-", "-", "-"]
        return [_t(d.at_s), d.kind, f"{d.node}({pool})", ",".join(d.models)]

    body = [
        [
            str(r.index),
            *side(r.lab, r.lab_pool),
            *side(r.sim, r.sim_pool),
            _num(r.delta_s, "{:+.1f}"),
            r.difference or "same",
        ]
        for r in rows
    ]
    header = [
        "#",
        "lab t",
        "kind",
        "node",
        "models",
        "sim t",
        "kind",
        "node",
        "models",
        "dt",
        "difference",
    ]
    return _table(header, body)


#: a lease's states in the order a report lists them (`failed` just before the end)
_STATE_ORDER = (
    LeaseState.REQUESTED,
    LeaseState.SUBMITTED,
    LeaseState.STARTING,
    LeaseState.SERVING,
    LeaseState.DRAINING,
    LeaseState.RELEASING,
    LeaseState.FAILED,
    LeaseState.RETURNED,
)


def format_transitions(lab: Sequence[Transition], sim: Sequence[Transition]) -> str:
    """Each lease's states, lab time and simulator time side by side (paired by the
    lease's rank and the state)."""
    keys: list[tuple[int, LeaseState]] = []
    for t in [*lab, *sim]:
        if (t.lease, t.state) not in keys:
            keys.append((t.lease, t.state))
    first_lab = {(t.lease, t.state): t for t in reversed(lab)}
    first_sim = {(t.lease, t.state): t for t in reversed(sim)}
    order = {state: i for i, state in enumerate(_STATE_ORDER)}
    keys.sort(key=lambda k: (k[0], order[k[1]]))
    body = []
    for lease, state in keys:
        a, b = first_lab.get((lease, state)), first_sim.get((lease, state))
        either = a or b
        node = either.node if either else ""
        delta = b.at_s - a.at_s if a and b else None
        body.append(
            [
                str(lease),
                node,
                state,
                _t(a.at_s if a else None),
                _t(b.at_s if b else None),
                _num(delta, "{:+.1f}"),
            ]
        )
    return _table(["lease", "node", "state", "lab t", "sim t", "dt"], body)


def format_samples(
    lab: Sequence[Sample], sim: Sequence[Sample], tick_s: float, every: int = 1
) -> str:
    """One model's per-tick samples side by side, paired by tick (time / tick_s, rounded):
    p99 (ms), the tick's mean latency (ms), request rate (/s), pending requests."""
    by_tick_lab = {round(s.at_s / tick_s): s for s in lab}
    by_tick_sim = {round(s.at_s / tick_s): s for s in sim}
    ticks = sorted(set(by_tick_lab) | set(by_tick_sim))
    body = []
    for k in ticks[:: max(1, every)]:
        row = [f"{k * tick_s:6.1f}"]
        for s in (by_tick_lab.get(k), by_tick_sim.get(k)):
            if s is None:
                row += ["", "", "", ""]
            else:
                row += [_num(s.p99_ms), _num(s.mean_ms), _num(s.rate, "{:.1f}"), _num(s.pending)]
        body.append(row)
    header = ["t", "lab p99", "mean", "rate", "pend", "sim p99", "mean", "rate", "pend"]
    return _table(header, body)
