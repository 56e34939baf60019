"""Model placement, carried out (`bridge.policy.Place`, `stb place LEASE MODELS`): a
serving lease's replica is given the models `models` in place of those it holds, and
keeps serving throughout. The reconciler calls `Placer.place` for each placement (the
policy's, an operator's) and `Placer.sync` once a pass; the decisions are the pure
`bridge.daemon.placement`'s, the Triton calls go through the actuator's `triton_for`.

A placement, step by step:
1. `place`: validated (the lease serving, the models known, none twice); recorded in the
   store first (`LeaseStore.place`: the lease's models become the new set, a
   `serving -> serving` event in its history with the reason); "place lease 7 on n3: +b
   -a: <reason>" in the tick's events.
2. Routing is published at once: the dropped models leave the replica's routes
   (`placement.withheld`, on every publish from now on, since the store says so).
3. Each gained model's load is asked, and the pass goes on: Triton's `load_model`
   answers only once the model is loaded (minutes for a large one), so the call runs on a
   thread of the placer's own (`_Asks`), at most one per (Triton job, model). Each later
   pass (`sync`) first takes in the loads that ended (`placement.judge_load`): loaded (its
   seconds from the ask to the answer are the model's load time, `loaded`:
   `bridge.daemon.loadtimes`; the pass's observation shows it READY and routing
   publishes it there by itself), refused (undone, below), no answer (the client's own
   timeout: Triton's repository index is read on the pass each time, the load polled
   there until READY, UNAVAILABLE or gone), or still under way: "lease 7 n3: loading b
   for 42s" in the pass's events. A load still under way `[leases]
   model_load_timeout_s` after its ask is reported as an error and undone as a refusal
   is: a second ask would start a second load of the model beside the first (Triton
   runs both), and a load that ran that long would likely run as long again.
4. Once none of its loads is under way, on a later pass, each dropped model whose
   requests in flight on that server are 0 in an observation taken after it left
   routing, or that left routing `[leases] drain_timeout_s` ago (a return's drain rule),
   is unloaded (`unload_model`).

Crash-safe: each pass compares each serving lease's models (the store's) with what its
server holds READY, so a placement half done is finished by the next pass, however it
was interrupted (loads asked again, dropped models kept out of routing then unloaded). A
load in flight in a process that died is not asked twice: before each ask the server's
index is read, and a model it shows LOADING is waited for as if asked (its load time not
recorded); one it does not show loading is asked again (Triton's load of a loaded,
unchanged model answers at once, and loads nothing). A dropped model waits out its
drain again after a restart (when this process first published without it). Errors are
data: a transient Triton error is retried after the lease's backoff; a load Triton
refuses undoes the placement (the lease's models become those it still holds; a lease
left with none fails and is cleaned up).

The ask threads are daemon threads: stopping the daemon never waits for a load (the
thread is abandoned; the next process finds the load as above). `close` lets them go.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from bridge.daemon.actuator import Actuator, record_of
from bridge.daemon.observation import Observation
from bridge.daemon.placement import (
    Load,
    PlacementPlan,
    Verdict,
    asks,
    change,
    check_place,
    dropped,
    gained,
    judge_load,
    plan_placement,
)
from bridge.daemon.planner import LeaseRecord, Move, Settings
from bridge.daemon.report import TickReport
from bridge.leases.errors import LeaseError
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState
from bridge.policy import Place
from bridge.routing.errors import RoutingError
from bridge.triton.errors import TritonError, TritonUnreachable
from bridge.triton.protocol import TritonInstance

S = LeaseState
T = TypeVar("T")

#: at most this many loads are asked at once (the others wait their turn, in flight)
ASK_THREADS = 4


class LoadFailed(Exception):
    """A load that ended with no refusal from its call: Triton's index shows it
    UNAVAILABLE (its ask went unanswered), or it is still under way past `[leases]
    model_load_timeout_s`. Permanent: the placement is undone."""

    transient = False


@dataclass(frozen=True)
class _Answer:
    """How one ask's call ended: when it began and answered (the placer's clock), and the
    Triton error, if any."""

    began_at: float
    answered_at: float
    error: TritonError | None = None


@dataclass
class _UnderWay:
    """One load this process asked (or found Triton running) and has not seen end."""

    lease_id: int
    node: str
    job: str
    address: str
    #: as the pure rules see it (`placement.judge_load`)
    load: Load
    #: the ask's call (None: answered and taken in, or found loading: nothing asked)
    call: Future[_Answer] | None = None


class Placer:
    def __init__(
        self,
        actuator: Actuator,
        store: LeaseStore,
        settings: Settings,
        gained_at: Callable[[Sequence[str], float], None] | None = None,
        loaded: Callable[[str, float, datetime], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.actuator = actuator
        self.store = store
        self.settings = settings
        #: told the models a placement gives a replica, and when (the cooldown's anchor)
        self.gained_at = gained_at
        #: told each model a placement loaded and its seconds from the ask to the answer
        #: (the model's load time: `bridge.daemon.loadtimes`)
        self.loaded = loaded
        #: the loads' clock (seconds): their times, the timeout
        self.clock = clock
        #: the loads under way, by (Triton job id, model)
        self.under_way: dict[tuple[str, str], _UnderWay] = {}
        self._asks = _Asks(ASK_THREADS)

    def close(self) -> None:
        """Cancel the asks not begun; a load in flight is abandoned (its thread ends with
        its call, or with the process)."""
        self._asks.close()

    def settle(self, timeout_s: float = 10.0) -> bool:
        """Wait until every ask's call under way has answered (for tools and tests; the
        pass never waits). False if one still runs after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for u in list(self.under_way.values()):
            call = u.call
            if call is None:
                continue
            try:
                call.exception(timeout=max(0.0, deadline - time.monotonic()))
            except CancelledError:
                continue
            except TimeoutError:
                return False
        return True

    def place(self, action: Place, obs: Observation, now: datetime, report: TickReport) -> str:
        """Record and begin one placement; the outcome's text ("refused: ..." when it may
        not go)."""
        act = self.actuator
        lease = act.leases.get(action.lease_id)
        if lease is None:
            try:
                lease = record_of(self.store.get(action.lease_id))
            except LeaseError:
                lease = None
        models = tuple(action.models)
        refused = check_place(lease, action.lease_id, models, obs.models.names)
        if refused is not None or lease is None:
            return refused or f"refused: no lease with id {action.lease_id}"
        if sorted(lease.models) == sorted(models):  # or this very request, taken again
            return f"lease {lease.id} on {lease.node} holds {','.join(models)}"
        try:
            stored, old = self.store.place(lease.id, models, now, action.reason)
        except (LeaseError, ValueError) as exc:
            report.error("place", exc, lease.id)
            return f"failed: {exc}"
        after = record_of(stored)
        act.leases[after.id] = after
        report.events.append(
            f"place lease {after.id} on {after.node}: {change(old, models)}: {action.reason}"
        )
        if self.gained_at is not None:
            self.gained_at([m for m in models if m not in old], now.timestamp())
        try:  # the dropped models out of routing now (every later publish too)
            act.route(report)
        except RoutingError as exc:  # the pass's own publish tries again
            report.error("route", exc, after.id)
        server = obs.server_of(after.slurm_job_id)
        if server is not None and server.ready:
            self._carry(after, plan_placement(after, server, {}, obs.at, 0.0), now, report)
        return f"lease {after.id} placing {','.join(models)} on {after.node}"

    def sync(self, obs: Observation, now: datetime, report: TickReport) -> None:
        """The loads under way taken in (ended, refused, timed out, or said to be under
        way); then each serving lease's replica made to hold its lease's models: the
        placements begun on an earlier pass (or by a process that died) carried on."""
        loaded = self._take_in(obs, now, report)
        act = self.actuator
        waits = act.not_before()
        for lease in act.open_leases():
            if lease.state != S.SERVING or waits.get(lease.id, 0.0) > obs.at:
                continue
            server = obs.server_of(lease.slurm_job_id)
            if server is None or not server.ready:
                continue
            just = loaded.get(lease.slurm_job_id or "")
            if just:  # loaded since this pass's observation: held, not to be asked again
                server = replace(server, models=tuple(sorted({*server.models, *just})))
            if not gained(lease, server.models) and not dropped(lease, server.models):
                continue
            placed = self.store.placed_at(lease.id) is not None  # rare: a read then
            job = lease.slurm_job_id
            out_since = {m: t for (j, m), t in act.withheld_since.items() if j == job}
            plan = plan_placement(
                lease, server, out_since, obs.at, self.settings.drain_timeout_s, placed=placed
            )
            self._carry(lease, plan, now, report)

    # ---- the loads under way --------------------------------------------------------

    def _take_in(self, obs: Observation, now: datetime, report: TickReport) -> dict[str, set[str]]:
        """Each load under way judged (`placement.judge_load`) and acted on; the refused
        and timed-out ones undone, per lease, once its server is seen ready. Returns, per
        Triton job, the models found loaded (this pass's observation predates them)."""
        loaded: dict[str, set[str]] = {}
        act = self.actuator
        timeout_s = act.config.leases.model_load_timeout_s
        clock = self.clock()
        states: dict[str, dict[str, tuple[str, str]] | None] = {}
        undo: dict[int, dict[str, str]] = {}
        for key, u in sorted(self.under_way.items()):
            lease = act.leases.get(u.lease_id)
            server = obs.server_of(u.job)
            if lease is None or lease.state != S.SERVING or server is None:
                del self.under_way[key]  # its lease left serving, or its server is gone
                continue
            err: TritonError | None = None
            call = u.call
            if call is not None and call.done():
                u.call = None
                if call.cancelled() or call.exception() is not None:
                    del self.under_way[key]  # closed, or a bug (raised for the pass to say)
                    if call.cancelled():
                        continue
                    raise call.exception()  # type: ignore[misc]
                answer = call.result()
                err = answer.error
                u.load = _answered(u.load, answer)
            load = u.load
            state: str | None = None
            if not load.running and load.answer not in ("loaded", "refused"):
                if load.model in server.models:
                    state = "READY"
                else:  # no answer came, or a dead process asked: Triton's index says
                    index = self._index(u.address, states)
                    state, reason = (None, "") if index is None else index.get(load.model, ("", ""))
                    if state == "UNAVAILABLE":
                        u.load = load = replace(load, message=reason or state)
            out = judge_load(load, state, clock, timeout_s, server_ready=server.ready)
            where = f"lease {u.lease_id} {u.node}"
            if out.verdict == Verdict.LOADING:
                line = f"{where}: loading {load.model} for {out.seconds or 0.0:.0f}s"
                if not load.asked:
                    line += " (asked before this daemon started)"
                elif not load.running:
                    line += " (its ask went unanswered: Triton's index polled)"
                report.events.append(line)
                continue
            if out.verdict == Verdict.WAIT:
                report.events.append(
                    f"{where}: the placement of {load.model} is undone once its server "
                    f"answers ready ({out.why})"
                )
                continue
            del self.under_way[key]
            if out.verdict == Verdict.LOADED:
                loaded.setdefault(u.job, set()).add(load.model)
                act.backoff.pop(u.lease_id, None)
                if out.seconds is None:
                    report.events.append(f"{where}: {load.model} loaded (placement)")
                else:
                    if self.loaded is not None:
                        self.loaded(load.model, out.seconds, now)
                    report.events.append(
                        f"{where}: loaded {load.model} in {out.seconds:.1f}s (placement)"
                    )
                holds = {*server.models, load.model}
                if (
                    not any(v.lease_id == u.lease_id for v in self.under_way.values())
                    and not gained(lease, holds)
                    and not dropped(lease, holds)
                ):
                    report.events.append(f"{where}: placement done, holds {','.join(lease.models)}")
            elif out.verdict == Verdict.RETRY:
                if load.asked:  # its ask was lost: asked again after the lease's backoff
                    lost = err or TritonUnreachable(u.address, f"load {load.model!r}", out.why)
                    report.error("load", lost, u.lease_id)
                    act.retry_later(u.lease_id, now)
            else:  # refused, or timed out: undone
                said = err or LoadFailed(f"load {load.model!r} on Triton {u.address}: {out.why}")
                report.error("load", said, u.lease_id)
                if load.model in lease.models:
                    undo.setdefault(u.lease_id, {})[load.model] = out.why
        for lease_id, refused in sorted(undo.items()):
            lease = act.leases[lease_id]
            server = obs.server_of(lease.slurm_job_id)
            still_held = dropped(lease, server.models) if server is not None else ()
            self._undo(lease, refused, still_held, now, report)
        return loaded

    def _index(
        self, address: str, seen: dict[str, dict[str, tuple[str, str]] | None]
    ) -> dict[str, tuple[str, str]] | None:
        """Triton's repository index of `address` (model -> (state, reason)), read once a
        pass; None when it does not answer."""
        if address not in seen:
            try:
                index = self.actuator.triton_for(address).repository_index()
            except TritonError:
                seen[address] = None
            else:
                seen[address] = {m.name: (m.state, m.reason) for m in index}
        return seen[address]

    def _ask(self, lease: LeaseRecord, address: str, models: Sequence[str]) -> None:
        """Ask each of `models` loaded on its own thread; the pass goes on. Then this
        daemon's connections to the server are let go: Triton serves each connection on
        the HTTP thread that took it, and a load holds that thread until it ends, so a
        connection kept alive from before the ask can go unanswered as long as the load
        runs (seen on the lab: every one made before the ask, none made after it); the
        next pass's reads open new ones."""
        if not models:
            return
        assert lease.slurm_job_id is not None
        act = self.actuator
        triton_for, clock = act.triton_for, self.clock
        for m in models:
            call = self._asks.submit(partial(_load, triton_for, address, m, clock))
            self.under_way[(lease.slurm_job_id, m)] = _UnderWay(
                lease.id, lease.node, lease.slurm_job_id, address, Load(m, clock()), call
            )
        if act.forget_triton is not None:
            act.forget_triton(address)

    # ---- one lease's replica ----------------------------------------------------------

    def _carry(
        self, lease: LeaseRecord, plan: PlacementPlan | None, now: datetime, report: TickReport
    ) -> None:
        """Ask the loads `plan` needs; once none is under way, the unloads it allows."""
        if plan is None or not (plan.load or plan.unload) or lease.slurm_job_id is None:
            return
        act = self.actuator
        job = lease.slurm_job_id
        if plan.load:
            busy = {m for (j, m) in self.under_way if j == job}
            new = [m for m in plan.load if m not in busy]
            if new:
                try:  # a model Triton loads already (asked by a process that died) is
                    # waited for, not asked again
                    index = act.triton_for(plan.address).repository_index()
                except TritonError as exc:
                    if report.error("load", exc, lease.id).kind == "transient":
                        act.retry_later(lease.id, now)
                    return
                ask, loading = asks(new, busy, {m.name: m.state for m in index})
                self._ask(lease, plan.address, ask)
                for m in loading:
                    self.under_way[(job, m)] = _UnderWay(
                        lease.id, lease.node, job, plan.address, Load(m, self.clock(), False, False)
                    )
                if ask:
                    report.events.append(
                        f"lease {lease.id} {lease.node}: asked Triton to load {','.join(ask)} "
                        "(placement)"
                    )
                if loading:
                    report.events.append(
                        f"lease {lease.id} {lease.node}: Triton loads {','.join(loading)} "
                        "already (asked before this daemon started): waited for"
                    )
            return  # the dropped models are unloaded once the gained ones are loaded
        client = act.triton_for(plan.address)
        for m in plan.unload:
            try:
                client.unload_model(m)
            except TritonError as exc:
                report.error("unload", exc, lease.id)
                act.retry_later(lease.id, now)
                return
        if plan.unload:
            report.events.append(
                f"lease {lease.id} {lease.node}: unloaded {','.join(plan.unload)} "
                f"(placement; {plan.why})"
            )
        act.backoff.pop(lease.id, None)
        if not plan.waiting:
            report.events.append(
                f"lease {lease.id} {lease.node}: placement done, holds {','.join(lease.models)}"
            )

    def _undo(
        self,
        lease: LeaseRecord,
        refused: dict[str, str],
        still_held: Sequence[str],
        now: datetime,
        report: TickReport,
    ) -> None:
        """Triton refused to load `refused`: the lease's models become those its replica
        can hold (the others it lists, and the dropped ones it still holds, back in
        routing); a lease left with none fails (and is cleaned up as any failed lease)."""
        why = "; ".join(f"{m}: {r}" for m, r in sorted(refused.items()))
        keep = [m for m in lease.models if m not in refused] + [
            m for m in still_held if m not in lease.models
        ]
        act = self.actuator
        try:
            if not keep:
                act.apply(
                    Move(lease.id, S.SERVING, S.FAILED, f"placement: Triton refused to load {why}"),
                    now,
                    report,
                )
                return
            stored, old = self.store.place(
                lease.id, keep, now, f"undone: Triton refused to load {why}"
            )
        except LeaseError as exc:
            report.error("store", exc, lease.id)
            return
        after = record_of(stored)
        act.leases[after.id] = after
        report.events.append(
            f"place lease {after.id} on {after.node} undone: {change(old, keep)}: "
            f"Triton refused to load {why}"
        )


def _load(
    triton_for: Callable[[str], TritonInstance],
    address: str,
    model: str,
    clock: Callable[[], float],
) -> _Answer:
    """One ask, on an ask thread: Triton's `load_model`, timed (its client is this
    thread's: `bridge.daemon.clients`)."""
    began = clock()
    try:
        triton_for(address).load_model(model)
    except TritonError as exc:
        return _Answer(began, clock(), exc)
    return _Answer(began, clock())


def _answered(load: Load, answer: _Answer) -> Load:
    """`load` with its call's answer."""
    err = answer.error
    word = "loaded" if err is None else "unanswered" if err.transient else "refused"
    return replace(
        load,
        running=False,
        answer=word,
        began_at=answer.began_at,
        answered_at=answer.answered_at,
        message="" if err is None else str(err),
    )


class _Asks:
    """The asks' threads: up to `size` daemon threads, started as asks come; an ask waits
    for a free one (it is in flight meanwhile). Daemon threads, not an executor's: the
    interpreter's exit joins an executor's threads, and would wait for a load."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            self._jobs.put((future, fn))
            if len(self._threads) < self._size:
                t = threading.Thread(
                    target=self._work, name=f"stb-load-{len(self._threads)}", daemon=True
                )
                t.start()
                self._threads.append(t)
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # a bug: raised again where the answer is taken
                future.set_exception(exc)
            else:
                future.set_result(result)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            for _ in self._threads:
                self._jobs.put(None)


__all__ = ["LoadFailed", "Placer"]
