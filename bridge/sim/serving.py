"""The replicas' side of a simulated run: ready replicas grouped by the models they hold
(`Group`: replicas of one model set see the same load), the latency model over each tick
(`bridge.sim.latency`), and what each model's requests saw: the `ModelSample` the
observe step would have read (Triton's 60 s p99, the tick's mean latency, request rate,
pending requests; for an LLM its token signal too: the tick's TTFT and TPOT p99s, prompt
and output tokens/s, streams running, from `bridge.sim.tokens`), the share within the SLO,
per request and per minute (an LLM's request SLO: its end-to-end bound).

`Serving` is the engine's (`bridge.sim.engine.Engine`): `join` when routing changes (a
replica in or out: the engine's act and sync), `serve(k)` once per tick. The hot path (the
latency model's tick) is kept as plain numbers; `tests/unit/test_sim_speed.py` compares
its shortcuts with the plain code.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bridge.config import ModelConfig
from bridge.policy import ModelSample
from bridge.sim import latency
from bridge.sim.result import ModelOutcome
from bridge.sim.setup import Setup
from bridge.sim.tokens import TokenModel
from bridge.sim.views import model_sample as _model_sample
from bridge.sim.views import token_sample as _token_sample
from bridge.sim.workload import ArrivalSeries

#: Triton's latency summaries (prometheus-cpp): observations of the last 60 s, kept in 5
#: buckets that rotate every 12 s, so a quantile covers the last 48 to 60 s and old
#: requests leave it in 12 s steps (as the lab shows)
WINDOW_S = 60.0
AGE_BUCKETS = 5


@dataclass(eq=False)
class Group:
    """Ready replicas holding the same models on as many GPUs: they see the same load."""

    models: tuple[str, ...]
    nodes: int = 0
    #: the parallel executions of each replica (`Serving.servers`), and the GPUs each
    #: holds (its node's whole; a partial lease's, `Lend.gpus`)
    servers: int = 1
    gpus: int = 1
    backlog_s: float = 0.0
    #: the ticks in Triton's summary window, oldest first: their (quantile
    #: `wait_quantile()`, requests), their requests alone and their end times. A tick
    #: leaves all three once the window has rotated past it (`_window_start`; it never
    #: comes back)
    window: deque[tuple[float, float]] = field(default_factory=deque)
    window_n: deque[float] = field(default_factory=deque)
    window_at: deque[float] = field(default_factory=deque)
    extra_p99_s: float | None = None
    #: the last tick's state (`latency.TickState`'s delay_lo_s, delay_hi_s, wait_p and
    #: wait_rate), its `mean_extra()` and `share_within(budget)` by budget
    state: tuple[float, float, float, float] | None = None
    mean_extra: float = 0.0
    within: dict[float, float] = field(default_factory=dict)
    #: when its first replica came up (the summaries' rotation runs from there)
    born: float = 0.0
    #: requests queued on one of its nodes at the last tick's end
    pending: float = 0.0
    #: busy servers (slots) offered to one of its nodes over the last tick
    load: float = 0.0


#: `Serving._lay_out()`: per group its models' (index, replicas, service time), per model
#: its (share of its traffic, group)
Layout = tuple[list[tuple[Group, list[tuple[int, float, float]]]], list[list[tuple[float, Group]]]]


class Serving:
    """The ready replicas of one run, by model set, and each model's outcome and samples."""

    def __init__(
        self,
        setup: Setup,
        specs: Mapping[str, ModelConfig],
        ticks: int,
        depth: int,
        node_gpus: int,
        replica_gpus: int,
    ) -> None:
        self.s = setup
        self.tick_s = setup.config.tick_s
        self.models = list(specs)
        #: per model, its mean arrival rate over each tick
        self.rates = {m: per_tick(setup.arrivals, m, self.tick_s, ticks) for m in self.models}
        self.window_ticks = max(1, round(WINDOW_S / self.tick_s))
        self._rate_series = [self.rates[m] for m in self.models]
        #: per model, its recent samples (as deep as the policy reads)
        self.history: dict[str, deque[ModelSample]] = {m: deque(maxlen=depth) for m in self.models}
        self.rate_window: dict[str, deque[float]] = {
            m: deque(maxlen=self.window_ticks) for m in self.models
        }
        #: by (models, the GPUs each replica holds: None, its node whole)
        self.groups: dict[tuple[tuple[str, ...], int | None], Group] = {}
        #: `_lay_out()` of the groups as they are (None: to be made again)
        self._layout: Layout | None = None
        #: per group of the layout, per model on it: split over several replicas
        self._smooth: list[list[bool]] = []
        #: GPUs of a node, and parallel model instances on one replica
        self.node_gpus = node_gpus
        self.replica_gpus = replica_gpus
        #: GPU-seconds the replicas spent serving
        self.inference_used_s = 0.0
        slos = {m: request_slo_ms(specs[m]) for m in self.models}
        out = {m: ModelOutcome(slos[m]) for m in self.models}
        self.outcome = out
        #: per model (model order), its token workload (`Setup.tokens`) or None
        self._tokens = [setup.tokens.get(m) for m in self.models]
        for m in self.models:
            if setup.tokens.get(m) is not None:
                out[m].tokens = True
        #: per LLM model (model order; None for the others): its mean prompt and output
        #: lengths (its samples' token rates) and its length quantiles (its samples'
        #: length histograms: `ModelSample.prompt_lengths`, `output_lengths`)
        self._lengths = [
            None
            if t is None
            else (
                t.demand(1.0).mean_prompt,
                t.demand(1.0).mean_output,
                t.prompt_tokens,
                t.output_tokens,
            )
            for t in self._tokens
        ]
        self.minute = {m: [0.0, 0.0] for m in self.models}
        #: what `serve` reads of each model, in model order: SLO (ms), service time (s and
        #: ms), SLO budget beyond the service time (s), outcome, minute tally, history, rates
        self._per_model = [
            (
                slos[m],
                setup.service_s[m],
                setup.service_s[m] * 1000.0,
                slos[m] / 1000.0 - setup.service_s[m],
                out[m],
                self.minute[m],
                self.history[m],
                self.rate_window[m],
            )
            for m in self.models
        ]
        #: the last tick's requests per second (all models) and worst p99 over its SLO
        self.tick_requests = 0.0
        self.tick_worst = 0.0

    def servers(self, gpus: int | None) -> int:
        """Parallel executions of a replica on `gpus` GPUs of a node (None: the node whole,
        `replica_gpus`): one per GPU, or with `Setup.replica_servers` its share of them
        (1 at least). A partial lease's replica serves on its own GPUs, as the daemon's
        view of it (`ReplicaView.gpus` = `LeaseView.lent_gpus`) says."""
        if gpus is None or gpus >= self.node_gpus:
            return self.replica_gpus
        return max(1, self.replica_gpus * gpus // self.node_gpus)

    def join(self, models: tuple[str, ...], n: int, now: float, gpus: int | None = None) -> None:
        """`n` replicas holding `models` come into routing at `now` (n < 0: go out), each
        on `gpus` GPUs of its node (None: the node whole)."""
        key = (models, None if gpus is None or gpus >= self.node_gpus else gpus)
        group = self.groups.get(key)
        if group is None:
            size = self.window_ticks + 1
            group = self.groups[key] = Group(
                models,
                servers=self.servers(key[1]),
                gpus=self.node_gpus if key[1] is None else key[1],
                window=deque(maxlen=size),
                window_n=deque(maxlen=size),
                window_at=deque(maxlen=size),
                born=now,
            )
        if n > 0 and group.nodes > 0:  # a fresh replica starts with an empty queue
            group.backlog_s *= group.nodes / (group.nodes + n)
        group.nodes += n
        if group.nodes <= 0:
            del self.groups[key]
        self._layout = None

    def _lay_out(self) -> Layout:
        """What `serve` needs of the groups, which change only at `join` (`Layout`)."""
        # each model's GPUs over its replicas: nginx weighs a replica by its GPUs
        # (`RoutingTable.weights`), so a replica takes the share of a model's requests
        # its GPUs are of the model's; replicas alike, an even split
        gpus = dict.fromkeys(self.models, 0)
        for group in self.groups.values():
            for m in group.models:
                if m in gpus:
                    gpus[m] += group.nodes * group.gpus
        index = {m: i for i, m in enumerate(self.models)}
        per_group: list[tuple[Group, list[tuple[int, float, float]]]] = []
        per_model: list[list[tuple[float, Group]]] = [[] for _ in self.models]
        for group in self.groups.values():
            parts: list[tuple[int, float, float]] = []
            for m in group.models:
                # the model's replicas as so many of this group's (a replica takes 1 / r)
                r = gpus.get(m, 0) / group.gpus
                if r:
                    parts.append((index[m], r, self.s.service_s[m]))
                    per_model[index[m]].append((group.nodes / r, group))
            per_group.append((group, parts))
        return per_group, per_model

    def serve(self, k: int) -> list[ModelSample]:
        """The latency model over tick k (from k*tick to (k+1)*tick); each model's sample
        of it, in model order (each also appended to its history)."""
        dt = self.tick_s
        now = (k + 1) * dt
        if self._layout is None:
            self._layout = self._lay_out()
            # per group, per model on it: the model is split over several replicas
            self._smooth = [[r > 1 for _, r, _ in members] for _, members in self._layout[0]]
        per_group, per_model_at = self._layout
        smooth = self._smooth
        rates = [series[k] for series in self._rate_series]
        steered = _steer(per_group, rates, len(per_model_at))
        if steered is not None:
            per_group, per_model_at = steered
        cv2, routing_ca2 = self.s.service_cv2, self.s.routing_ca2
        advance, wait_quantile = latency.advance, latency.wait_quantile
        for (group, members), many in zip(per_group, smooth, strict=True):
            node_rate = 0.0
            node_load = 0.0
            routed = 0.0  # req/s of models least_conn spreads over several replicas
            for (i, r, service), spread in zip(members, many, strict=True):
                share = rates[i] / r
                node_rate += share
                node_load += share * service
                if spread:
                    routed += share
            # the arrivals' SCV: Poisson's 1, least_conn's for the requests it routed
            # (a superposition's: the rate-weighted mean of its streams')
            ca2 = 1.0 - (1.0 - routing_ca2) * routed / node_rate if node_rate > 0 else 1.0
            # `latency.step`, as plain numbers
            lo = group.backlog_s
            servers = group.servers
            hi, p, tail, queued = advance(servers, node_load, node_rate, lo, dt, cv2, ca2)
            group.backlog_s = hi
            busy = min(node_load, servers) / servers
            self.inference_used_s += busy * group.gpus * group.nodes * dt
            window, window_n, window_at = group.window, group.window_n, group.window_at
            requests = node_rate * dt
            window.append((wait_quantile(lo, hi, p, tail), requests))
            window_n.append(requests)
            window_at.append(now)
            group.state = (lo, hi, p, tail)
            group.mean_extra = (lo + hi) / 2.0 + (p / tail if tail > 0 else 0.0)  # `mean_extra`
            group.within.clear()
            group.pending = queued
            group.load = node_load
            start = _window_start(group.born, now)
            while window_at[0] <= start:  # (the newest tick is always in)
                window_at.popleft()
                window_n.popleft()
                window.popleft()
            group.extra_p99_s = _window_quantile(window, window_n)
        requests_total = 0.0
        worst = 0.0
        samples: list[ModelSample] = []
        for (
            (slo_ms, s_m, compute_ms, budget, out, minute, history, rate_window),
            lam,
            parts,
            tokens,
            lengths,
        ) in zip(self._per_model, rates, per_model_at, self._tokens, self._lengths, strict=True):
            rate_window.append(lam)
            n = lam * dt
            requests_total += lam
            p99: float | None = None
            mean: float | None = None
            if not parts:  # no replica: every request fails
                within = 0.0
                out.requests += n
                out.within_slo += n * within
                minute[0] += n
                minute[1] += n * within
                if n > 0:
                    worst = math.inf
                sample = _model_sample(now, None, None, None, None, None)
                history.append(sample)
                samples.append(sample)
                continue
            if len(parts) == 1:  # (most models: one group holds them all) the loop below
                share, group = parts[0]
                part = group.within.get(budget)
                if part is None:
                    assert group.state is not None
                    part = group.within[budget] = latency.share_within(*group.state, budget)
                within = 0.0 + share * part  # (`0.0 +`: the loop's sums, exactly)
                mean_s = 0.0 + share * (s_m + group.mean_extra)
                pending = 0.0 + group.pending
                if group.extra_p99_s is not None:
                    p99 = (s_m + group.extra_p99_s) * 1000.0
            else:
                pending = 0.0
                within = 0.0
                mean_s = 0.0
                for share, group in parts:
                    # the group's tick, once for all its models (of the same budget)
                    part = group.within.get(budget)
                    if part is None:
                        assert group.state is not None
                        part = group.within[budget] = latency.share_within(*group.state, budget)
                    within += share * part
                    mean_s += share * (s_m + group.mean_extra)
                    pending += group.pending
                    if group.extra_p99_s is not None:
                        q = (s_m + group.extra_p99_s) * 1000.0
                        if p99 is None or q > p99:  # (`max`, without the call)
                            p99 = q
            token_p99s = None
            if tokens is not None and n > 0:
                token_p99s = _token_tally(tokens, out, parts, n)
            if lam > 0:
                mean = mean_s * 1000.0
            if p99 is not None and sum(rate_window) <= 0:
                p99 = None
            out.requests += n
            out.within_slo += n * within
            minute[0] += n
            minute[1] += n * within
            if p99 is not None and p99 / slo_ms > worst:
                worst = p99 / slo_ms
            if lengths is None:
                sample = _model_sample(
                    now, p99, lam, pending, mean, compute_ms if mean is not None else None
                )
            else:  # an LLM: its token signal too (`bridge.triton.llm_metrics`' figures)
                slots = sum(g.servers * g.nodes for _, g in parts)
                ttft_ms, tpot_ms = (None, None) if token_p99s is None else token_p99s
                sample = _token_sample(
                    now,
                    p99,
                    lam,
                    pending,
                    mean,
                    compute_ms if mean is not None else None,
                    ttft_ms,
                    tpot_ms,
                    lam * lengths[0],
                    lam * lengths[1],
                    min(lam * s_m, float(slots)),
                    lengths[2],
                    lengths[3],
                )
            history.append(sample)
            samples.append(sample)
        self.tick_requests = requests_total
        self.tick_worst = worst
        if int(now // 60.0) != int((now - dt) // 60.0):
            for m in self.models:
                minute = self.minute[m]
                if minute[0] > 0:
                    out = self.outcome[m]
                    out.minutes += 1
                    if minute[1] >= latency.Q * minute[0] - 1e-9:
                        out.minutes_within += 1
                minute[0] = minute[1] = 0.0
        return samples


#: how busy nginx's `least_conn` lets a replica get before it sends a model's requests to
#: its other replicas (bench/least_conn_split.py: a replica of 1 or 2 executions beside
#: one of 8 is held at 85-88% busy where an even split would overload it, and takes close
#: to its even share below that)
STEER_BUSY = 0.85


def _steer(
    per_group: list[tuple[Group, list[tuple[int, float, float]]]],
    rates: Sequence[float],
    models: int,
) -> Layout | None:
    """The tick's layout as `least_conn` routes it: each model's share by GPUs (`_lay_out`),
    except that a replica whose load there is over `STEER_BUSY` of its executions keeps
    only that much and the rest of each of its models goes to that model's replicas with
    room, in proportion to their room (what no replica has room for goes back as the
    split put it: by GPUs). None where no replica is over (the split as it is)."""
    caps = [STEER_BUSY * group.servers for group, _ in per_group]
    loads = [sum(rates[i] / r * svc for i, r, svc in members) for _, members in per_group]
    if all(a <= c for a, c in zip(loads, caps, strict=True)):
        return None
    # per group, per member: the rate each replica takes (req/s)
    take = [[rates[i] / r for i, r, _ in members] for _, members in per_group]
    for _ in range(4):
        moved = [0.0] * models
        for g, (group, members) in enumerate(per_group):
            if loads[g] <= caps[g] or loads[g] <= 0:
                continue
            keep = caps[g] / loads[g]
            for j, (i, _, _) in enumerate(members):
                moved[i] += take[g][j] * (1.0 - keep) * group.nodes
                take[g][j] *= keep
            loads[g] = caps[g]
        if not any(moved):
            break
        for i, rate in enumerate(moved):
            if rate <= 0:
                continue
            room = [
                (g, j, (caps[g] - loads[g]) / svc * group.nodes)
                for g, (group, members) in enumerate(per_group)
                for j, (m, _, svc) in enumerate(members)
                if m == i and loads[g] < caps[g]
            ]
            total = sum(r for _, _, r in room)
            fill = min(rate, total)
            # what no replica has room for: back as the split put it, by GPUs
            home = [
                (g, j, float(per_group[g][0].nodes * per_group[g][0].gpus))
                for g, (_, members) in enumerate(per_group)
                for j, (m, _, _) in enumerate(members)
                if m == i
            ]
            spread = [(fill, room, total), (rate - fill, home, sum(r for *_, r in home))]
            for amount, where, weight in spread:
                if amount <= 0 or weight <= 0:
                    continue
                for g, j, r in where:
                    group, members = per_group[g]
                    add = amount * r / weight / group.nodes
                    take[g][j] += add
                    loads[g] += add * members[j][2]
    new_group: list[tuple[Group, list[tuple[int, float, float]]]] = []
    new_model: list[list[tuple[float, Group]]] = [[] for _ in range(models)]
    for g, (group, members) in enumerate(per_group):
        parts = []
        for j, (i, r, svc) in enumerate(members):
            x = take[g][j]
            if rates[i] <= 0:  # nothing to route: its shares as they were
                parts.append((i, r, svc))
                new_model[i].append((group.nodes / r, group))
            else:
                parts.append((i, rates[i] / x if x > 0 else math.inf, svc))
                new_model[i].append((group.nodes * x / rates[i], group))
        new_group.append((group, parts))
    return new_group, new_model


def _token_tally(
    tokens: TokenModel, out: ModelOutcome, parts: Sequence[tuple[float, Group]], n: float
) -> tuple[float, float]:
    """Add one tick's `n` requests of an LLM model, spread over its groups by `parts`
    (share, group), to its TTFT and TPOT tallies (`TokenModel.tick`); its TTFT and TPOT
    p99s (ms) over the tick, the worst group's (as its request p99 is)."""
    ttft = tpot = 0.0
    ttft_p99 = tpot_p99 = 0.0
    for share, group in parts:
        assert group.state is not None
        lo, hi, p, tail = group.state
        a, b, ttft_s, tpot_s = tokens.tick(group.load, lo, hi, p, tail)
        ttft += share * a
        tpot += share * b
        ttft_p99 = max(ttft_p99, ttft_s)
        tpot_p99 = max(tpot_p99, tpot_s)
    out.ttft_within += n * ttft
    out.tpot_within += n * tpot
    return ttft_p99 * 1000.0, tpot_p99 * 1000.0


def request_slo_ms(model: ModelConfig) -> float:
    """The request objective a model's outcome is judged by (ms): its p99 SLO, or for an
    LLM without one (`ModelConfig.has_request_slo` false) its end-to-end p99 bound
    (`slo_e2e_p99_ms`), else none (inf)."""
    if model.has_request_slo:
        return model.slo_p99_ms
    return model.slo_e2e_p99_ms if model.slo_e2e_p99_ms is not None else math.inf


def _window_quantile(
    window: Sequence[tuple[float, float]], requests: Sequence[float]
) -> float | None:
    """`latency.window_quantile_of` of a group's window ((quantile, requests) of each
    tick, and the requests alone): most often the slowest tick alone holds the share of
    requests over the quantile, and this finds it without a Python loop."""
    total = sum(requests)  # (`window_quantile_of`'s sum: the same terms, in order)
    if total <= 0:
        return None
    top = max(window)  # the slowest tick, the most requests among equals
    if top[1] > 0 and top[1] >= (1.0 - latency.Q) * total:
        return top[0]
    return latency.window_quantile_of([(n, extra) for extra, n in window])


def _window_start(born: float, now: float) -> float:
    """The oldest observation time in a Triton summary at `now` (see AGE_BUCKETS)."""
    rotation = WINDOW_S / AGE_BUCKETS
    last = born + math.floor((now - born) / rotation) * rotation
    return last - (WINDOW_S - rotation)


def per_tick(arrivals: ArrivalSeries, model: str, tick_s: float, ticks: int) -> list[float]:
    """The model's mean rate over each tick (the series' steps need not match ticks)."""
    rates = np.asarray(arrivals.rates[model], dtype=float)
    step = arrivals.step_s
    if math.isclose(step, tick_s):
        out = np.zeros(ticks)
        n = min(ticks, len(rates))
        out[:n] = rates[:n]
        return [float(x) for x in out]
    edges = np.arange(len(rates) + 1) * step
    cum = np.concatenate(([0.0], np.cumsum(rates * step)))
    at = np.arange(ticks + 1) * tick_s
    return [float(x) for x in np.diff(np.interp(at, edges, cum)) / tick_s]
