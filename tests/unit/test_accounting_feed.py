"""The bridge's feed into the ledger (`bridge.ledger.feed`): capacity from Slurm's
nodes, the workload of each partition from the pools, the team map, and the lease tag ->
pool map."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from accounting.batchcounts import BATCH, record_batch
from accounting.db import open_ledger
from accounting.samples import prune_serving
from accounting.tables import SAMPLES
from bridge.config import BridgeConfig
from bridge.leases.models import Lease, LendMode
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.ledger.feed import LedgerFeed, context, inventory
from bridge.lifecycle import LeaseState
from bridge.slurm.model import Node
from bridge.triton.metrics import parse_page
from tests.unit.fakes import EventSlurm

NOW = datetime(2026, 11, 3, 12, tzinfo=UTC)
DATA = Path(__file__).parent.parent / "data" / "triton"


def node(name: str, partitions: tuple[str, ...], state: str = "idle", gpus: int = 4) -> Node:
    return Node(name, "127.0.1.1", partitions, state, frozenset(), "", "h100", gpus, 0)


NODES = [
    node("n1", ("train",)),
    node("n2", ("train",), state="down"),
    node("n3", ("elastic", "infer")),
    node("n4", ("infer",)),
    node("n5", ("debug",)),
    node("c1", ("train",), gpus=0),
]


def test_capacity_counts_in_service_gpu_nodes_in_their_pool() -> None:
    got = {(c.node, c.pool, c.gpu_type, c.gpus) for c in inventory(NODES, BridgeConfig())}
    # n2 is down, c1 has no GPU; n3 belongs to elastic, not inference; n5 is in no pool: its
    # capacity is booked under its partition, where its jobs book theirs
    assert got == {
        ("n1", "training", "h100", 4),
        ("n3", "elastic", "h100", 4),
        ("n4", "inference", "h100", 4),
        ("n5", "debug", "h100", 4),
    }


def test_a_node_of_mig_slices_has_capacity_per_slice_type() -> None:
    mig = Node(
        "m1", "127.0.1.9", ("mig",), "idle", frozenset(), "", "h100_4g.40gb", 3, 0,
        gres="gpu:h100_4g.40gb:1(S:0),gpu:h100_2g.20gb:1(S:0),gpu:h100_1g.10gb:1(S:0)",
    )  # fmt: skip
    got = [(c.node, c.pool, c.gpu_type, c.gpus) for c in inventory([mig], BridgeConfig())]
    assert got == [
        ("m1", "mig", "h100_4g.40gb", 1),
        ("m1", "mig", "h100_2g.20gb", 1),
        ("m1", "mig", "h100_1g.10gb", 1),
    ]
    ctx = context(BridgeConfig(), [*NODES, mig], [], horizon=NOW, cluster="lab")
    assert ctx.known_gpu_types == {"h100", "h100_4g.40gb", "h100_2g.20gb", "h100_1g.10gb"}
    # a gres the count disagrees with (or none) falls back to the count under the first type
    odd = Node("m2", "a", ("mig",), "idle", frozenset(), "", "h100_1g.10gb", 2, 0, gres="")
    assert [(c.gpu_type, c.gpus) for c in inventory([odd], BridgeConfig())] == [("h100_1g.10gb", 2)]


def test_context_maps_partitions_teams_models_and_leases() -> None:
    config = BridgeConfig.model_validate(
        {
            "accounting": {"teams": {"bridge": "platform"}, "workloads": {"debug": "elastic"}},
            "triton": {"model_repository": Path("triton_repo")},
        }
    )
    lease = Lease(
        id=7, node="n1", pool="training", lend_mode=LendMode.DRAIN, models=["busy"],
        state=LeaseState.SERVING, request_key="k", created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    ctx = context(config, NODES, [lease], horizon=NOW, cluster="lab")
    assert ctx.workload_of_partition == {
        "train": "training", "elastic": "elastic", "infer": "inference", "debug": "elastic",
    }  # fmt: skip
    assert ctx.pool_of_node["n3"] == "elastic" and ctx.pool_of_node["n5"] == "debug"
    assert ctx.team_of_account == {"bridge": "platform"}
    assert ctx.team_of_model["busy"] == "team-vision"  # from triton_repo/busy/config.pbtxt
    assert ctx.pool_of_lease == {f"7.{int(NOW.timestamp())}": "training"}
    assert ctx.known_gpu_types == frozenset({"h100"})


def test_the_feed_stores_counters_per_version_at_most_once_per_interval(tmp_path: Path) -> None:
    config = BridgeConfig.model_validate(
        {"accounting": {"ledger_url": f"sqlite:///{tmp_path / 'l.db'}", "sample_interval_s": 30}}
    )
    feed = LedgerFeed(config, open_ledger(config.accounting.ledger_url))
    page = parse_page((DATA / "busy_a.prom").read_text())
    t = NOW.timestamp()
    for offset in (0, 10, 29, 31):
        feed.record_page("12", "127.0.1.4:8000", t + offset, page)
    with feed.ledger.connect() as conn:
        rows = conn.execute(select(SAMPLES.c.model, SAMPLES.c.at, SAMPLES.c.compute_us)).all()
    busy = sorted((at, us) for model, at, us in rows if model == "busy")
    assert [at.timestamp() - t for at, _ in busy] == [0, 31]
    s = page.models[("busy", "1")]
    expected = sum(
        v or 0.0
        for v in (
            s.compute_input_duration_us,
            s.compute_infer_duration_us,
            s.compute_output_duration_us,
        )
    )
    assert busy[0][1] == expected > 0
    # per model version, with Triton's successful-request counter (the unit economics)
    with feed.ledger.connect() as conn:
        versions = conn.execute(
            select(SAMPLES.c.version, SAMPLES.c.requests).where(SAMPLES.c.model == "busy")
        ).all()
    assert set(versions) == {("1", s.request_success)} and (s.request_success or 0) > 0
    assert prune_serving(feed.ledger, datetime.fromtimestamp(t + 1, UTC)) == len(rows) // 2


def test_an_ingest_drops_batch_counts_past_the_retention_with_the_samples(tmp_path: Path) -> None:
    config = BridgeConfig.model_validate(
        {
            "database_url": f"sqlite:///{tmp_path / 'b.db'}",
            "accounting": {
                "ledger_url": f"sqlite:///{tmp_path / 'l.db'}",
                "sample_retention_days": 2,
                "capacity": "inventory",
            },
        }
    )
    feed = LedgerFeed(config, open_ledger(config.accounting.ledger_url))
    old, recent = NOW - timedelta(days=3), NOW - timedelta(days=1)
    record_batch(feed.ledger, "lab", "/b.log", {(old, "busy", "7"): 4}, (1, 10), old)
    record_batch(feed.ledger, "lab", "/b.log", {(recent, "busy", "7"): 5}, (1, 20), recent)
    engine = make_engine(config.database_url)
    create_schema(engine)
    feed.ingest(EventSlurm(NODES, [], []), LeaseStore(engine), NOW)  # type: ignore[arg-type]
    with feed.ledger.connect() as conn:
        kept = conn.execute(select(BATCH.c.bucket, BATCH.c.requests)).all()
    assert [(b.replace(tzinfo=UTC), n) for b, n in kept] == [(recent, 5)]
