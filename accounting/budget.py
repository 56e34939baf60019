"""Budgets per team and month: what a team may use (GPU-hours or money), how fast it is
using it, and where it will end the month at that pace.

A budget is one row per team (`Budget`), set with `stb budget set`; the figures come from
the same ledger as every report (the team's allocated GPU time, idle and down lines
excluded; money priced with the rates in force each day). Burn rate is use per elapsed
hour of the month; the forecast adds that rate over the hours left. States: `ok`, `warn`
(80% used, or the forecast over the budget), `over` (100% used). The daemon exports
`stb_budget_used_ratio{team}` and `stb_budget_forecast_ratio{team}`;
deploy/prometheus/alerts.yml alerts at 80% and 100%.

Enforcement is Slurm's, never the bridge's: where a site opts in (`--enforce`), a
GPU-hour budget becomes `GrpTRESMins=gres/gpu=<minutes>` on the team's Slurm account
(`bridge.ledger.limits`), and Slurm holds the account's jobs with its own reason
(AssocGrpGRESMinutes) once the month's usage reaches it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from sqlalchemy import Engine, delete, insert, select, update

from accounting.buckets import MS_PER_HOUR, utc
from accounting.errors import LedgerError
from accounting.rates import RateBook
from accounting.report import Window, build_report
from accounting.schema import CAPACITY_WORKLOADS, Budget
from accounting.section import Section

BUDGETS = Budget.__table__  # type: ignore[attr-defined]
UNITS = ("gpu-hours", "currency")
PERIODS = ("month",)
WARN_AT = Decimal("0.8")


class BudgetError(LedgerError):
    """A budget that cannot be set or read as asked (the message says why)."""


@dataclass(frozen=True)
class BudgetSpec:
    team: str
    amount: Decimal
    unit: str
    currency: str = ""
    period: str = "month"
    enforce: bool = False
    slurm_account: str = ""
    note: str = ""

    def validate(self) -> BudgetSpec:
        if not self.team.strip() or self.team.startswith("("):
            raise BudgetError(f"team {self.team!r}: name a team (not a capacity line)")
        if self.unit not in UNITS:
            raise BudgetError(f"unit {self.unit!r}: choose {' or '.join(UNITS)}")
        if self.period not in PERIODS:
            raise BudgetError(f"period {self.period!r}: only 'month' is supported")
        if not self.amount.is_finite() or self.amount <= 0:
            raise BudgetError(f"amount {self.amount}: must be a positive number")
        if self.unit == "currency" and not re.fullmatch(r"[A-Z]{3}", self.currency):
            raise BudgetError(
                f"currency {self.currency!r}: a money budget needs an ISO 4217 code (EUR, USD)"
            )
        if self.enforce and self.unit != "gpu-hours":
            raise BudgetError(
                "--enforce needs a GPU-hour budget: Slurm limits GPU-minutes, not money"
            )
        return self


def parse_amount(text: str) -> Decimal:
    try:
        value = Decimal(text.strip().replace("_", ""))
    except InvalidOperation as exc:
        raise BudgetError(f"amount {text!r} is not a number") from exc
    return value


def set_budget(engine: Engine, spec: BudgetSpec, by: str, now: datetime) -> bool:
    """Create or replace the team's budget for the period; True when it was new."""
    spec.validate()
    values = {
        "amount": spec.amount, "unit": spec.unit, "currency": spec.currency,
        "enforce": spec.enforce, "slurm_account": spec.slurm_account, "note": spec.note,
        "set_at": utc(now), "set_by": by,
    }  # fmt: skip
    with engine.begin() as conn:
        have = conn.scalar(
            select(BUDGETS.c.id).where(BUDGETS.c.team == spec.team, BUDGETS.c.period == spec.period)
        )
        if have is None:
            conn.execute(insert(BUDGETS).values(team=spec.team, period=spec.period, **values))
            return True
        conn.execute(update(BUDGETS).where(BUDGETS.c.id == have).values(**values))
        return False


def remove_budget(engine: Engine, team: str, period: str = "month") -> bool:
    with engine.begin() as conn:
        done = conn.execute(
            delete(BUDGETS).where(BUDGETS.c.team == team, BUDGETS.c.period == period)
        )
    return bool(done.rowcount)


def budgets(engine: Engine) -> list[BudgetSpec]:
    with engine.connect() as conn:
        rows = conn.execute(select(BUDGETS).order_by(BUDGETS.c.team)).all()
    return [
        BudgetSpec(
            r.team,
            Decimal(r.amount),
            r.unit,
            r.currency,
            r.period,
            bool(r.enforce),
            r.slurm_account,
            r.note,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class BudgetStatus:
    budget: BudgetSpec
    month: str
    #: in the budget's unit (GPU-hours, or money)
    used: Decimal
    burn_per_day: Decimal
    forecast: Decimal

    @property
    def used_ratio(self) -> float:
        return float(self.used / self.budget.amount)

    @property
    def forecast_ratio(self) -> float:
        return float(self.forecast / self.budget.amount)

    @property
    def state(self) -> str:
        if self.used >= self.budget.amount:
            return "over"
        if self.used >= self.budget.amount * WARN_AT or self.forecast > self.budget.amount:
            return "warn"
        return "ok"

    def as_dict(self) -> dict[str, object]:
        b = self.budget
        return {
            "team": b.team, "month": self.month, "unit": b.unit, "currency": b.currency or None,
            "budget": str(b.amount), "used": str(self.used.quantize(Decimal("0.001"))),
            "used_ratio": round(self.used_ratio, 4),
            "burn_per_day": str(self.burn_per_day.quantize(Decimal("0.001"))),
            "forecast": str(self.forecast.quantize(Decimal("0.001"))),
            "forecast_ratio": round(self.forecast_ratio, 4), "state": self.state,
            "enforced_by_slurm": b.enforce, "slurm_account": b.slurm_account or None,
        }  # fmt: skip


def budget_status(
    engine: Engine, now: datetime, *, rates: RateBook | None = None, month: str | None = None
) -> list[BudgetStatus]:
    """Every budget's use so far in `month` (default: now's), burn rate and forecast."""
    specs = budgets(engine)
    if not specs:
        return []
    now = utc(now)
    window = Window.parse(month or now.strftime("%Y-%m"))
    gone = min(max(now, window.start), window.end) - window.start
    total = window.end - window.start
    money = [b for b in specs if b.unit == "currency"]
    if money and not rates:
        raise BudgetError(
            f"money budget(s) of {', '.join(b.team for b in money)} need rates: "
            "stb accounting rates add ..."
        )
    for b in money:
        if rates and b.currency != rates.currency:
            raise BudgetError(f"budget of {b.team} is in {b.currency}, rates in {rates.currency}")
    report = build_report(engine, window, ("team", "workload"), rates=rates if money else None)
    hours: dict[str, Decimal] = {}
    cost: dict[str, Decimal] = {}
    for line in report.lines:
        if line.keys["workload"] in CAPACITY_WORKLOADS:
            continue
        team = line.keys["team"]
        hours[team] = hours.get(team, Decimal(0)) + Decimal(line.gpu_ms) / MS_PER_HOUR
        cost[team] = cost.get(team, Decimal(0)) + (line.cost or Decimal(0))
    out = []
    days_gone = Decimal(gone / timedelta(days=1))
    left_days = Decimal((total - gone) / timedelta(days=1))
    for b in specs:
        used = (
            cost.get(b.team, Decimal(0)) if b.unit == "currency" else hours.get(b.team, Decimal(0))
        )
        burn = used / days_gone if days_gone > 0 else Decimal(0)
        out.append(BudgetStatus(b, window.label, used, burn, used + burn * left_days))
    return out


BUDGET_COLUMNS = (
    "team", "month", "unit", "budget", "used", "used_ratio", "burn_per_day", "forecast",
    "forecast_ratio", "state", "enforced_by_slurm",
)  # fmt: skip


def budget_section(statuses: Sequence[BudgetStatus]) -> Section:
    """The budgets beside a report: use so far, burn rate, month-end forecast, state."""
    rows = []
    for st in statuses:
        d = st.as_dict()
        unit = "GPU-hours" if st.budget.unit == "gpu-hours" else st.budget.currency
        rows.append({**{c: d[c] for c in BUDGET_COLUMNS}, "unit": unit})
    notes = [] if rows else ["no budgets set (stb budget set TEAM AMOUNT)"]
    notes += [
        f"state: warn at {WARN_AT:.0%} used or a month-end forecast over the budget, over at "
        "100%; forecast: use so far plus the burn rate per day over the days left"
    ]
    return Section("budgets", "Budgets this month", BUDGET_COLUMNS, rows, notes)
