"""The deploy files speak of metrics that exist: every `stb_*` series named by the
Grafana dashboard and the alert rules is one the bridge's exporter defines."""

from __future__ import annotations

import json
import re

from prometheus_client.parser import text_string_to_metric_families

from bridge.daemon.metrics import BridgeMetrics
from bridge.paths import project_root

DEPLOY = project_root() / "deploy"


def _exported() -> set[str]:
    from datetime import UTC, datetime

    from prometheus_client import generate_latest

    from bridge.daemon.report import StepError, TickReport

    metrics = BridgeMetrics()
    report = TickReport(
        datetime(2027, 1, 1, tzinfo=UTC),
        errors=[StepError("submit", "permanent", "x", 1)],
        lease_states={"serving": 1},
        p99_ms={"busy": 10.0},
        retries={1: 1},
        lent=["elastic"],
        served=[("elastic", 3.0)],
        returned=[("elastic", "returned", 9.0)],
    )
    metrics.record(report, {"busy": 100.0})
    metrics.decisions.labels("lend", "x").inc()
    metrics.record_exception(RuntimeError("x"))
    text = generate_latest(metrics.registry).decode()
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    return names | _ledger_series()


def _ledger_series() -> set[str]:
    """What the ledger's collector adds (the daemon registers it), with one budget set."""
    import tempfile
    from datetime import UTC, datetime
    from decimal import Decimal
    from pathlib import Path

    from prometheus_client import CollectorRegistry, generate_latest

    from accounting.budget import BudgetSpec, set_budget
    from accounting.db import open_ledger
    from accounting.metrics import LedgerCollector

    with tempfile.TemporaryDirectory() as tmp:
        engine = open_ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        set_budget(engine, BudgetSpec("t", Decimal(1), "gpu-hours"), "x", datetime.now(UTC))
        registry = CollectorRegistry()
        registry.register(LedgerCollector(engine))
        text = generate_latest(registry).decode()
        engine.dispose()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_dashboard_and_alerts_name_only_exported_series() -> None:
    exported = _exported()
    dash = json.loads((DEPLOY / "grafana" / "stb-bridge.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += re.findall(r"expr: (.+)", (DEPLOY / "prometheus" / "alerts.yml").read_text())
    named = {m for e in exprs for m in re.findall(r"\bstb_[a-z0-9_]+", e)}
    assert named and named <= exported, named - exported


def test_systemd_unit_runs_the_daemon_with_a_config() -> None:
    unit = (DEPLOY / "systemd" / "stb-bridge.service").read_text()
    assert "ExecStart=" in unit and "stb daemon --config" in unit
