"""The simulator's fast paths (issue 15) against the plain code they stand for: the
fleet's inlined start and end of a single-node job against `_start`/`finish`, its start
of a job that comes when none waits against `submit` and a pass, the latency window's
quantile without a sort against the sorted walk (and the engine's without a loop against
both), the latency model's tick as plain numbers against `step` and `capacity.queue`,
the quiet proof's counting of a tick's samples against `observe`, the engine's makers of
`ModelSample`, `NodeView` and `JobView` against the classes' own. The whole engine is
compared with its recording in `test_sim_golden.py`; these compare each shortcut alone on
small random cases."""

from __future__ import annotations

import random

import pytest

from bridge.config import BridgeConfig, ModelConfig
from bridge.policy import JobView, ModelSample, NodeView, capacity, history_depth
from bridge.sim import latency
from bridge.sim.fleet import Fleet, JobRun, SimNode
from bridge.sim.quiet import QuietProof
from bridge.sim.serving import _window_quantile
from bridge.sim.views import job_view as _job_view
from bridge.sim.views import model_sample as _model_sample
from bridge.sim.views import node_view as _node_view
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


def _queues(fleet: Fleet) -> object:
    return (
        {
            p: [(key, job_id, run.job.job_id) for key, job_id, run in q]
            for p, q in fleet.pending.items()
        },
        fleet.waiting,
        {kind: fleet.pending_count(kind) for kind in ("training", "elastic")},
    )


@pytest.mark.parametrize("seed", range(8))
def test_a_start_alone_is_a_submit_and_a_pass(seed: int) -> None:
    rng = random.Random(seed)
    fast, plain = _fleet(random.Random(seed)), _fleet(random.Random(seed))
    running: list[tuple[JobRun, JobRun]] = []
    now = 0.0
    for j in range(400):
        now += rng.choice([0.0, 0.5, 3.0])
        if running and rng.random() < (0.9 if fast.waiting else 0.4):
            a, b = running.pop(rng.randrange(len(running)))
            fast.end(a, now)
            plain.end(b, now)
            # a queued job may start now, the same in both
            now_fast, now_plain = fast.schedule(now), plain.schedule(now)
            assert [r.job for r in now_fast] == [r.job for r in now_plain]
            running.extend(zip(now_fast, now_plain, strict=True))
            continue
        partition = rng.choice(fast.partitions)
        kind = rng.choice(["training", "elastic"])
        nodes = rng.choice([1, 1, 1, 2])
        most = max(n.gpus for n in fast.nodes if n.partition == partition)
        gpus = most if nodes > 1 else rng.choice([g for g in (1, 2, 4, 8) if g <= most])
        job = SimJob(f"j{j}", kind, now, 10.0, gpus, nodes=nodes)
        eligible = now + rng.choice([0.0] * 9 + [5.0])
        a, b = JobRun(job, partition, eligible), JobRun(job, partition, eligible)
        if not fast.start_alone(a, now):
            fast.submit(a)
            fast.schedule(now)
        plain.submit(b)
        started = plain.schedule(now)
        assert (a.nodes, a.started_at) == (b.nodes, b.started_at)
        if b in started:
            running.append((a, b))
        assert _state(fast) == _state(plain) and _queues(fast) == _queues(plain)


@pytest.mark.parametrize("seed", range(10))
def test_the_engines_window_quantile_is_window_quantile_of(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        ticks = [
            (rng.choice([0.0, rng.uniform(0, 50), rng.uniform(0, 5000)]), rng.uniform(0, 0.2))
            for _ in range(rng.randint(1, 13))
        ]
        if rng.random() < 0.3:  # ties on the quantile
            ticks = [(r, round(e, 1)) for r, e in ticks]
        window = [(e, r) for r, e in ticks]
        got = _window_quantile(window, [r for r, _ in ticks])
        assert got == latency.window_quantile_of(ticks) == _sorted_walk(ticks)


@pytest.mark.parametrize("seed", range(10))
def test_the_tick_as_plain_numbers_is_step(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        servers = rng.choice([1, 4, 8])
        rate = rng.choice([0.0, rng.uniform(0, 1000)])
        load = rng.choice([0.0, rng.uniform(0, servers * 1.3), float(servers)])
        backlog = rng.choice([0.0, rng.uniform(0, 2.0)])
        cv2 = rng.choice([0.0, 1.0])
        got = latency.step(servers, load, rate, backlog, 5.0, cv2)
        new_backlog, p, tail, pending = latency.advance(servers, load, rate, backlog, 5.0, cv2)
        assert (got.backlog_s, got.state.wait_p, got.state.wait_rate) == (new_backlog, p, tail)
        assert got.pending == pending and got.state.delay_lo_s == backlog
        queue = capacity.queue(servers, load, rate, cv2)  # the stationary part, as it was
        if queue is not None and rate > 0:
            assert (p, tail) == (queue.wait_p, queue.tail)
        else:
            assert (p, tail) == (0.0, float("inf"))
        state = got.state
        lo, hi = state.delay_lo_s, state.delay_hi_s
        assert state.mean_extra() == latency.mean_extra(lo, hi, p, tail)
        assert state.wait_quantile() == latency.wait_quantile(lo, hi, p, tail)
        budget = rng.uniform(0, 0.3)
        assert state.share_within(budget) == latency.share_within(lo, hi, p, tail, budget)


@pytest.mark.parametrize("seed", range(4))
def test_observe_all_counts_as_observe(seed: int) -> None:
    rng = random.Random(seed)
    models = {m: ModelConfig(slo_p99_ms=100.0) for m in ("a", "b", "c")}
    config = BridgeConfig(models=models)
    rates = {m: [100.0] * 50 for m in models}
    depth = history_depth(config)
    every, one = (QuietProof(config, list(models), rates, 5.0, depth, 8) for _ in range(2))
    for k in range(300):
        samples = []
        for _ in models:
            p99 = rng.choice([None, rng.uniform(0, 200)])
            rate = rng.choice([None, 0.0, rng.uniform(0, 500)])
            mean = rng.choice([None, rng.uniform(0, 150)])
            samples.append(
                ModelSample(k * 5.0, p99, rate, None, mean, rng.choice([None, 0.0, 20.0]))
            )
        every.observe_all(samples)
        for m, sample in zip(models, samples, strict=True):
            one.observe(m, sample)
        assert [vars(r) for r in every.runs_in_order] == [vars(one.runs[m]) for m in models]
