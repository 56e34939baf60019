"""The rollout driver: each tick, carries every open gradual rollout (`bridge.leases.rollouts`)
one move further, judging the new version against the old with the pure
`bridge.policy.rollout.judge` on their figures over the step so far.

Called by the reconciler after the lease work of a pass and before its routing; the
routing of every pass (the standby's too) takes the splits from `splits()`, read from the
store, so what nginx does follows the stored state and nothing else:

| state        | unversioned requests of the model        | the driver's move              |
|--------------|------------------------------------------|--------------------------------|
| pending      | all to the old version                   | route, load both; -> running   |
|              |                                          | once seen holding both         |
| running k    | step k's share to the new version        | judge: hold, next step,        |
|              |                                          | -> promoting or -> rolling_back |
| promoting    | all to the new version                   | route, new alone, -> promoted  |
| rolling_back | all to the old version                   | route, old alone, -> rolled_back |

Each move is stored before it is carried out, routing moves before Triton unloads a
version, and each carrying out (`bridge.models.rollout`) is idempotent: a daemon killed at
any point does the rest after its restart, from the stored step, whose clock (its hold)
keeps running. The figures are the two versions' requests and failures since the step
began, from each holding server's metrics page (read here, whatever `[observe] source`),
counted from the values read at the tick that began the step (a restarted daemon counts
afresh, from its first reading); the p99 is the largest over the servers of Triton's
60 s summary. A Triton error in a move is reported and the move retried next tick.

A replica that joins while a rollout runs (a lend) starts from the repository's config,
which names both versions; one that holds only one of them is left out of the model's
routing (`bridge.daemon.actuator`) until the driver has loaded both there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bridge.audit.trail import AuditError, Trail, daemon
from bridge.config import BridgeConfig
from bridge.daemon.observation import Observation
from bridge.daemon.report import TickReport
from bridge.leases.audit import AuditStore
from bridge.leases.rollouts import Rollout, RolloutStore, State
from bridge.models import rollout as steps
from bridge.models.publish import PublishError, Server
from bridge.models.repo import ModelRepository, RepositoryError
from bridge.policy.rollout import Judgement, Step, Thresholds, VersionFigures, judge, parse_plan
from bridge.routing.errors import RoutingError
from bridge.routing.table import Split
from bridge.triton.errors import TritonError
from bridge.triton.metrics import parse_page
from bridge.triton.protocol import TritonInstance

log = logging.getLogger(__name__)
#: a move that meets one of these is reported and tried again next tick (an audit entry
#: that cannot be written is reported so; the stored move it records stands)
_ERRORS = (TritonError, PublishError, RepositoryError, RoutingError, OSError, AuditError)
#: the audit trail's action for a move into each state
_AUDIT: dict[str, str] = {
    "running": "rollout.step",
    "promoting": "rollout.promote",
    "rolling_back": "rollout.rollback",
    "promoted": "rollout.end",
    "rolled_back": "rollout.end",
}


def share(row: Rollout) -> float:
    """The share of unversioned requests the new version gets in the rollout's state."""
    if row.state == "running":
        return parse_plan(row.plan, row.hold_s)[row.step].percent
    return 100.0 if row.state == "promoting" else 0.0


@dataclass
class _Counts:
    """One step's counters: per (server, version), the (success, failure) first seen."""

    step: int = -1
    base: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    #: the values read this tick: the next step's baseline when this tick advances
    seen: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)


class RolloutDriver:
    def __init__(
        self,
        config: BridgeConfig,
        store: RolloutStore,
        triton_for: Callable[[str], TritonInstance],
        repo: ModelRepository | None = None,
        audit: Trail | None = None,
    ) -> None:
        """`audit`: where each move is recorded (None: beside `store`, behind its fence,
        as `daemon@host`)."""
        self.store = store
        self.audit = audit or Trail(AuditStore.beside(store), daemon())
        self.repo = repo or ModelRepository(config.triton.model_repository)
        self.triton_for = triton_for
        r = config.rollout
        self.limits = Thresholds(
            min_requests=r.min_requests, p99_margin=r.p99_margin, p99_floor_ms=r.p99_floor_ms
        )
        self._counts: dict[int, _Counts] = {}
        #: each open rollout's last verdict (this process's only: not stored)
        self.last: dict[int, Judgement] = {}

    def splits(self) -> list[Split]:
        """The traffic split of every open rollout, as stored now."""
        return [
            Split(r.model, r.old_version, r.new_version, share(r))
            for r in self.store.open_rollouts()
        ]

    def tick(
        self,
        obs: Observation,
        slo_of: Callable[[str], float | None],
        now: datetime,
        report: TickReport,
        route: Callable[[], None],
    ) -> None:
        """One move for each open rollout; `route` publishes the stored splits (in effect
        when it returns)."""
        rows = self.store.open_rollouts()
        for row in rows:
            holders = [s for s in obs.servers if s.ready and row.model in s.models]
            servers = [Server(s.address, self.triton_for(s.address)) for s in holders]
            both = {str(row.old_version), str(row.new_version)}
            lacking = [s.address for s in holders if not both <= set(s.versions.get(row.model, ()))]
            try:
                self._move(row, servers, lacking, slo_of(row.model), now, route)
            except _ERRORS as exc:
                report.error(f"rollout {row.model}", exc)
        for gone in set(self._counts) - {r.id for r in rows}:  # ended by an earlier tick
            self._counts.pop(gone, None)
            self.last.pop(gone, None)

    def _move(
        self,
        row: Rollout,
        servers: Sequence[Server],
        lacking: Sequence[str],
        slo_ms: float | None,
        now: datetime,
        route: Callable[[], None],
    ) -> None:
        """`lacking`: the holders that this tick's observation shows without both
        versions (the split's routing leaves them out)."""
        assert row.id is not None
        rid = row.id
        if row.state == "pending":
            if not lacking and servers:  # seen holding both: the split may start
                where = ", ".join(s.address for s in servers)
                self._step(row, "running", now, f"both versions on {where}", step=0)
                return
            route()  # every unversioned request to the old version before the new loads
            try:
                steps.activate(self.repo, row, servers, log.info)
            except (TritonError, PublishError) as exc:
                why = f"version {row.new_version} did not load and answer: {exc}"
                row = self._step(row, "rolling_back", now, why)
                self._finish(row, servers, now, route, promote=False)
            return
        if row.state == "running" and lacking:
            # A replica that started, or reloaded, with one version only (a lend: it
            # takes no split request meanwhile) loads both; the step goes on.
            for s in servers:
                if s.address in lacking:
                    s.client.load_model(row.model)
                    log.info("%s: both versions loaded on %s", row.model, s.address)
        if row.state == "promoting":
            self._finish(row, servers, now, route, promote=True)
            return
        if row.state == "rolling_back":
            self._finish(row, servers, now, route, promote=False)
            return
        plan = parse_plan(row.plan, row.hold_s)
        step = plan[row.step]
        new, old = self._figures(row, servers)
        started = row.step_started_at or now
        held_s = (now - started).total_seconds()
        verdict = judge(new, old, slo_ms if slo_ms is not None else float("inf"), held_s, step,
                        self.limits)  # fmt: skip
        self.last[rid] = verdict
        if verdict.verdict == "hold":
            return
        figures = _figures_json(new, old, held_s, step)
        if verdict.verdict == "rollback":
            why = f"rolled back at {step.percent:g}%: {verdict.why}"
            row = self._step(row, "rolling_back", now, why, figures=figures)
            log.warning("%s version %d %s", row.model, row.new_version, why)
            self._finish(row, servers, now, route, promote=False)
        elif row.step + 1 < len(plan):
            nxt = plan[row.step + 1]
            counts = self._counts[rid]  # the next step counts from what this tick read
            counts.step, counts.base = row.step + 1, dict(counts.seen)
            self._step(
                row, "running", now,
                f"{nxt.percent:g}% after {verdict.why}", step=row.step + 1, figures=figures,
            )  # fmt: skip
        else:
            row = self._step(row, "promoting", now, f"promoted: {verdict.why}",
                                  figures=figures)  # fmt: skip
            self._finish(row, servers, now, route, promote=True)

    def _step(
        self,
        row: Rollout,
        state: State,
        now: datetime,
        reason: str,
        *,
        step: int | None = None,
        figures: dict[str, Any] | None = None,
    ) -> Rollout:
        """`RolloutStore.move` of `row`, its audit entry written with it."""
        assert row.id is not None
        target = f"model {row.model} version {row.new_version}"
        audit = self.audit.within(_AUDIT[state], target, reason)
        return self.store.move(row.id, state, now, reason, step=step, figures=figures, audit=audit)

    def _finish(
        self,
        row: Rollout,
        servers: Sequence[Server],
        now: datetime,
        route: Callable[[], None],
        *,
        promote: bool,
    ) -> None:
        """The rollout's end: the new version serves alone (`promote`), or the old one
        does, and the rollout is recorded as ended so."""
        assert row.id is not None
        end: State = "promoted" if promote else "rolled_back"
        finish = steps.promote if promote else steps.abandon
        route()  # every unversioned request to the version that stays before the other unloads
        finish(self.repo, row, servers, row.reason)
        self._step(row, end, now, row.reason)
        if promote:
            log.info("%s version %d %s", row.model, row.new_version, row.reason)

    def _figures(
        self, row: Rollout, servers: Sequence[Server]
    ) -> tuple[VersionFigures, VersionFigures]:
        """The new and the old version's figures over the step (see the module)."""
        assert row.id is not None
        counts = self._counts.setdefault(row.id, _Counts())
        if counts.step != row.step:
            counts.step, counts.base = row.step, {}
        counts.seen = {}
        totals = {row.new_version: [0.0, 0.0], row.old_version: [0.0, 0.0]}
        p99: dict[int, float | None] = {row.new_version: None, row.old_version: None}
        for s in servers:
            try:
                page = parse_page(s.client.metrics_text())
            except TritonError:
                continue
            for version in totals:
                sample = page.models.get((row.model, str(version)))
                if sample is None:
                    continue
                ok, bad = sample.request_success or 0.0, sample.request_failure or 0.0
                counts.seen[(s.address, version)] = (ok, bad)
                base_ok, base_bad = counts.base.setdefault((s.address, version), (ok, bad))
                if ok < base_ok or bad < base_bad:  # the server reloaded it: from zero
                    base_ok, base_bad = counts.base[(s.address, version)] = (0.0, 0.0)
                totals[version][0] += ok - base_ok
                totals[version][1] += bad - base_bad
                q = sample.request_summary.quantile(0.99) if sample.request_summary else None
                if q is not None:
                    p99[version] = max(p99[version] or 0.0, q / 1000.0)

        def of(version: int) -> VersionFigures:
            ok, bad = totals[version]
            return VersionFigures(int(ok + bad), int(bad), p99[version])

        return of(row.new_version), of(row.old_version)


def _figures_json(
    new: VersionFigures, old: VersionFigures, held_s: float, step: Step
) -> dict[str, object]:
    def one(f: VersionFigures) -> dict[str, object]:
        return {"requests": f.requests, "failures": f.failures, "p99_ms": f.p99_ms}

    return {"new": one(new), "old": one(old), "held_s": round(held_s, 1), "share": step.percent}


__all__ = ["RolloutDriver", "share"]
