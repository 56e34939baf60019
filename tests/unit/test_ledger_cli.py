"""The ledger's command line, HTTP endpoint and Prometheus metrics, on a small SQLite
ledger: `stb accounting rates`, `stb report` in every format, `/api/report` through the
daemon's exporter, `stb_ledger_gpu_hours_total`."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from openpyxl import load_workbook
from prometheus_client import CollectorRegistry, generate_latest
from typer.testing import CliRunner

from accounting.attribution import Context, ServingPoint
from accounting.db import open_ledger
from accounting.ingest import ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.metrics import LedgerCollector
from accounting.samples import record_serving
from bridge.cli import app
from bridge.daemon.metrics import BridgeMetrics
from bridge.http.app import create_app
from bridge.http.auth import TokenTable
from bridge.http.routes import finance_routes
from bridge.http.server import HttpServer
from bridge.slurm.model import AccountingRecord
from tests.unit.helpers import write_tokens

T0 = datetime(2026, 11, 3, 8, 0, tzinfo=UTC)
RUN = CliRunner()


def _rec(job: str, account: str, hours: float, partition: str, node: str) -> AccountingRecord:
    end = T0 + timedelta(hours=hours)
    return AccountingRecord(
        cluster="lab", job_id=job, array_job_id=None, array_task_id=None, name="j",
        partition=partition, account=account, user="u", qos="normal", state="COMPLETED",
        submit=T0, start=T0, end=end, elapsed_s=int(hours * 3600), nodes=(node,), gpus=2,
        gpu_type="h100", comment="", restarts=0,
    )  # fmt: skip


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = open_ledger(url)
    nodes = {"n1": "training", "n3": "elastic"}
    record_inventory(
        engine, "lab", [NodeCapacity(n, p, "h100", 4) for n, p in nodes.items()],
        T0 + timedelta(hours=3), backfill_from=T0,
    )  # fmt: skip
    ctx = Context(
        pool_of_node=nodes,
        workload_of_partition={"train": "training", "elastic": "elastic"},
        team_of_account={"nlp-acct": "team-nlp"},
        horizon=T0 + timedelta(hours=3),
    )
    ingest_records(
        engine,
        [_rec("1", "nlp-acct", 2, "train", "n1"), _rec("2", "team-vision", 1.5, "elastic", "n3")],
        ctx,
        since=T0,
        until=T0 + timedelta(hours=3),
    )
    path = tmp_path / "bridge.toml"
    bridge_db = f"sqlite:///{tmp_path / 'bridge.db'}"
    path.write_text(f'database_url = "{bridge_db}"\n[accounting]\nledger_url = "{url}"\n')
    return path


def _ok(args: list[str]) -> str:
    res = RUN.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_rates_add_list_and_an_overlap_is_refused_by_name(cfg: Path) -> None:
    _ok(["accounting", "rates", "add", "--gpu-type", "h100", "--price", "2.50",
         "--from", "2026-01-01", "-c", str(cfg)])  # fmt: skip
    res = RUN.invoke(app, ["accounting", "rates", "add", "--gpu-type", "h100", "--price", "3",
                           "--from", "2026-06-01", "-c", str(cfg)])  # fmt: skip
    assert res.exit_code == 1
    assert "overlaps h100 2.50 USD/GPU-hour [2026-01-01, open)" in res.output
    bad = RUN.invoke(app, ["accounting", "rates", "add", "--gpu-type", "h100", "--price",
                           "cheap", "--from", "2026-01-01", "-c", str(cfg)])  # fmt: skip
    assert bad.exit_code == 1 and "not a price: 'cheap'" in bad.output
    assert "2.50" in _ok(["accounting", "rates", "list", "-c", str(cfg)])


def test_report_formats_agree(cfg: Path, tmp_path: Path) -> None:
    _ok(["accounting", "rates", "add", "--gpu-type", "h100", "--price", "2",
         "--from", "2026-01-01", "-c", str(cfg)])  # fmt: skip
    base = ["report", "--window", "2026-11", "--by", "team,workload", "-c", str(cfg)]
    doc = json.loads(_ok([*base, "--format", "json"]))
    lines = {(li["team"], li["workload"]): li for li in doc["lines"]}
    assert lines[("team-nlp", "training")]["gpu_hours"] == 4.0
    assert lines[("team-nlp", "training")]["cost"] == "8.00"
    assert lines[("team-vision", "elastic")]["gpu_hours"] == 3.0
    # 2 nodes x 4 GPUs x 3 h = 24 GPU-h of capacity: 7 used, 17 idle.
    assert doc["total"]["gpu_hours"] == 24.0 and doc["total"]["cost"] == "48.00"
    rows = list(csv.DictReader(io.StringIO(_ok([*base, "--format", "csv"]))))
    assert {(r["team"], r["workload"], r["gpu_hours"], r["cost"]) for r in rows} == {
        (li["team"], li["workload"], str(li["gpu_hours"]), li["cost"]) for li in doc["lines"]
    }
    table = _ok([*base, "--format", "table"])
    assert "team-nlp" in table and "48.00" in table
    _ok([*base, "--format", "xlsx", "-o", str(tmp_path / "r.xlsx")])
    sheet = load_workbook(tmp_path / "r.xlsx")["report"]
    assert sheet.max_row == len(doc["lines"]) + 2  # header + lines + total
    _ok([*base, "--format", "html", "-o", str(tmp_path / "r.html")])
    assert (tmp_path / "r.html").read_text().count("<svg") == 3
    team = json.loads(_ok([*base, "--format", "json", "--where", "team=team-nlp"]))
    assert team["lines"] == [li for li in doc["lines"] if li["team"] == "team-nlp"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "Nov"], "window 'Nov'"),
        (["--window", "2026-11", "--by", "colour"], "unknown key(s) colour"),
        (["--window", "2026-11", "--step", "week"], "unknown step 'week'"),
        (["--window", "2026-11", "--format", "pdf"], "--format 'pdf'"),
        (["--window", "2026-11", "--where", "team"], "expected KEY=VALUE"),
        (["--window", "2026-11-03T08:30..2026-11-04"], "not on an hour"),
    ],
)
def test_bad_report_options_are_named(cfg: Path, args: list[str], message: str) -> None:
    res = RUN.invoke(app, ["report", *args, "-c", str(cfg)])
    assert res.exit_code != 0
    assert message in " ".join(res.output.split()), res.output


def test_the_http_endpoint_serves_the_report_json(cfg: Path, tmp_path: Path) -> None:
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    token = "f" * 20
    app = create_app(
        BridgeMetrics(), 5.0, routers=[finance_routes(engine, "line")],
        tokens=TokenTable(write_tokens(tmp_path / "tokens", {"fin": ("finance", token)})),
    )  # fmt: skip
    server = HttpServer(app, ("127.0.0.1", 0)).start()
    host, port = server.address
    try:
        url = f"http://{host}:{port}/api/report"
        auth = {"Authorization": f"Bearer {token}"}
        params = {"window": "2026-11-03", "aggregate": "pool", "step": "hour"}
        assert httpx.get(url, params=params).status_code == 401
        got = httpx.get(url, params=params, headers=auth)
        assert got.status_code == 200
        cli = json.loads(_ok(["report", "--window", "2026-11-03", "--by", "pool", "--step",
                              "hour", "--format", "json", "-c", str(cfg)]))  # fmt: skip
        assert got.json() == cli
        assert {li["period"] for li in got.json()["lines"]} == {
            (T0 + timedelta(hours=h)).isoformat() for h in range(3)
        }
        for params, message in [
            ({}, "window is required"),
            ({"window": "2026-11", "by": "nope"}, "unknown key(s) nope"),
            ({"window": "2026-11", "colour": "red"}, "unknown parameter(s) colour"),
        ]:
            bad = httpx.get(url, params=params, headers=auth)
            assert bad.status_code == 400 and message in bad.json()["error"]
    finally:
        server.stop()


def test_ledger_metrics_by_team_and_workload(cfg: Path, tmp_path: Path) -> None:
    engine = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    registry = CollectorRegistry()
    collector = LedgerCollector(engine, ttl_s=3600)
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert 'stb_ledger_gpu_hours_total{team="team-nlp",workload="training"} 4.0' in text
    assert 'stb_ledger_gpu_hours_total{team="(idle)",workload="idle"} 17.0' in text
    assert "stb_ledger_last_ingest_timestamp_seconds" in text


def test_views_beside_the_report(cfg: Path, tmp_path: Path) -> None:
    """`--with`: the unit economics, lending, capacity plan and budgets sections in JSON,
    the table and HTML (all four by default there); a report never creates the bridge's
    database; a bad view or a view in CSV is refused by name."""
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    at = T0 + timedelta(hours=1)
    record_serving(
        ledger, "lab",
        [ServingPoint("9", "n1:8000", "busy", at + timedelta(minutes=k), 2e6 * k, "1", 40.0 * k)
         for k in range(0, 31, 5)],
    )  # fmt: skip
    serving = _rec("9", "nlp-acct", 1, "train", "n1")
    ctx = Context(
        pool_of_node={"n1": "training"}, team_of_model={"busy": "team-vision"},
        horizon=T0 + timedelta(hours=3),
    )  # fmt: skip
    ingest_records(ledger, [replace(serving, start=at, end=at + timedelta(hours=1),
                                    comment="stb:triton")], ctx)  # fmt: skip
    _ok(["budget", "set", "team-nlp", "10", "--unit", "gpu-hours", "-c", str(cfg)])
    base = ["report", "--window", "2026-11-03", "-c", str(cfg)]
    doc = json.loads(_ok([*base, "--by", "model", "--format", "json",
                          "--with", "economics,lending,plan,budgets"]))  # fmt: skip
    sections = doc["sections"]
    assert list(sections) == ["unit_economics", "lending", "capacity_plan", "budgets"]
    busy = {r["version"]: r for r in sections["unit_economics"]["rows"] if r["model"] == "busy"}
    assert busy["*"]["requests"] == 1200 and busy["1"]["requests"] == 1200
    assert sections["lending"]["notes"][0].startswith("no lease database at")
    assert not (tmp_path / "bridge.db").exists()
    assert [r["team"] for r in sections["budgets"]["rows"]] == ["team-nlp"]
    # by hour: the capacity plan hour by hour (busy served 09:00-09:30)
    hourly = json.loads(_ok([*base, "--by", "model", "--step", "hour", "--format", "json",
                             "--with", "plan"]))["sections"]["capacity_plan"]  # fmt: skip
    assert [(r["model"], r["hour"]) for r in hourly["rows"] if r["model"] == "busy"] == [
        ("busy", "2026-11-03T09:00Z")
    ]
    assert "needed" in hourly["columns"] and "long_term" not in hourly["columns"]
    # by model: the unit economics by default; --with none drops it
    assert "sections" in json.loads(_ok([*base, "--by", "model", "--format", "json"]))
    plain = json.loads(_ok([*base, "--by", "model", "--format", "json", "--with", "none"]))
    assert "sections" not in plain
    assert "Unit economics per model and version" in _ok([*base, "--by", "model"])
    _ok([*base, "--format", "html", "-o", str(tmp_path / "r.html")])
    page = (tmp_path / "r.html").read_text()
    for title in ("Unit economics", "Lending:", "Capacity plan", "Budgets this month"):
        assert title in page, title
    for args, message in (
        (["--with", "colour"], "unknown view(s) colour"),
        (["--with", "lending", "--format", "csv"], "the csv format holds the report's lines"),
    ):
        res = RUN.invoke(app, [*base, *args])
        assert res.exit_code != 0 and message in " ".join(res.output.split()), res.output
