"""The sources of a model's status other than Prometheus (`bridge.models.status_hour`),
each read for `bridge.models.status.gather` and turned into its part of the status:

- the bridge's database: the model's rollouts (with the share of each step from its plan)
  and its leases, lent now and lent today (`read_database`);
- the Triton servers: each one's repository index and metrics page (`read_servers`; a
  server that does not answer is listed as unreachable), and a version's live figures from
  the pages' samples (`live_figures`);
- the repository's archive: the versions set aside with their `.why`
  (`rejected_versions`) and the retired ones (`retired_versions`);
- the ledger: the model's GPU-hours and cost this month and today (`read_cost`);
- the weight catalogue: the model's node-local copies (`read_weights`).

Reading never creates a database: a SQLite file that is missing is "no database", and a
database that does not answer is said, not raised.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, inspect, make_url
from sqlalchemy.exc import SQLAlchemyError

from accounting.buckets import MS_PER_HOUR
from accounting.errors import LedgerError
from accounting.rates import RateBook, list_rates, money
from accounting.report import Window, build_report
from bridge.db import make_engine
from bridge.leases.rollouts import DONE, OPEN, Rollout, RolloutStore
from bridge.leases.store import LeaseStore
from bridge.leases.weights import WeightCopy, WeightStore
from bridge.lifecycle import LeaseState
from bridge.models.repo import ModelRepository
from bridge.models.status_views import Cost, Live, RolloutView, ServerView
from bridge.policy.rollout import PlanError, parse_plan
from bridge.triton.errors import TritonError
from bridge.triton.metrics import ModelSample, parse_page
from bridge.triton.protocol import TritonInstance


class StatusServer(Protocol):
    """A running Triton server as `gather` reads it (`bridge.models.publish.Server`)."""

    @property
    def address(self) -> str: ...

    @property
    def client(self) -> TritonInstance: ...


@dataclass(frozen=True)
class DbView:
    """What the bridge's database says of the model."""

    open_row: Rollout | None = None
    rollout: RolloutView | None = None
    last_rollout: RolloutView | None = None
    lent: int = 0
    lends_today: int = 0
    note: str = ""


def read_weights(model: str, url: str | None) -> tuple[list[WeightCopy], str]:
    """The catalogue's rows of the model's copies, or none and why (no database, no
    `weight_copy` table: a database older than the cache)."""
    with _existing(url, "weight_copy", "bridge database") as (engine, why):
        if engine is None:
            return [], why
        try:
            return [c for c in WeightStore(engine).copies() if c.model == model], ""
        except SQLAlchemyError as exc:
            return [], f"the weight catalogue does not answer: {exc.__class__.__name__}"


def read_database(model: str, url: str | None, now: datetime) -> DbView:
    """The model's rollouts and leases; none (and why) where there is no database."""
    with _existing(url, "lease", "bridge database") as (engine, why):
        if engine is None:
            return DbView(note=why)
        open_row = view = last = None
        if inspect(engine).has_table("rollout"):
            rollouts = RolloutStore(engine)
            rows = rollouts.of_model(model)
            open_row = next((r for r in rows if r.state in OPEN), None)
            done_row = next((r for r in rows if r.state in DONE), None)
            view = _rollout(open_row, rollouts) if open_row else None
            last = _rollout(done_row, rollouts) if done_row else None
        leases = LeaseStore(engine)
        midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        today = [lz for lz in leases.touched_since(midnight) if lz.created_at >= midnight]
        serving = [lz for lz in leases.open_leases() if lz.state == LeaseState.SERVING]
        return DbView(
            open_row, view, last,
            lent=sum(model in lz.models for lz in serving),
            lends_today=sum(model in lz.models for lz in today),
        )  # fmt: skip


@contextmanager
def _existing(url: str | None, table: str, what: str) -> Iterator[tuple[Engine | None, str]]:
    """An engine on the database at `url` if it exists and has `table`, else None and
    why; a SQLite file is never created by looking."""
    if not url:
        yield None, f"no {what} configured"
        return
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or not Path(database).is_file():
            yield None, f"no {what} at {database or '(memory)'}"
            return
    engine = make_engine(url)
    try:
        try:
            present = inspect(engine).has_table(table)
        except SQLAlchemyError as exc:
            yield None, f"the {what} at {shown} does not answer: {exc.__class__.__name__}"
            return
        if not present:
            yield None, f"the {what} at {shown} has no {table} table"
            return
        yield engine, ""
    finally:
        engine.dispose()


def _rollout(row: Rollout, store: RolloutStore) -> RolloutView:
    assert row.id is not None
    try:
        plan = parse_plan(row.plan, row.hold_s)
    except PlanError:
        plan = ()
    percent = plan[row.step].percent if 0 <= row.step < len(plan) else None
    figures: Mapping[str, Any] = {}
    for event in reversed(store.events(row.id)):
        if event.figures:
            figures = event.figures
            break
    return RolloutView(
        id=row.id, state=row.state, old_version=row.old_version, new_version=row.new_version,
        step=row.step + 1, steps=len(plan) or None, percent=percent,
        since=row.step_started_at or row.created_at, updated_at=row.updated_at,
        reason=row.reason, who=row.who, why=row.why, figures=figures,
    )  # fmt: skip


def read_servers(
    model: str, servers: Sequence[StatusServer] | None
) -> tuple[tuple[ServerView, ...] | None, list[ModelSample]]:
    """Each server's READY versions of `model`, and the model's samples on its page."""
    if servers is None:
        return None, []
    views, samples = [], []
    for s in servers:
        try:
            index = s.client.repository_index()
            page = parse_page(s.client.metrics_text())
        except TritonError as exc:
            views.append(ServerView(s.address, False, error=str(exc)))
            continue
        ready = [m.version for m in index if m.name == model and m.state == "READY"]
        numbered = tuple(sorted({int(v) for v in ready if v.isdigit()}))
        views.append(
            ServerView(s.address, True, numbered, bool(ready), metrics_error=page.error or "")
        )
        samples += [v for (name, _), v in page.models.items() if name == model]
    return tuple(views), samples


def live_figures(samples: Sequence[ModelSample], slo_ms: float | None) -> Live | None:
    if not samples:
        return None
    ok = [s.request_success for s in samples if s.request_success is not None]
    bad = [s.request_failure for s in samples if s.request_failure is not None]
    succeeded = int(sum(ok)) if ok else None
    failed = int(sum(bad)) if bad else None
    total = (succeeded or 0) + (failed or 0)
    rate = (failed or 0) / total if total else None
    p99s = [
        q / 1000.0
        for s in samples
        if s.request_summary is not None and (q := s.request_summary.quantile(0.99)) is not None
    ]
    p99 = max(p99s) if p99s else None
    breach = p99 is not None and slo_ms is not None and p99 > slo_ms
    return Live(succeeded, failed, rate, p99, breach)


def rejected_versions(repo: ModelRepository, model: str) -> dict[int, str]:
    """Version -> why, of the versions set aside (the latest setting aside of each)."""
    folder = repo.archive / repo.model_dir(model).name / "rejected"
    out: dict[int, tuple[str, str]] = {}
    if not folder.is_dir():
        return {}
    for p in folder.iterdir():
        version, _, stamp = p.name.partition("-")
        if not p.is_dir() or not version.isdigit():
            continue
        why_file = folder / f"{p.name}.why"
        why = why_file.read_text().strip() if why_file.is_file() else ""
        if int(version) not in out or out[int(version)][0] < stamp:
            out[int(version)] = (stamp, why)
    return {v: why for v, (_, why) in out.items()}


def retired_versions(repo: ModelRepository, model: str) -> set[int]:
    folder = repo.archive / repo.model_dir(model).name / "retired"
    if not folder.is_dir():
        return set()
    return {
        int(v.name)
        for stamp in folder.iterdir()
        if stamp.is_dir()
        for v in stamp.iterdir()
        if v.is_dir() and v.name.isdigit()
    }


def read_cost(model: str, url: str | None, now: datetime) -> Cost:
    """This month's and today's GPU-hours and cost of `model` in the ledger (UTC)."""
    now = now.astimezone(UTC)
    month, today = Window.parse(f"{now:%Y-%m}"), Window.parse(f"{now:%Y-%m-%d}")
    with _existing(url, "ledger_row", "ledger") as (engine, why):
        if engine is None:
            return Cost(False, month.label, today.label, notes=(why,))
        try:
            return _booked(model, engine, month, today)
        except SQLAlchemyError as exc:
            note = f"the ledger cannot be read: {exc.__class__.__name__}"
            return Cost(False, month.label, today.label, notes=(note,))


def _booked(model: str, engine: Engine, month: Window, today: Window) -> Cost:
    notes: list[str] = []
    try:
        rates: RateBook | None = RateBook(list_rates(engine))
    except LedgerError as exc:  # rates in several currencies: GPU-hours only
        rates, notes = None, [str(exc)]
    reports = []
    for window in (month, today):
        try:
            reports.append(
                build_report(engine, window, ("model",), rates=rates, filters={"model": model})
            )
        except LedgerError as exc:  # no rate for some row: GPU-hours only
            notes.append(f"{exc}; GPU-hours only")
            rates = None
            reports.append(build_report(engine, window, ("model",), filters={"model": model}))
    m, t = reports
    if not m.lines:
        notes.append(f"no ledger rows for {model} in {month.label}")
    return Cost(
        True, month.label, today.label,
        month_gpu_hours=m.total_gpu_ms / MS_PER_HOUR, today_gpu_hours=t.total_gpu_ms / MS_PER_HOUR,
        currency=m.currency if rates else None, month_cost=_money(m.total_cost) if rates else None,
        today_cost=_money(t.total_cost) if rates else None, notes=tuple(dict.fromkeys(notes)),
    )  # fmt: skip


def _money(amount: Decimal | None) -> Decimal | None:
    return None if amount is None else money(amount)
