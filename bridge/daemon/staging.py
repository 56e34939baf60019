"""The daemon's staging step (issue 31): keeps the lendable nodes' weight caches holding
the versions the bridge expects to lend for, as low-priority Slurm jobs. Thin: the plan
is pure (`bridge.policy.staging.wanted`, `bridge.policy.weights.plan_cache`), the job is
`bridge.slurm.staging`'s, the catalogue `bridge.leases.weights.WeightStore`'s.

Once every `[weights] plan_every_s`, on the leader's pass after its actions:

1. Each copy the catalogue has `staging` is looked up among the staging jobs Slurm lists
   (`stb:staging`): COMPLETED makes it `complete` (its size and digest the staging
   source's manifest of the version, `[weights] source` or the model repository, which
   the job verified the copy against);
   FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE or PREEMPTED
   (not requeued) make it `failed` with the state; a job Slurm no longer lists (past
   `MinJobAge`) makes it `failed` ("outcome not seen"), and the next plan stages it
   again (a stage of a copy already in place verifies it and ends).
2. The lendable nodes in the order lends of the wanted models would take them
   (`weights.lend_places`; new copies only on nodes of preempt-mode pools not lent now,
   `bridge.policy.staging.stages_on`: never a training node, where a staging job could
   delay a training job that wants the whole node), each with its budget
   (`[weights] budget_bytes`) and the copies the catalogue has staging or complete
   there, and the wanted versions (`bridge.policy.staging.wanted` at each model's
   highest rate the daemon keeps, up to a day; the model repository's newest version,
   its size by the source's manifest) make the cache plan; its stages, up to
   `[weights] max_jobs` staging jobs at once, are submitted and opened in the catalogue
   (`begin`, with the job id).

3. A copy the catalogue has `complete` on a node whose serving lease says it read that
   model from the shared repository (the move to serving's "weights: m=shared": the
   Triton job refused the copy, or did not find it) is made `failed` with that reason,
   so the plan stages it again where it is still wanted.

`cached()` is what the policy reads (`NodeView.cached`, put on the pass's snapshot by
`onto`): per node, the models whose newest version has a complete copy there. A Triton
job verifies a copy again before it uses it (`bridge.weights.overlay`), so a catalogue
row that is out of date (a copy removed by hand, a disk wiped) costs a load from the
shared repository, never a wrong model. The plan's evictions are carried out by the
staging job they make room for (`--evict`, before its copy; the catalogue's rows say
`evicted` from its submission), and the stage program refuses a copy past the node's
budget.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from bridge.config import BridgeConfig
from bridge.daemon.report import TickReport
from bridge.leases.errors import LeaseError
from bridge.leases.weights import WeightStore, WeightStoreError
from bridge.lifecycle import LeaseState
from bridge.models.repo import ModelRepository
from bridge.policy.snapshot import LeaseView, Snapshot
from bridge.policy.staging import stages_on, wanted
from bridge.policy.weights import CachedCopy, NodeCache, lend_places, plan_cache
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import STAGING_TAG, Job
from bridge.slurm.protocol import SlurmProtocol
from bridge.slurm.staging import staging_job, submit_staging
from bridge.weights import overlay
from bridge.weights.stage import StageError, source_manifest

log = logging.getLogger(__name__)

#: the peak rates the plan stages for: each model's highest over this long (as far as
#: the daemon keeps them, `policy.return_dwell_max_s`)
PEAK_WINDOW_S = 86400.0

#: Slurm states in which a staging job has ended without its copy
FAILED_STATES = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
     "DEADLINE", "PREEMPTED"}
)  # fmt: skip


class Stager:
    """The staging step of one daemon (the module docstring)."""

    def __init__(self, config: BridgeConfig, slurm: SlurmProtocol, store: WeightStore) -> None:
        if config.weights.cache_root is None:
            raise ValueError("weights.cache_root is not set: there is no cache to stage into")
        self.config = config
        self.slurm = slurm
        self.store = store
        self.repo = ModelRepository(config.triton.model_repository)
        self._planned_at: float | None = None
        #: per (model, version), its (size, digest) by the source's manifest, read once
        #: (None: none could be read; a published version's manifest never changes)
        self._manifests: dict[tuple[str, int], tuple[int, str] | None] = {}
        self._cached: dict[str, frozenset[str]] = {}

    def cached(self) -> dict[str, frozenset[str]]:
        """Per node, the models whose newest version has a complete copy there (as of
        the last plan)."""
        return dict(self._cached)

    def onto(self, snap: Snapshot, local_load_s: Mapping[str, float]) -> Snapshot:
        """`snap` with each node's cached models (`cached`) and the models' load times
        from a node's cache (`bridge.daemon.loadtimes.LoadTimes.local_load_s`): what
        the policy reads of the caches."""
        nodes = tuple(replace(n, cached=self._cached.get(n.name, frozenset())) for n in snap.nodes)
        return replace(snap, nodes=nodes, local_load_s=dict(local_load_s))

    def tick(
        self, snap: Snapshot, leases: Sequence[LeaseView], now: datetime, report: TickReport
    ) -> None:
        t = now.timestamp()
        if self._planned_at is not None and t - self._planned_at < self.config.weights.plan_every_s:
            return
        self._planned_at = t
        try:
            versions = self._versions(snap)
            self._poll(versions, now, report)
            self._refused(leases, versions, now, report)
            self._plan(snap, versions, now, report)
            self._cached = self._complete(versions)
        except (SlurmError, WeightStoreError, LeaseError, SQLAlchemyError, StageError) as exc:
            report.error("stage", exc)

    # ---- the steps --------------------------------------------------------------------

    def _versions(self, snap: Snapshot) -> dict[str, tuple[int, int]]:
        """Per model the policy scales, its newest version and that version's size (its
        manifest's; a version without a manifest is left out, logged once)."""
        out: dict[str, tuple[int, int]] = {}
        for model in snap.models:
            version = self.repo.latest(model)
            if version is None:
                continue
            key = (model, version)
            if key not in self._manifests:
                try:
                    self._manifests[key] = self._shared(model, version)
                except StageError as exc:
                    log.warning("%s version %s is not staged: %s", model, version, exc)
                    self._manifests[key] = None
            found = self._manifests[key]
            if found is not None:
                out[model] = (version, found[0])
        return out

    def _poll(
        self, versions: dict[str, tuple[int, int]], now: datetime, report: TickReport
    ) -> None:
        staging = self.store.copies(states=("staging",))
        if not staging:
            return
        jobs: dict[str, Job] = {j.job_id: j for j in self.slurm.jobs(tag=STAGING_TAG)}
        for row in staging:
            if not row.job_id:
                continue  # staged by hand (`stb weights stage`): its caller finishes it
            job = jobs.get(row.job_id)
            state = job.state.upper() if job is not None else None
            where = f"{row.model} version {row.version} on {row.node}"
            if state == "COMPLETED":
                size, digest = self._shared(row.model, row.version)
                self.store.finish(row.node, row.model, row.version, size, digest, now)
                report.events.append(f"staged {where} (job {row.job_id})")
            elif state is None or state in FAILED_STATES:
                why = f"staging job {row.job_id} " + (
                    state.lower() if state else "left the queue; its outcome was not seen"
                )
                self.store.fail(row.node, row.model, row.version, why, now)
                report.events.append(f"staging of {where} failed: {why}")

    def _refused(
        self,
        leases: Sequence[LeaseView],
        versions: dict[str, tuple[int, int]],
        now: datetime,
        report: TickReport,
    ) -> None:
        complete = {(r.node, r.model, r.version) for r in self.store.copies(states=("complete",))}
        for lease in leases:
            if lease.state != LeaseState.SERVING:
                continue
            for model, source in overlay.from_reason(lease.reason).items():
                newest = versions.get(model)
                if source != "shared" or newest is None:
                    continue
                if (lease.node, model, newest[0]) not in complete:
                    continue
                why = f"the Triton job of lease {lease.id} read the shared repository instead"
                self.store.fail(lease.node, model, newest[0], why, now)
                report.events.append(f"copy of {model} version {newest[0]} on {lease.node}: {why}")

    def _shared(self, model: str, version: int) -> tuple[int, str]:
        """The version's size and digest as the staging source's manifest says (read
        once a version)."""
        known = self._manifests.get((model, version))
        if known is not None:
            return known
        found = source_manifest(self._source(), model, version)
        self._manifests[(model, version)] = (found.total_bytes, found.digest)
        return found.total_bytes, found.digest

    def _source(self) -> str:
        return self.config.weights.source or str(self.config.triton.model_repository)

    def _plan(
        self,
        snap: Snapshot,
        versions: dict[str, tuple[int, int]],
        now: datetime,
        report: TickReport,
    ) -> None:
        cfg = self.config.weights
        assert cfg.cache_root is not None
        rows = self.store.copies(states=("staging", "complete"))
        in_flight = sum(1 for r in rows if r.state == "staging")
        room = cfg.max_jobs - in_flight
        if room <= 0:
            return
        t = now.timestamp()
        peaks = {m: p.highest_since(t - PEAK_WINDOW_S) for m, p in snap.peaks.items()}
        sizes = {m: (str(v), size) for m, (v, size) in versions.items()}
        want = wanted(snap, self.config, peaks, sizes)
        if not want:
            return
        order, only = lend_places(snap, self.config, t, [w.model for w in want])
        caches = [
            NodeCache(
                n.name,
                cfg.budget_bytes if stages_on(self.config, snap, n) else 0,
                tuple(
                    CachedCopy(
                        r.model,
                        str(r.version),
                        r.size_bytes or versions.get(r.model, (0, 0))[1],
                        complete=r.state == "complete",
                        last_used=(r.verified_at or r.staged_at or r.updated_at).timestamp(),
                    )
                    for r in rows
                    if r.node == n.name
                ),
            )
            for n in order
        ]
        plan = plan_cache(caches, want, max_staging=room, only=only)
        pools = {n.name: n.pool for n in snap.nodes}
        source = self._source()
        victims: dict[str, list[tuple[str, int]]] = {}
        for e in plan.evict:  # carried out by the stage's job on that node, first
            victims.setdefault(e.node, []).append((e.model, int(e.version)))
        for stage in plan.stage:
            evict = tuple(victims.pop(stage.node, ()))
            pool = self.config.pools.get(pools.get(stage.node, ""))
            spec = staging_job(
                cfg,
                node=stage.node,
                model=stage.model,
                version=int(stage.version),
                source=source,
                account=self.config.triton.account,
                partition=pool.partition if pool is not None else None,
                log_dir=self.config.triton.log_dir,
                evict=evict,
            )
            job_id = submit_staging(self.slurm, spec)
            for model, version in evict:
                why = f"room for {stage.model} version {stage.version} (job {job_id})"
                self.store.evict(stage.node, model, version, why, now)
            path = str(cfg.cache_root / stage.model / stage.version)
            self.store.begin(stage.node, stage.model, int(stage.version), path, now, job_id)
            report.events.append(
                f"staging {stage.model} version {stage.version} on {stage.node} "
                f"({stage.size_bytes / 1e9:.2f} GB, job {job_id})"
            )

    def _complete(self, versions: dict[str, tuple[int, int]]) -> dict[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for row in self.store.copies(states=("complete",)):
            newest = versions.get(row.model)
            if newest is not None and newest[0] == row.version:
                out.setdefault(row.node, set()).add(row.model)
        return {node: frozenset(models) for node, models in out.items()}


__all__ = ["FAILED_STATES", "Stager"]
