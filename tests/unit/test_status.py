"""`stb status`'s document from a real lease store (SQLite): a failed lease is listed with
the adapter's words, a lease past its state's deadline is marked stuck."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bridge.config import BridgeConfig, DaemonConfig, LeaseConfig, ModelConfig
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState as S
from bridge.ops.cli import collect

T0 = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_shows_failed_and_stuck_leases(tmp_path: Path) -> None:
    cfg = BridgeConfig(
        database_url=f"sqlite:///{tmp_path / 'bridge.db'}",
        models={"busy": ModelConfig(slo_p99_ms=100)},
        leases=LeaseConfig(releasing_deadline_s=60),
        daemon=DaemonConfig(exporter_listen=f"127.0.0.1:{_unused_port()}"),
    )
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    store = LeaseStore(engine)
    rejected = store.create("n3", "elastic", "preempt", ["busy"], "a", T0)
    assert rejected.id is not None
    why = "submit: sbatch: error: Invalid account or account/partition combination specified"
    store.set_status(rejected.id, S.FAILED, T0, why)
    store.set_status(rejected.id, S.RETURNED, T0, "cleaned up after failure")
    slow = store.create("n5", "elastic", "preempt", ["busy"], "b", T0)
    assert slow.id is not None
    store.set_status(slow.id, S.SUBMITTED, T0, "submitted", slurm_job_id="41")
    store.set_status(slow.id, S.RELEASING, T0, "return: operator")

    doc = collect(cfg, T0 + timedelta(seconds=90))
    assert doc["failed"] == [
        {
            "id": rejected.id,
            "node": "n3",
            "pool": "elastic",
            "at": T0.isoformat(),
            "from": "requested",
            "reason": why,
            "state": "returned",
        }
    ]
    (lease,) = doc["leases"]
    assert lease["id"] == slow.id and lease["state"] == "releasing" and lease["stuck"]
    assert "gpus" not in lease and "gpu_type" not in lease  # the whole node
    slice_ = store.create(
        "n6", "mig", "preempt", ["busy"], "c", T0, gpus=1, gpu_type="h100_1g.10gb"
    )
    shown = {x["node"]: x for x in collect(cfg, T0)["leases"]}["n6"]
    assert (shown["id"], shown["gpus"], shown["gpu_type"]) == (slice_.id, 1, "h100_1g.10gb")
    assert "slot" not in shown  # the node's first lease: slot 0, not said
    beside = store.create(
        "n6", "mig", "preempt", ["busy"], "d", T0, gpus=1, gpu_type="h100_1g.10gb"
    )
    shared = [x for x in collect(cfg, T0)["leases"] if x["node"] == "n6"]
    assert [(x["id"], x.get("slot")) for x in shared] == [(slice_.id, None), (beside.id, 1)]
    assert doc["daemon_reachable"] is False
    # a day later the failure has aged out of the list, and 30 s in the lease was not stuck
    assert collect(cfg, T0 + timedelta(days=1, seconds=1))["failed"] == []
    assert not collect(cfg, T0 + timedelta(seconds=30))["leases"][0]["stuck"]
