"""The bridge's side of the GPU-hour ledger: builds what `accounting` needs from the
configuration, Slurm, the lease store and the model repository, and runs one ingest.
`stb accounting ingest` and the daemon's scheduled ingest both call `ingest_window`.

- Capacity: from slurmdbd's events (`sacctmgr show event`: the cluster's registered nodes
  over time, each node's down and drain stretches), each node in its pool
  (`observe.pool_of`; a GPU node in no pool under its partition), GPUs from its gres as
  the inventory records them, one line per GPU type (MIG slices of several profiles);
  no registration of the cluster is an error naming the clusters slurmdbd knows. With
  `[accounting] capacity = "inventory"`: the nodes Slurm lists at each ingest (down or
  not responding ones out of service), each from its first observation or first job run.
- Workloads: a pool's partition gets its pool's workload (drain -> training, preempt ->
  elastic, reserved -> inference); `[accounting] workloads` names other partitions.
- Teams: `[accounting] teams` maps accounts; a served model's team is its `stb.team`.
- Leases: the lease tag a lent Triton job carries -> the pool the node was lent from.
- MIG slices and shards: `[accounting.slices]` (`slice_rules`) says the fraction of a GPU
  each books (docs/finance/slices.md).
- Staging: the bridge's staging jobs (weights copied into a node's cache,
  `bridge.slurm.staging`) are booked as workload `staging` when they run in the account
  they are submitted under (`[weights] account`, else `triton.account`): serving's
  overhead, in the pool of the node, under the model they stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from accounting.attribution import Context, ServingPoint
from accounting.batchcounts import prune_batch
from accounting.book import IngestSummary
from accounting.buckets import floor_hour
from accounting.errors import LedgerError
from accounting.ingest import ingest_records
from accounting.inventory import Inventory, NodeCapacity
from accounting.metrics import LedgerCollector
from accounting.samples import prune_serving, record_serving
from accounting.schema import NodeSpan
from accounting.usage import ingest_usage, read_spool
from bridge.config import BridgeConfig, pool_of
from bridge.leases.models import Lease
from bridge.leases.store import LeaseStore
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import LEASE_TAG_PREFIX, AccountingRecord, Node, SlurmEvent, lease_tag
from bridge.slurm.protocol import SlurmProtocol
from bridge.slurm.slices import SliceRules, gres_gpu_parts, unit_share
from bridge.triton.metrics import MetricsPage
from bridge.triton.repository import model_teams

log = logging.getLogger(__name__)

WORKLOAD_OF_MODE = {"drain": "training", "preempt": "elastic", "reserved": "inference"}
_OUT_OF_SERVICE = ("down", "fail", "future", "unknown", "inval")
#: the longest stretch one sacct call covers: a long backfill runs in steps, with progress
SACCT_STEP = timedelta(days=1)


def ledger_pool(node: Node, config: BridgeConfig) -> str | None:
    """The pool the ledger books a node's capacity to: its configured pool, else its
    first partition (where its jobs book too: `attribution` falls back to a run's
    partition), None for a node in no partition."""
    return pool_of(node, config) or (node.partitions[0] if node.partitions else None)


def gpu_types(node: Node) -> dict[str, int]:
    """GPU type -> count of a node: every type its gres names (MIG slices of several
    profiles: `gpu:h100_4g.40gb:1,gpu:h100_1g.10gb:2`), untyped GPUs as its `gpu_type`
    (else "gpu"); from the count alone where the source gives no gres."""
    parts = gres_gpu_parts(node.gres) if node.gres else {}
    if sum(parts.values()) != node.gpus:  # no gres, or one the count disagrees with
        return {node.gpu_type or "gpu": node.gpus} if node.gpus > 0 else {}
    out: dict[str, int] = {}
    for name, count in parts.items():
        key = name or node.gpu_type or "gpu"
        out[key] = out.get(key, 0) + count
    return out


def gpu_equivalents(node: Node, rules: SliceRules) -> Fraction:
    """The GPUs a node's capacity books per second: each whole GPU 1, each MIG slice its
    fraction (`bridge.slurm.slices.unit_share`); Slurm's count (`node.gpus`) counts a
    slice 1."""
    return sum((n * unit_share(t, rules) for t, n in gpu_types(node).items()), Fraction(0))


def inventory(
    nodes: Iterable[Node], config: BridgeConfig, *, down_too: bool = False
) -> list[NodeCapacity]:
    """The nodes with GPUs (one line per GPU type), each in its pool, else its partition
    (`ledger_pool`); without `down_too`, only those in service now."""
    out = []
    for node in nodes:
        pool = ledger_pool(node, config)
        out_of_service = not down_too and node.state.startswith(_OUT_OF_SERVICE)
        if pool is None or node.gpus <= 0 or out_of_service:
            continue
        out += [NodeCapacity(node.name, pool, t, n) for t, n in gpu_types(node).items()]
    return out


def slice_rules(config: BridgeConfig) -> SliceRules:
    """`[accounting.slices]` as the rules the ledger books MIG slices and shards by."""
    s = config.accounting.slices
    return SliceRules(
        share=s.share,
        compute_slices=s.compute_slices,
        compute_slices_of=s.compute_slices_of,
        gpu_memory_gb=s.gpu_memory_gb,
        shards_per_gpu=s.shards_per_gpu,
    )


def context(
    config: BridgeConfig,
    nodes: Sequence[Node],
    leases: Iterable[Lease],
    horizon: datetime,
    cluster: str,
) -> Context:
    acc = config.accounting
    workloads = {p.partition: WORKLOAD_OF_MODE[p.lend_mode] for p in config.pools.values()}
    workloads.update(acc.workloads)
    return Context(
        pool_of_node={n.name: p for n in nodes if (p := ledger_pool(n, config)) is not None},
        gpu_type_of_node={n.name: n.gpu_type or "gpu" for n in nodes if n.gpus > 0},
        workload_of_partition=workloads,
        workload_of_pool={name: WORKLOAD_OF_MODE[p.lend_mode] for name, p in config.pools.items()},
        team_of_account=dict(acc.teams),
        team_of_model=model_teams(config.triton.model_repository),
        pool_of_lease={
            lease_tag((lease.id, int(lease.created_at.timestamp())))[len(LEASE_TAG_PREFIX) :]: (
                lease.pool
            )
            for lease in leases
            if lease.id is not None
        },
        known_gpu_types=frozenset(t for n in nodes if n.gpus > 0 for t in gpu_types(n)),
        horizon=horizon,
        cluster=cluster,
        staging_accounts=frozenset({staging_account(config)}),
        slices=slice_rules(config),
    )


def staging_account(config: BridgeConfig) -> str:
    """The account the bridge submits its staging jobs under (`bridge.slurm.staging`)."""
    return config.weights.account or config.triton.account


def _records(
    slurm: SlurmProtocol,
    since: datetime,
    until: datetime,
    on_step: Callable[[datetime, datetime, int], None] | None,
) -> Iterator[AccountingRecord]:
    """sacct over [since, until) in steps of a day; each run once (sacct lists a job in
    every step it overlaps)."""
    seen: set[str] = set()
    lo = since
    while lo < until:
        hi = min(lo + SACCT_STEP, until)
        records = slurm.accounting(lo, hi)
        if on_step:
            on_step(lo, hi, len(records))
        for rec in records:
            if rec.key not in seen:
                seen.add(rec.key)
                yield rec
        lo = hi


def ledger_cluster(
    config: BridgeConfig,
    engine: Engine,
    records: Sequence[AccountingRecord],
    slurm: SlurmProtocol | None = None,
) -> str:
    """The ledger's name of the cluster: `[accounting] cluster`, else Slurm's ClusterName;
    where slurmctld cannot say, the name sacct's records carry, else the ledger's last.
    Never a made-up name: one that matches nothing in slurmdbd books capacity from nothing."""
    if config.accounting.cluster:
        return config.accounting.cluster
    if slurm is not None:
        try:
            return slurm.cluster_name()
        except SlurmError as exc:
            log.warning("ledger: Slurm's ClusterName not read (%s): from the records", exc)
    named = [r.cluster for r in records if r.cluster]
    if named:
        return max(set(named), key=named.count)
    with engine.connect() as conn:
        last = conn.scalar(
            select(NodeSpan.__table__.c.cluster).order_by(NodeSpan.__table__.c.id.desc()).limit(1)  # type: ignore[attr-defined]
        )
    if last:
        return str(last)
    raise LedgerError(
        "no cluster name: Slurm did not say its ClusterName, sacct returned no job and the "
        "ledger has none; set [accounting] cluster"
    )


class NoRegistration(LedgerError):
    """slurmdbd has no registration event of the ledger's cluster over the window, so
    capacity from events would be nothing (`[accounting] capacity = "events"`)."""


def _registered_events(
    slurm: SlurmProtocol, cluster: str, since: datetime, until: datetime
) -> list[SlurmEvent]:
    """slurmdbd's events of `cluster` over [since, until); `NoRegistration` naming the
    clusters slurmdbd does know when none of them registers `cluster`."""
    events = slurm.events(since, until)
    mine = [e for e in events if e.cluster == cluster]
    if any(e.is_registration for e in mine):
        return mine
    known = sorted({e.cluster for e in events if e.is_registration})
    names = ", ".join(known) if known else "none"
    raise NoRegistration(
        f"slurmdbd has no registration event of cluster {cluster!r} in "
        f"{since.isoformat()}..{until.isoformat()} (clusters registered then: {names}); "
        "nothing was booked. Set [accounting] cluster to the cluster's name, or "
        '[accounting] capacity = "inventory" for a slurmdbd that keeps no events'
    )


def first_runs(records: Iterable[AccountingRecord]) -> dict[str, datetime]:
    """Each node's earliest run start among `records`: a node that ran a job was there."""
    out: dict[str, datetime] = {}
    for rec in records:
        if rec.start is None:
            continue
        for node in rec.nodes:
            if node not in out or rec.start < out[node]:
                out[node] = rec.start
    return out


def ingest_window(
    config: BridgeConfig,
    slurm: SlurmProtocol,
    ledger: Engine,
    since: datetime,
    until: datetime,
    *,
    leases: Iterable[Lease] = (),
    restate: bool = False,
    reason: str = "",
    now: datetime | None = None,
    on_step: Callable[[datetime, datetime, int], None] | None = None,
    events: bool | None = None,
) -> IngestSummary:
    """Record the inventory, then book every sacct run of [since, until) (idle recomputed
    for the window's hours). The window starts on an hour.

    `events` (default: `[accounting] capacity` is "events"): capacity and down time from
    slurmdbd's events over the hours the window's records touch (`accounting.capacity`);
    no registration of the cluster there is `NoRegistration`, and nothing is booked.
    False: from the inventory alone, a node seen for the first time taken to have been
    there since its first run in the window, else since now (never since `since`: the
    look-back is no evidence that a node existed)."""
    now = now or datetime.now(UTC)
    since = floor_hour(since)
    until = min(until, now)
    if events is None:
        events = config.accounting.capacity == "events"
    nodes = slurm.nodes()
    records = list(_records(slurm, since, until, on_step))
    cluster = ledger_cluster(config, ledger, records, slurm)
    ctx = context(config, nodes, leases, horizon=until, cluster=cluster)
    slurm_events = None
    if events:
        first = min([since, *(r.start for r in records if r.start is not None)])
        slurm_events = _registered_events(slurm, cluster, floor_hour(first), until)
    summary = ingest_records(
        ledger, records, ctx, since=since, until=until, restate=restate, reason=reason, now=now,
        inventory=Inventory(
            cluster,
            inventory(nodes, config, down_too=events),
            now,
            first_seen=None if events else first_runs(records),
        ),
        events=slurm_events,
    )  # fmt: skip
    spool = config.accounting.gpu_usage_dir
    if spool is not None and spool.is_dir():
        summary.usage_records = ingest_usage(ledger, read_spool(spool), cluster)
    return summary


class LedgerFeed:
    """The daemon's link to the ledger: stores each Triton scrape's per-model counters
    (compute time: the serving split's input; successful requests and an LLM's prompt and
    generated tokens: the unit economics') and runs the scheduled ingest."""

    def __init__(self, config: BridgeConfig, ledger: Engine) -> None:
        self.config = config
        self.ledger = ledger
        self.collector = LedgerCollector(ledger)
        self.cluster = config.accounting.cluster
        self._last_sample: dict[tuple[str, str], float] = {}

    def record_page(self, job_id: str, address: str, at: float, page: MetricsPage) -> None:
        """Observer hook: one instance's scrape. A failure is logged, never raised: the
        control pass must not depend on the ledger."""
        last = self._last_sample.get((job_id, address))
        if last is not None and at - last < self.config.accounting.sample_interval_s:
            return
        self._last_sample[(job_id, address)] = at
        when = datetime.fromtimestamp(at, UTC)
        points = []
        for (model, version), s in sorted(page.models.items(), key=lambda kv: kv[0]):
            if s.compute_infer_duration_us is None:
                continue
            parts = (
                s.compute_input_duration_us,
                s.compute_infer_duration_us,
                s.compute_output_duration_us,
            )
            us = sum(p or 0.0 for p in parts)
            llm = s.llm  # an LLM's token counters (vLLM or TensorRT-LLM backend)
            point = ServingPoint(
                job_id, address, model, when, us, version, s.request_success,
                llm.prompt_tokens if llm else None, llm.generation_tokens if llm else None,
            )  # fmt: skip
            points.append(point)
        try:
            record_serving(self.ledger, self.cluster, points)
        except SQLAlchemyError as exc:
            log.warning("ledger: serving sample of job %s not stored: %s", job_id, exc)

    def ingest(self, slurm: SlurmProtocol, store: LeaseStore, now: datetime) -> IngestSummary:
        since = now - timedelta(seconds=self.config.accounting.lookback_s)
        summary = ingest_window(
            self.config, slurm, self.ledger, since, now, leases=store.touched_since(since), now=now
        )
        # the serving samples and the batch route's counts are kept alike: a batch hour's
        # share is read against the serving hour it belongs to
        kept_from = now - timedelta(days=self.config.accounting.sample_retention_days)
        prune_serving(self.ledger, kept_from)
        prune_batch(self.ledger, kept_from)
        # forget servers not scraped within the lookback (their jobs have ended)
        cutoff = since.timestamp()
        self._last_sample = {k: t for k, t in self._last_sample.items() if t > cutoff}
        self.collector.invalidate()
        return summary
