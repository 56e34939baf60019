"""Per-model service times for the simulator from Triton's own counters: the answer the
lab's real Prometheus gave to `service_query` over the capture (tests/data/site/: `busy`
holds 20 ms a request, `echo` returns at once), hostile answers, and the samples the
daemon stores in the ledger (a real migrated SQLite ledger, written by the ledger's own
`record_serving`), read straight and through `stb simulate --service-from ledger`."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accounting.attribution import ServingPoint
from accounting.db import open_ledger
from accounting.samples import record_serving
from accounting.serving import Increase
from bridge.cli import app
from bridge.sim.inputs import (
    InputError,
    read_ledger_service,
    service_from_increases,
    service_from_prometheus,
    service_query,
)

SITE = Path(__file__).resolve().parents[1] / "data" / "site"
T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)


def test_the_recorded_answer_gives_each_models_compute_per_request() -> None:
    service = service_from_prometheus(SITE / "prometheus-service.json")
    assert set(service) == {"busy", "echo"}
    assert service["busy"] == pytest.approx(0.020, rel=0.1)  # its service_time_ms is 20
    assert service["echo"] < 0.002


def test_the_query_sums_each_counter_before_adding() -> None:
    """Prometheus refused the three counters' increases added unsummed ("vector cannot
    contain metrics with the same labelset", the first capture): each is summed by model."""
    q = service_query(3600)
    for part in ("input", "infer", "output"):
        assert f"sum by (model) (increase(nv_inference_compute_{part}_duration_us[3600s]))" in q
    assert q.endswith("/ sum by (model) (increase(nv_inference_request_success[3600s]))")


def vector(*items: tuple[dict[str, str], Any]) -> dict[str, Any]:
    result = [{"metric": m, "value": [1.0, v]} for m, v in items]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_a_model_without_requests_has_no_service_time() -> None:
    doc = vector(({"model": "a"}, "1500"), ({"model": "b"}, "NaN"), ({"model": "c"}, "+Inf"))
    assert service_from_prometheus(doc) == {"a": 0.0015}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (vector(({"model": "a"}, "-3")), 'series 0 {model="a"}: -3.0 us per request'),
        (vector(({"model": "a"}, "1"), ({"model": "a"}, "2")), "model 'a' twice: sum the query"),
        (vector(({"job": "triton"}, "1")), "has no 'model' label"),
        (vector(({"model": "a"}, "x")), "value [1.0, 'x'] is not [time, \"value\"]"),
        (
            {"status": "success", "data": {"resultType": "matrix", "result": [{}]}},
            "resultType 'matrix', not 'vector'",
        ),
    ],
)
def test_hostile_service_answers(doc: Any, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        service_from_prometheus(doc)


def test_increases_give_compute_over_requests() -> None:
    def inc(model: str, us: float, req: float | None) -> Increase:
        return Increase("1", "n4:8002", model, "1", T0, T0 + timedelta(seconds=30), us, req)

    got = service_from_increases(
        [inc("a", 2e6, 100), inc("a", 1e6, 50), inc("b", 5e5, None), inc("c", 0.0, 0.0)]
    )
    assert got == {"a": pytest.approx(0.02)}  # b lacks its request counter, c served none


def _ledger(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = open_ledger(url)
    points = []
    for k in range(5):  # one replica, 30 s scrapes: 20 ms and 5 ms a request
        at = T0 + timedelta(seconds=30 * k)
        points += [
            ServingPoint("7", "n4:8002", "busy", at, 20_000.0 * 40 * k, "1", 40.0 * k),
            ServingPoint("7", "n4:8002", "echo", at, 5_000.0 * 10 * k, "1", 10.0 * k),
        ]
    record_serving(engine, "lab", points)
    engine.dispose()
    return url


def test_the_ledgers_samples_read_straight(tmp_path: Path) -> None:
    url = _ledger(tmp_path)
    got = read_ledger_service(url, T0, T0 + timedelta(hours=1))
    assert got == {"busy": pytest.approx(0.020), "echo": pytest.approx(0.005)}
    assert read_ledger_service(url, T0 + timedelta(days=1), T0 + timedelta(days=2)) == {}


def test_the_cli_takes_service_times_from_the_ledger(tmp_path: Path) -> None:
    url = _ledger(tmp_path)
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(f'[accounting]\nledger_url = "{url}"\n')
    rows = ["time,model,rate"] + [
        f"{(T0 + timedelta(seconds=5 * k)).isoformat()},{m},{r}"
        for k in range(720)
        for m, r in (("busy", 20), ("echo", 50), ("new", 1))
    ]
    csv = tmp_path / "rates.csv"
    csv.write_text("\n".join(rows) + "\n")
    res = CliRunner().invoke(app, [
        "simulate", "--arrivals", "csv", "--arrivals-file", str(csv), "--nodes", "8",
        "--config", str(cfg), "--service-from", "ledger", "--service-ms", "12",
        "--policies", "bridge", "--tradeoff", "none", "--format", "json",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["scenario"]
    assert s["models"]["busy"]["service_ms"] == pytest.approx(20.0)
    assert s["models"]["echo"]["service_ms"] == pytest.approx(5.0)
    assert s["models"]["new"]["service_ms"] == 12.0  # the ledger has none: --service-ms
    said = s["model_inputs"]
    assert said["busy"]["service_from"] == "ledger (the daemon's stored Triton counters)"
    assert said["new"]["service_from"].startswith("--service-ms (ledger")
