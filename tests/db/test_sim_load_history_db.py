"""`stb simulate --timing leases` reads the model load times the daemon stored
(`bridge.leases.loads.LoadStore`) beside its lease history, on SQLite and the real
PostgreSQL: measures written through `LoadStore.record`, leases through `LeaseStore`,
and the run's timing in the report holds each simulated model's load (a start's bound
less the history's Triton start, a placement's measure whole) and, with `--cache N`, its
load from a node's cache, with the figures it took them from."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from bridge.cli import app
from bridge.leases.loads import LoadStore
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.sim.inputs.loads import read_load_measures

RUN = CliRunner()
S = LeaseState
T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)


def _site(url: str) -> None:
    """Two lends whose starting -> serving took 4 s and 6 s (the history's Triton start:
    their median, 5 s), and the load measures of m0, m1 (simulated) and llm (not)."""
    engine = make_engine(url)
    create_schema(engine)
    leases = LeaseStore(engine)
    for k, ready in enumerate((4.0, 6.0)):
        base = T0 + timedelta(hours=k)
        lease = leases.create(f"n{k}", "elastic", "preempt", ["m0"], f"k{k}", base)
        assert lease.id is not None
        for state, at in ((S.SUBMITTED, 0.1), (S.STARTING, 9.0), (S.SERVING, 9.0 + ready)):
            leases.set_status(lease.id, state, base + timedelta(seconds=at), "test")
    loads = LoadStore(engine)
    for model, seconds, source in (
        ("m0", 65.0, "lend"),
        ("m0", 75.0, "lend"),
        ("m0", 15.0, "local"),
        ("m1", 200.0, "lend"),
        ("m1", 30.0, "placement"),
        ("llm", 290.0, "placement"),
    ):
        loads.record(model, seconds, T0, source)
    engine.dispose()


def test_timing_leases_takes_the_stored_load_times(database_url: str, tmp_path: Path) -> None:
    _site(database_url)
    assert read_load_measures(database_url)["m0"] == [
        ("lend", 65.0),
        ("lend", 75.0),
        ("local", 15.0),
    ]
    (tmp_path / "models").mkdir()
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(
        f'database_url = "{database_url}"\n[triton]\nmodel_repository = "{tmp_path / "models"}"\n'
    )
    res = RUN.invoke(app, [
        "simulate", "--days", "0.05", "--nodes", "16", "--models", "2", "--mean-rps", "150",
        "--config", str(cfg), "--timing", "leases", "--cache", "2",
        "--policies", "bridge", "--tradeoff", "none", "--format", "json",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["scenario"]
    timing = s["timing"]
    assert timing["triton_ready_s"] == 5.0
    # m0: its lends' median 70 s less Triton's 5 s; m1: its placement, whole
    assert timing["model_load_s"] == {"m0": 65.0, "m1": 30.0}
    # --cache 2: each node keeps two models; m0 loads from it in 15 - 5 s, m1 (no local
    # measure) at its shared load
    assert timing["cache_models"] == 2 and timing["local_load_s"] == {"m0": 10.0}
    said = s["timing_source"]
    assert said["model_load_s_from"] == "lease history"
    assert said["cache"] == {"value": "2", "local_load_s_from": "lease history"}
    history = said["load_history"]
    assert history["triton_ready_s_subtracted"] == 5.0
    assert history["not_simulated"] == ["llm"]
    assert history["models"]["m0"]["shared"] == {
        "source": "lend", "measured_s": 70.0, "measures": 2, "seconds": 65.0,
        "use": "model_load_s",
    }  # fmt: skip
    assert history["models"]["m1"]["shared"]["source"] == "placement"
    assert history["models"]["m0"]["local"]["use"] == "local_load_s"
