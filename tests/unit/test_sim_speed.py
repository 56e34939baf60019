"""The simulator's fast paths (issue 15) against the plain code they stand for: the
fleet's inlined start and end of a single-node job against `_start`/`finish`, the
latency window's quantile without a sort against the sorted walk, the engine's makers of
`ModelSample`, `NodeView` and `JobView` against the classes' own. The whole engine is
compared with its recording in `test_sim_golden.py`; these compare each shortcut alone on
small random cases."""

from __future__ import annotations

import random

import pytest

from bridge.policy import JobView, ModelSample, NodeView
from bridge.sim import latency
from bridge.sim.engine import _job_view, _model_sample, _node_view
from bridge.sim.fleet import Fleet, JobRun, SimNode
from bridge.sim.workload import SimJob


def _fleet(rng: random.Random) -> Fleet:
    nodes = []
    for i in range(12):
        partition = rng.choice(["training", "elastic", None])
        nodes.append(SimNode(i, f"n{i}", partition or "inference", partition, rng.choice([4, 8])))
    return Fleet(nodes, {})


def _state(fleet: Fleet) -> object:
    return (
        [(n.free, sorted(n.jobs), n.fenced, n.triton) for n in fleet.nodes],
        {p: [sorted(b) for b in buckets] for p, buckets in fleet._free.items()},
        dict(fleet._avail),
        dict(fleet._settled),
        {p: dict(u) for p, u in fleet.usage.gpus.items()},
        {p: dict(u) for p, u in fleet.usage.seconds.items()},
    )


@pytest.mark.parametrize("seed", range(8))
def test_the_inlined_start_and_end_match_the_plain_ones(seed: int) -> None:
    rng = random.Random(seed)
    fast, plain = _fleet(random.Random(seed)), _fleet(random.Random(seed))
    running: list[tuple[JobRun, JobRun]] = []
    now = 0.0
    for j in range(300):
        now += rng.choice([0.0, 0.5, 3.0])
        if running and rng.random() < 0.45:
            a, b = running.pop(rng.randrange(len(running)))
            fast.end(a, now)
            plain.finish(b, now)
        else:
            schedulable = [n for n in fast.nodes if n.partition and n.free and not n.fenced]
            if not schedulable:
                continue
            node = rng.choice(schedulable)
            gpus = rng.randint(1, node.free)
            job = SimJob(f"j{j}", "elastic", now, 10.0, gpus)
            a = JobRun(job, str(node.partition), now)
            b = JobRun(job, str(node.partition), now)
            fast._start_on(a, node.index, now)
            plain._start(b, [node.index], now)
            running.append((a, b))
        if rng.random() < 0.05:  # the bridge's fence comes and goes
            node = rng.choice(fast.nodes)
            other = plain.nodes[node.index]
            if node.partition and not node.fenced:
                fast.fence(node, now)
                plain.fence(other, now)
            elif node.fenced:
                fast.unfence(node, now)
                plain.unfence(other, now)
        assert _state(fast) == _state(plain)
    fast.usage.accrue(now)
    plain.usage.accrue(now)
    assert _state(fast) == _state(plain)


@pytest.mark.parametrize("seed", range(20))
def test_the_window_quantile_without_a_sort_is_the_sorted_walk(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        ticks = [
            (rng.choice([0.0, rng.uniform(0, 50), rng.uniform(0, 5000)]), rng.choice([0.0, 0.01]))
            for _ in range(rng.randint(0, 13))
        ]
        ticks = [(r, e if e else rng.uniform(0, 0.2)) for r, e in ticks]
        assert latency.window_quantile_of(ticks) == _sorted_walk(ticks)


def _sorted_walk(ticks: list[tuple[float, float]], q: float = latency.Q) -> float | None:
    """`window_quantile_of` as it was: every tick sorted, slowest first."""
    total = sum(requests for requests, _ in ticks)
    if total <= 0:
        return None
    budget = (1.0 - q) * total
    seen = 0.0
    for extra, requests in sorted(
        ((extra, requests) for requests, extra in ticks if requests > 0), reverse=True
    ):
        seen += requests
        if seen >= budget:
            return extra
    return 0.0


def test_the_engines_samples_are_model_samples() -> None:
    for args in [(5.0, 12.5, 300.0, 2.0, 30.0, 20.0), (10.0, None, None, None, None, None)]:
        made, plain = _model_sample(*args), ModelSample(*args)
        assert type(made) is ModelSample
        assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
        assert vars(made) == vars(plain) and list(vars(made)) == list(vars(plain))


def test_the_engines_node_views_are_node_views() -> None:
    jobs = (JobView("a-1", 4, 10.0, 1, 5.0), JobView("a-2", 2, None))
    for args in [("n1", "elastic", 8, jobs, False), ("n2", "training", 4, (), True)]:
        name, pool, gpus, held, triton = args
        made, plain = _node_view(*args), NodeView(name, pool, True, gpus, held, triton)
        assert type(made) is NodeView
        assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
        assert vars(made) == vars(plain) and list(vars(made)) == list(vars(plain))


def test_the_engines_job_views_are_job_views() -> None:
    for args in [("a-1", 4, 10.0, 1, 5.0, 7.5), ("a-2", 8, None, 0, None, None)]:
        made, plain = _job_view(*args), JobView(*args)
        assert type(made) is JobView
        assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
        assert vars(made) == vars(plain) and list(vars(made)) == list(vars(plain))
