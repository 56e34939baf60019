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
3. Each gained model is loaded (`load_model`, Triton's explicit model control); the next
   pass's observation shows it READY and routing publishes it there by itself. The call's
   seconds are the model's load time (`loaded`: `bridge.daemon.loadtimes`).
4. On a later pass (`sync`), each dropped model whose requests in flight on that server
   are 0 in an observation taken after it left routing, or that left routing
   `[leases] drain_timeout_s` ago (a return's drain rule), is unloaded (`unload_model`).

Crash-safe: each pass compares each serving lease's models (the store's) with what its
server holds READY, so a placement half done is finished by the next pass, however it
was interrupted (loads retried, dropped models kept out of routing then unloaded). A
dropped model waits out its drain again after a restart (when this process first
published without it). Errors are data: a transient Triton error is retried after the
lease's backoff; a load Triton refuses undoes the placement (the lease's models become
those it still holds; a lease left with none fails and is cleaned up).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime

from bridge.daemon.actuator import Actuator, record_of
from bridge.daemon.observation import Observation
from bridge.daemon.placement import (
    PlacementPlan,
    change,
    check_place,
    dropped,
    gained,
    plan_placement,
)
from bridge.daemon.planner import LeaseRecord, Move, Settings
from bridge.daemon.report import TickReport
from bridge.leases.errors import LeaseError
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState
from bridge.policy import Place
from bridge.routing.errors import RoutingError
from bridge.triton.errors import TritonError

S = LeaseState


class Placer:
    def __init__(
        self,
        actuator: Actuator,
        store: LeaseStore,
        settings: Settings,
        gained_at: Callable[[Sequence[str], float], None] | None = None,
        loaded: Callable[[str, float, datetime], None] | None = None,
    ) -> None:
        self.actuator = actuator
        self.store = store
        self.settings = settings
        #: told the models a placement gives a replica, and when (the cooldown's anchor)
        self.gained_at = gained_at
        #: told each model a placement loaded and the seconds its `load_model` took (the
        #: model's load time: `bridge.daemon.loadtimes`)
        self.loaded = loaded

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
        """Each serving lease's replica made to hold its lease's models: the placements
        begun on an earlier pass (or by a process that died) carried on."""
        act = self.actuator
        waits = act.not_before()
        for lease in act.open_leases():
            if lease.state != S.SERVING or waits.get(lease.id, 0.0) > obs.at:
                continue
            server = obs.server_of(lease.slurm_job_id)
            if server is None or not server.ready:
                continue
            if not gained(lease, server.models) and not dropped(lease, server.models):
                continue
            placed = self.store.placed_at(lease.id) is not None  # rare: a read then
            job = lease.slurm_job_id
            out_since = {m: t for (j, m), t in act.withheld_since.items() if j == job}
            plan = plan_placement(
                lease, server, out_since, obs.at, self.settings.drain_timeout_s, placed=placed
            )
            self._carry(lease, plan, now, report)

    def _carry(
        self, lease: LeaseRecord, plan: PlacementPlan | None, now: datetime, report: TickReport
    ) -> None:
        """Load, then unload, as `plan` says."""
        if plan is None or not (plan.load or plan.unload):
            return
        act = self.actuator
        client = act.triton_for(plan.address)
        refused: dict[str, str] = {}
        for m in plan.load:
            began = time.monotonic()
            try:
                client.load_model(m)
            except TritonError as exc:
                if report.error("load", exc, lease.id).kind == "transient":
                    act.retry_later(lease.id, now)
                    return
                refused[m] = str(exc)
                continue
            took = time.monotonic() - began
            if self.loaded is not None:
                self.loaded(m, took, now)
            report.events.append(
                f"lease {lease.id} {lease.node}: loaded {m} in {took:.1f}s (placement)"
            )
        if refused:
            self._undo(lease, refused, (*plan.unload, *plan.waiting), now, report)
            return
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


__all__ = ["Placer"]
