"""Team budgets (accounting.budget): validation, burn rate and forecast from the ledger,
states; the Slurm settings enforcement needs (bridge.ledger.limits)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Engine

from accounting.attribution import Entry
from accounting.budget import BudgetError, BudgetSpec, budget_status, budgets, set_budget
from accounting.db import open_ledger
from accounting.rates import RateBook, RateSpec, add_rates, list_rates
from bridge.config import BridgeConfig
from bridge.ledger.limits import REQUIRED, EnforcementError, check_enforcement, team_account
from tests.unit.helpers import insert_entries

NOW = datetime(2026, 11, 11, tzinfo=UTC)  # 10 of November's 30 days gone


def _ledger(tmp_path: Path) -> Engine:
    engine = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    entries = [
        # team-a: 100 GPU-hours in the first ten days, team-b 10; idle and down are no use
        Entry(datetime(2026, 11, 2, 3, tzinfo=UTC), "c", "train", "train", "training", "a",
              "team-a", "u", "", "h100", "normal", "", 100 * 3_600_000),
        Entry(datetime(2026, 11, 5, 3, tzinfo=UTC), "c", "train", "train", "training", "b",
              "team-b", "u", "", "h100", "normal", "", 10 * 3_600_000),
        Entry(datetime(2026, 11, 5, 3, tzinfo=UTC), "c", "train", "", "idle", "", "(idle)",
              "", "", "h100", "", "", 50 * 3_600_000),
        Entry(datetime(2026, 11, 5, 4, tzinfo=UTC), "c", "train", "", "down", "", "(down)",
              "root", "", "h100", "", "", 7 * 3_600_000),
    ]  # fmt: skip
    insert_entries(engine, entries)
    return engine


def test_burn_rate_forecast_and_states(tmp_path: Path) -> None:
    engine = _ledger(tmp_path)
    set_budget(engine, BudgetSpec("team-a", Decimal(250), "gpu-hours"), "alice", NOW)
    set_budget(engine, BudgetSpec("team-b", Decimal(100), "gpu-hours"), "alice", NOW)
    set_budget(engine, BudgetSpec("team-c", Decimal(10), "gpu-hours"), "alice", NOW)
    rows = {r.budget.team: r for r in budget_status(engine, NOW)}
    a = rows["team-a"]
    assert a.used == 100 and a.burn_per_day == 10 and a.forecast == 300
    assert a.state == "warn"  # 40% used but on course for 120%
    assert rows["team-b"].used == 10 and rows["team-b"].forecast == 30
    assert rows["team-b"].state == "ok"
    assert rows["team-c"].used == 0 and rows["team-c"].state == "ok"
    set_budget(engine, BudgetSpec("team-a", Decimal(90), "gpu-hours"), "bob", NOW)
    assert {r.budget.team: r for r in budget_status(engine, NOW)}["team-a"].state == "over"
    assert [b.amount for b in budgets(engine) if b.team == "team-a"] == [Decimal(90)]


def test_money_budget_priced_with_the_rates(tmp_path: Path) -> None:
    engine = _ledger(tmp_path)
    add_rates(engine, [RateSpec("h100", Decimal("2.50"), date(2026, 1, 1), currency="EUR")])
    set_budget(engine, BudgetSpec("team-a", Decimal(1000), "currency", "EUR"), "alice", NOW)
    with pytest.raises(BudgetError, match="need rates"):
        budget_status(engine, NOW)
    (row,) = budget_status(engine, NOW, rates=RateBook(list_rates(engine)))
    assert row.used == 250 and row.used_ratio == 0.25 and row.forecast == 750
    assert row.state == "ok"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (BudgetSpec("", Decimal(1), "gpu-hours"), "name a team"),
        (BudgetSpec("(idle)", Decimal(1), "gpu-hours"), "name a team"),
        (BudgetSpec("t", Decimal(0), "gpu-hours"), "positive"),
        (BudgetSpec("t", Decimal("NaN"), "gpu-hours"), "positive"),
        (BudgetSpec("t", Decimal(1), "hours"), "unit"),
        (BudgetSpec("t", Decimal(1), "gpu-hours", period="week"), "month"),
        (BudgetSpec("t", Decimal(1), "currency", "euro"), "ISO 4217"),
        (BudgetSpec("t", Decimal(1), "currency", "EUR", enforce=True), "GPU-hour budget"),
    ],
)
def test_bad_budgets_are_refused(spec: BudgetSpec, match: str, tmp_path: Path) -> None:
    engine = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(BudgetError, match=match):
        set_budget(engine, spec, "alice", NOW)
    assert budgets(engine) == []


def test_enforcement_needs_slurm_to_count_the_month() -> None:
    check_enforcement(dict(REQUIRED) | {"AccountingStorageEnforce": "associations,limits,safe"})
    with pytest.raises(EnforcementError) as exc:
        check_enforcement(
            {"PriorityType": "priority/basic", "AccountingStorageEnforce": "associations",
             "PriorityDecayHalfLife": "7-00:00:00", "PriorityUsageResetPeriod": "NONE"}
        )  # fmt: skip
    for key in REQUIRED:
        assert key in str(exc.value)


def test_team_account() -> None:
    cfg = BridgeConfig.model_validate(
        {"accounting": {"teams": {"a1": "team-x", "a2": "team-x", "b": "team-y"}}}
    )
    assert team_account(cfg, "team-y") == "b"
    assert team_account(cfg, "team-z") == "team-z"
    assert team_account(cfg, "team-x", "parent-x") == "parent-x"
    with pytest.raises(EnforcementError, match="a1, a2"):
        team_account(cfg, "team-x")


def test_budget_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from accounting.metrics import LedgerCollector

    engine = _ledger(tmp_path)
    # the metrics are of the month now is in: 25 GPU-hours of team-a at its first hour
    now = datetime.now(UTC)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    insert_entries(engine, [Entry(first, "c", "train", "train", "training", "a", "team-a", "u", "",
                           "h100", "normal", "", 25 * 3_600_000)])  # fmt: skip
    set_budget(engine, BudgetSpec("team-a", Decimal(50), "gpu-hours"), "alice", now)
    registry = CollectorRegistry()
    registry.register(LedgerCollector(engine))
    assert registry.get_sample_value("stb_budget_used_ratio", {"team": "team-a"}) == 0.5
    forecast = registry.get_sample_value("stb_budget_forecast_ratio", {"team": "team-a"})
    assert forecast is not None and forecast >= 0.5
