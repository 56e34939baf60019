"""The views shown beside a GPU-hour report (`stb report --with ...`, and all of them in
the HTML report): unit economics per model and version (`accounting.economics`), lending
and what its transitions cost (`bridge.ledger.lending`), the capacity plan
(`bridge.ledger.replica_plan`) and the budgets (`accounting.budget`). Each is a `Section`; this
module only picks them and gives each what it reads from the bridge's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, inspect, make_url

from accounting.budget import BudgetError, budget_section, budget_status
from accounting.economics import FILTER_KEYS, unit_economics
from accounting.errors import WindowError
from accounting.rates import RateBook
from accounting.report import Window
from accounting.section import Section
from bridge.config import BridgeConfig
from bridge.db import make_engine
from bridge.ledger import lending
from bridge.ledger.feed import slice_rules
from bridge.ledger.lending import lending_section
from bridge.ledger.replica_plan import plan_section, typical_gpus
from bridge.slurm.slices import SliceRules
from bridge.triton.catalog import site_models

VIEWS = ("economics", "lending", "plan", "budgets")


def parse_views(text: str | None, fmt: str, by: Sequence[str]) -> tuple[str, ...]:
    """`--with`: comma-separated views, or "none". Default: every view in HTML, the unit
    economics when the report is by model, else none."""
    if text is None:
        if fmt == "html":
            return VIEWS
        return ("economics",) if "model" in by else ()
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if names == ("none",):
        return ()
    bad = [v for v in names if v not in VIEWS]
    if bad or not names:
        raise WindowError(
            f"--with {text!r}: unknown view(s) {', '.join(bad) or '(none named)'}; choose from "
            f"{', '.join(VIEWS)} or none"
        )
    return tuple(dict.fromkeys(names))


def _lending(
    url: str,
    ledger: Engine,
    window: Window,
    rates: RateBook | None,
    now: datetime,
    rules: SliceRules | None = None,
) -> Section:
    """The lending view, reading the lease history without creating it: a report never
    writes the bridge's database (where there is none, the section says so)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        return _no_leases(f"no lease database at {parsed.database or '(memory)'}")
    leases = make_engine(url)
    try:
        if not inspect(leases).has_table("lease"):
            return _no_leases("the bridge's database has no lease history")
        return lending_section(ledger, leases, window, rates, now=now, rules=rules)
    finally:
        leases.dispose()


def _no_leases(why: str) -> Section:
    return Section(lending.KEY, lending.TITLE, (), [], [why])


def build_sections(
    config: BridgeConfig,
    ledger: Engine,
    window: Window,
    views: Sequence[str],
    rates: RateBook | None,
    filters: Mapping[str, str],
    now: datetime,
    step: str | None = None,
) -> list[Section]:
    """The sections of `views`, in the order of `VIEWS`. The report's filters narrow the
    unit economics where it has the key (model, team, cluster); a report by hour has the
    capacity plan hour by hour."""
    out: list[Section] = []
    if "economics" in views:
        kept = {k: v for k, v in filters.items() if k in FILTER_KEYS}
        out.append(unit_economics(ledger, window, rates, filters=kept))
    if "lending" in views:
        out.append(_lending(config.database_url, ledger, window, rates, now, slice_rules(config)))
    if "plan" in views:
        gpus = typical_gpus(ledger)
        hourly = step == "hour"
        cv2 = config.policy.service_cv2
        # the models as the daemon scales them: the repository's with the TOML's overrides
        models = site_models(config).scaled
        out.append(plan_section(ledger, window, models, gpus, hourly=hourly, cv2=cv2))
    if "budgets" in views:
        try:
            out.append(budget_section(budget_status(ledger, now, rates=rates or None)))
        except BudgetError as exc:  # a money budget without rates: say so, keep the report
            out.append(replace(budget_section([]), notes=[str(exc)]))
    return out
