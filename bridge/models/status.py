"""One model's status as its team sees it: `gather` reads each fact from the one place that
holds it and `render` prints it; `stb models status M` (bridge.models.cli) and the daemon's
`GET /api/models/status?model=M` (bridge.daemon.api) both call `gather`.

Where each fact comes from:
- team, SLO and replica bounds: the model's facts as the daemon scales it
  (`bridge.modelfacts.ModelFacts`: the repository's config.pbtxt with the TOML's overrides);
- versions and their state: the repository (`ModelRepository`: the versions Triton sees,
  the archive's rejected and retired ones, each with its `.why`), the journal
  (`bridge.models.history`: who published which version when) and the open rollout;
- rollouts: the bridge's database (`bridge.leases.rollouts.RolloutStore`), the share of a
  step from its plan (`bridge.policy.rollout.parse_plan`);
- where each version serves and its live figures: the Triton servers given (each one's
  repository index and metrics page); a server that does not answer is listed as
  unreachable. The figures are Triton's own: counters since the version was loaded and
  its p99 over a 60 s window; the ledger keeps the longer history;
- each version's last hour, where the site runs Prometheus (`[observe]` names it: `source =
  "prometheus"`, or a `prometheus_url` set): three instant queries as of `now` through the
  bridge's own client and timeout (`bridge.triton.prometheus.PrometheusSignal.instant`),
  on the raw series Prometheus scrapes from every Triton server (`job="triton"`, as
  deploy/prometheus/rules.yml selects them; its recording rules sum over the versions, so
  they cannot give a version's figures): `increase(...[1h])` of the success and failure
  counters summed per version over the servers, and `max_over_time` of Triton's p99
  (`nv_inference_request_summary_us{quantile="0.99"}`), the highest over the servers.
  That p99 is the highest of Triton's 60 s p99 windows over the hour: an upper bound of
  the hour's p99, not the hour's p99 itself (a summary's quantiles cannot be combined).
  `last_hour_note` says the source, or why there are no such figures (no Prometheus
  configured, or it did not answer: a note, never an exception);
- replicas now and lends today: the servers holding the model READY, and the lease store;
- GPU-hours and cost: the ledger's report for the model, this month and today.

Reading never creates a database: a SQLite file that is missing is "no database" (as the
reports do, `bridge.ledger.views`), and a database that does not answer is said, not
raised; so is a Prometheus that does not answer. A model the repository lacks and the
journal never saw is `UnknownModel`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy import Engine, inspect, make_url
from sqlalchemy.exc import SQLAlchemyError

from accounting.buckets import MS_PER_HOUR
from accounting.errors import LedgerError
from accounting.rates import RateBook, list_rates, money
from accounting.report import Window, build_report
from bridge.config import ObserveConfig
from bridge.db import make_engine
from bridge.leases.rollouts import DONE, OPEN, Rollout, RolloutStore
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState
from bridge.modelfacts import ModelFacts
from bridge.models import history
from bridge.models.repo import ModelRepository
from bridge.policy.rollout import PlanError, parse_plan
from bridge.triton.errors import TritonError
from bridge.triton.metrics import ModelSample, parse_page
from bridge.triton.prometheus import PrometheusError, PrometheusSignal
from bridge.triton.protocol import TritonInstance

#: said beside the live figures, in the table and the JSON
LIVE_NOTE = (
    "live figures are Triton's own: requests since each version was loaded (summed over "
    "the servers) and its p99 over the last 60 s (the highest of the servers); the "
    "daemon's ledger keeps the longer history"
)
#: said beside the last hour's figures, in the table and the JSON
LAST_HOUR_P99_NOTE = (
    "last-hour p99 is the highest of Triton's 60 s p99 windows over the hour (and over the "
    "servers): an upper bound of the hour's p99, not the hour's p99 itself"
)
#: the note where the bridge's configuration names no Prometheus server
NO_PROMETHEUS = "no Prometheus configured"
#: the last-hour window, as PromQL writes it
WINDOW = "1h"
#: the words of the open rollout's states, for the new version
_NEW_LABEL = {"pending": "pending", "promoting": "promoting", "rolling_back": "rolling back"}


class UnknownModel(LookupError):
    """The repository has no such model and the journal never saw it."""


class StatusServer(Protocol):
    """A running Triton server as `gather` reads it (`bridge.models.publish.Server`)."""

    @property
    def address(self) -> str: ...

    @property
    def client(self) -> TritonInstance: ...


@dataclass(frozen=True)
class Facts:
    """What the daemon scales the model by (None: not set; `why` says why not scaled)."""

    team: str | None
    slo_p99_ms: float | None
    min_replicas: int | None
    max_replicas: int | None
    #: field -> where its value came from (repository, toml, default)
    sources: Mapping[str, str]
    scaled: bool
    why: str = ""
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Live:
    """One version's figures from the servers' metrics pages (None: no server said)."""

    succeeded: int | None
    failed: int | None
    failure_rate: float | None
    p99_ms: float | None
    #: p99 over the model's SLO
    breach: bool


@dataclass(frozen=True)
class LastHour:
    """One version's last hour from Prometheus, summed over the servers (None: no series).
    Counts are `increase` over the hour: extrapolated, so not always whole numbers."""

    #: successes and failures
    requests: float | None
    succeeded: float | None
    failures: float | None
    failure_rate: float | None
    #: the highest of Triton's 60 s p99 windows in the hour: an upper bound of its p99
    p99_ms: float | None
    #: p99 over the model's SLO
    breach: bool


@dataclass(frozen=True)
class VersionView:
    version: int
    #: serving, canary, pending, promoting, rolling_back, old, rolled_back, superseded,
    #: retired or gone (published once, in neither the repository nor its archive)
    state: str
    #: the state in words: "canary at 10%", "rolled back: p99 over the SLO", ...
    label: str
    #: the canary's share of the model's requests (state canary only)
    percent: float | None = None
    #: why it was rolled back (state rolled_back)
    why: str = ""
    #: its last publish in the journal
    published_at: datetime | None = None
    published_by: str = ""
    #: the servers where it is READY
    served_on: tuple[str, ...] = ()
    live: Live | None = None
    #: its last hour from Prometheus (None: none; `ModelStatus.last_hour_note` says why)
    last_hour: LastHour | None = None


@dataclass(frozen=True)
class RolloutView:
    id: int
    state: str
    old_version: int
    new_version: int
    #: the step in progress (or last reached), counted from 1, of `steps`
    step: int
    steps: int | None
    #: that step's share of the model's requests to the new version
    percent: float | None
    #: when the step began (or the rollout, before its first step)
    since: datetime
    updated_at: datetime
    #: why it is where it is (the last verdict that moved it)
    reason: str
    who: str
    why: str
    #: the figures the last verdict judged ({} when none)
    figures: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerView:
    address: str
    reachable: bool
    #: the model's versions READY there
    versions: tuple[int, ...] = ()
    #: the model READY there (a version Triton does not number counts too)
    holds: bool = False
    error: str = ""
    #: why its metrics page gave no figures ("" when it did)
    metrics_error: str = ""


@dataclass(frozen=True)
class Replicas:
    #: servers holding the model READY (None: the servers are unknown)
    now: int | None
    #: of them, open leases in state serving that carry the model
    lent: int
    #: leases carrying the model created since UTC midnight
    lends_today: int
    note: str = ""


@dataclass(frozen=True)
class Cost:
    """The model's GPU-hours and cost from the ledger (cost None: no rates)."""

    ledger: bool
    month: str
    today: str
    month_gpu_hours: float = 0.0
    today_gpu_hours: float = 0.0
    currency: str | None = None
    month_cost: Decimal | None = None
    today_cost: Decimal | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelStatus:
    model: str
    at: datetime
    facts: Facts | None
    versions: tuple[VersionView, ...]
    #: the open rollout, and the last one that ended
    rollout: RolloutView | None
    last_rollout: RolloutView | None
    #: None: the servers are unknown (`servers_note` says why)
    servers: tuple[ServerView, ...] | None
    replicas: Replicas
    cost: Cost
    servers_note: str = ""
    notes: tuple[str, ...] = ()
    #: where the versions' `last_hour` came from ("prometheus <url>, 1h window"), or why not
    last_hour_note: str = NO_PROMETHEUS

    def to_json(self) -> dict[str, Any]:
        doc = _plain(self)
        assert isinstance(doc, dict)
        doc["live_note"] = LIVE_NOTE
        doc["last_hour_p99_note"] = LAST_HOUR_P99_NOTE
        return doc


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# --- gathering -------------------------------------------------------------------------


def check_known(model: str, repo: ModelRepository) -> history.Journal:
    """The model's journal; `UnknownModel` when neither the repository nor the journal
    knows it (`RepositoryError` for a name that is no plain folder name)."""
    repo.model_dir(model)
    journal = history.read(repo.archive, model)
    if model not in repo.models() and not journal.entries:
        raise UnknownModel(
            f"no model {model!r} in {repo.root} and none in its history "
            f"({repo.archive / history.FILE})"
        )
    return journal


def gather(
    model: str,
    repo: ModelRepository,
    facts: ModelFacts,
    *,
    database_url: str | None,
    ledger_url: str | None,
    servers: Sequence[StatusServer] | None,
    now: datetime,
    servers_note: str = "",
    observe: ObserveConfig | None = None,
) -> ModelStatus:
    """`model`'s status now. `servers` None: unknown (say why in `servers_note`);
    `database_url`/`ledger_url` None: none; `observe` (the bridge's `[observe]`) names the
    Prometheus server asked for each version's last hour (None: no Prometheus). The
    last-hour p99 is the highest of Triton's 60 s p99 windows over the hour: an upper
    bound of the hour's p99. Reads only: creates no database or file."""
    journal = check_known(model, repo)
    notes = []
    if journal.skipped:
        notes.append(f"{journal.skipped} line(s) of the journal are no entry and are left out")
    db = _database(model, database_url, now)
    views, samples = _servers(model, servers)
    slo = _facts(model, facts)
    hours, hour_note = last_hour(
        model, prometheus_url(observe), now, slo.slo_p99_ms if slo else None,
        timeout_s=observe.timeout_s if observe else 3.0,
    )  # fmt: skip
    versions = _versions(model, repo, journal, db.open_row, views, samples, slo, hours)
    replicas = Replicas(
        now=None if views is None else sum(v.holds for v in views),
        lent=db.lent,
        lends_today=db.lends_today,
        note=db.note,
    )
    return ModelStatus(
        model=model, at=now, facts=slo, versions=versions, rollout=db.rollout,
        last_rollout=db.last_rollout, servers=views, replicas=replicas,
        cost=_cost(model, ledger_url, now), servers_note=servers_note, notes=tuple(notes),
        last_hour_note=hour_note,
    )  # fmt: skip


@dataclass(frozen=True)
class _Db:
    """What the bridge's database says of the model."""

    open_row: Rollout | None = None
    rollout: RolloutView | None = None
    last_rollout: RolloutView | None = None
    lent: int = 0
    lends_today: int = 0
    note: str = ""


def _database(model: str, url: str | None, now: datetime) -> _Db:
    """The model's rollouts and leases; none (and why) where there is no database."""
    with _existing(url, "lease", "bridge database") as (engine, why):
        if engine is None:
            return _Db(note=why)
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
        return _Db(
            open_row, view, last,
            lent=sum(model in lz.models for lz in serving),
            lends_today=sum(model in lz.models for lz in today),
        )  # fmt: skip


def _facts(model: str, facts: ModelFacts) -> Facts | None:
    fact = facts.facts.get(model)
    if fact is None:
        return None
    m = fact.model
    return Facts(
        team=fact.team,
        slo_p99_ms=m.slo_p99_ms if m else None,
        min_replicas=m.min_replicas if m else None,
        max_replicas=m.max_replicas if m else None,
        sources=dict(fact.sources),
        scaled=m is not None,
        why=fact.why,
        problems=fact.problems,
    )


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


def _servers(
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


def _live(samples: Sequence[ModelSample], slo_ms: float | None) -> Live | None:
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


def prometheus_url(observe: ObserveConfig | None) -> str | None:
    """The Prometheus server `[observe]` names: its `prometheus_url` where the signal comes
    from Prometheus or the URL is set (its default alone names none); else None."""
    if observe is None:
        return None
    if observe.source == "prometheus" or "prometheus_url" in observe.model_fields_set:
        return observe.prometheus_url
    return None


def _promql_string(text: str) -> str:
    """`text` inside a PromQL double-quoted string (model names are validated already)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def last_hour_queries(model: str) -> dict[str, str]:
    """The instant queries of `model`'s last hour, per version: successes and failures
    over the hour (summed over the servers), and the highest of Triton's 60 s p99
    windows in it (microseconds), on the series Prometheus scrapes from the Triton servers."""
    sel = f'job="triton",model="{_promql_string(model)}"'

    def increase(counter: str) -> str:
        return f"sum by (version) (increase({counter}{{{sel}}}[{WINDOW}]))"

    return {
        "succeeded": increase("nv_inference_request_success"),
        "failures": increase("nv_inference_request_failure"),
        "p99_us": "max by (version) (max_over_time("
        f'nv_inference_request_summary_us{{{sel},quantile="0.99"}}[{WINDOW}]))',
    }


def last_hour(
    model: str, url: str | None, now: datetime, slo_ms: float | None, *, timeout_s: float = 3.0
) -> tuple[dict[int, LastHour], str]:
    """Each version's last hour as of `now` from the Prometheus at `url`, and the note
    saying the source or why there is none (no Prometheus, or it did not answer: never
    raised)."""
    if not url:
        return {}, NO_PROMETHEUS
    answers: dict[str, dict[int, float | None]] = {}
    signal = PrometheusSignal(url, timeout_s=timeout_s)
    try:
        for what, query in last_hour_queries(model).items():
            series = signal.instant(query, now.timestamp())
            answers[what] = {
                int(labels["version"]): value
                for labels, value in series
                if labels.get("version", "").isdigit()
            }
    except PrometheusError as exc:
        return {}, f"Prometheus did not answer: {exc}"
    finally:
        signal.close()
    out = {}
    ok, bad, p99_us = answers["succeeded"], answers["failures"], answers["p99_us"]
    for v in sorted({*ok, *bad, *p99_us}):
        succeeded, failures = ok.get(v), bad.get(v)
        requests = (
            None if succeeded is None and failures is None else (succeeded or 0) + (failures or 0)
        )
        rate = (failures or 0) / requests if requests else None
        us = p99_us.get(v)
        p99 = None if us is None else us / 1000.0
        out[v] = LastHour(
            requests=_round(requests), succeeded=_round(succeeded), failures=_round(failures),
            failure_rate=rate, p99_ms=p99,
            breach=p99 is not None and slo_ms is not None and p99 > slo_ms,
        )  # fmt: skip
    return out, f"prometheus {signal.url}, {WINDOW} window"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _rejected(repo: ModelRepository, model: str) -> dict[int, str]:
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


def _retired(repo: ModelRepository, model: str) -> set[int]:
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


def _versions(
    model: str,
    repo: ModelRepository,
    journal: history.Journal,
    open_row: Rollout | None,
    servers: Sequence[ServerView] | None,
    samples: Sequence[ModelSample],
    facts: Facts | None,
    hours: Mapping[int, LastHour],
) -> tuple[VersionView, ...]:
    present = repo.versions(model)
    latest = present[-1] if present else None
    rejected, retired = _rejected(repo, model), _retired(repo, model)
    published: dict[int, history.Entry] = {}
    for e in journal.entries:
        if e.version is not None and e.action in ("publish", "canary"):
            published[e.version] = e
    by_version: dict[int, list[ModelSample]] = {}
    for s in samples:
        if s.version.isdigit():
            by_version.setdefault(int(s.version), []).append(s)
    where: dict[int, list[str]] = {}
    for server in servers or ():
        for v in server.versions:
            where.setdefault(v, []).append(server.address)
    known = {*present, *rejected, *retired, *published, *by_version, *where, *hours}
    if open_row is not None:
        known |= {open_row.old_version, open_row.new_version}
    slo = facts.slo_p99_ms if facts else None
    out: list[VersionView] = []
    for v in sorted(known, reverse=True):
        state, label, percent, why = _state(v, present, latest, rejected, retired, open_row)
        entry = published.get(v)
        view = VersionView(
            version=v, state=state, label=label, percent=percent, why=why,
            published_at=entry.at if entry else None, published_by=entry.who if entry else "",
            served_on=tuple(where.get(v, ())), live=_live(by_version.get(v, []), slo),
            last_hour=hours.get(v),
        )  # fmt: skip
        out.append(view)
    return tuple(out)


def _state(
    v: int,
    present: Sequence[int],
    latest: int | None,
    rejected: Mapping[int, str],
    retired: set[int],
    open_row: Rollout | None,
) -> tuple[str, str, float | None, str]:
    """(state, label, canary share, why) of version `v`."""
    if open_row is not None and v == open_row.new_version:
        if open_row.state == "running":
            try:
                share: float | None = parse_plan(open_row.plan, open_row.hold_s)[
                    open_row.step
                ].percent
            except (PlanError, IndexError):
                share = None
            shown = "?" if share is None else f"{share:g}"
            return "canary", f"canary at {shown}%", share, ""
        return open_row.state, _NEW_LABEL.get(open_row.state, open_row.state), None, ""
    if open_row is not None and v == open_row.old_version and v in present:
        return "old", "old (beside canary)", None, ""
    if v in present:
        if v == latest and open_row is None:
            return "serving", "serving", None, ""
        return "superseded", "superseded", None, ""
    if v in rejected:
        why = rejected[v]
        return "rolled_back", f"rolled back: {why}" if why else "rolled back", None, why
    if v in retired:
        return "retired", "retired", None, ""
    return "gone", "not in the repository", None, ""


def _cost(model: str, url: str | None, now: datetime) -> Cost:
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


# --- rendering -------------------------------------------------------------------------


def render(status: ModelStatus, console: Console) -> None:
    """The status for a terminal: the facts, the versions with where they serve, their
    live figures and their last hour (where Prometheus gives it), the rollouts, the
    servers, replicas and lends, GPU-hours and cost."""
    f = status.facts
    head = f"[bold]{escape(status.model)}[/bold]"
    if f is None:
        head += "  [yellow]no facts: the repository and the TOML do not name it[/yellow]"
    else:
        slo = f"{f.slo_p99_ms:g} ms" if f.slo_p99_ms is not None else "none"
        head += f"  team {escape(f.team or '-')}  SLO p99 {slo}{_src(f, 'slo_p99_ms')}"
        if f.min_replicas is not None and f.max_replicas is not None:
            head += f"  replicas {f.min_replicas}{_src(f, 'min_replicas')}"
            head += f"-{f.max_replicas}{_src(f, 'max_replicas')}"
        if not f.scaled:
            head += f"  [yellow]{escape(f.why)}[/yellow]"
    console.print(head, highlight=False)
    for problem in f.problems if f else ():
        console.print(f"  [red]{escape(problem)}[/red]", highlight=False)
    r = status.replicas
    now = "unknown" if r.now is None else str(r.now)
    line = f"replicas now {now} ({r.lent} on lent nodes); lends today {r.lends_today}"
    console.print(line + (f"  [dim]{escape(r.note)}[/dim]" if r.note else ""), highlight=False)
    console.print(_versions_table(status))
    console.print(f"[dim]{LIVE_NOTE}[/dim]", highlight=False)
    console.print(f"[dim]last hour: {escape(status.last_hour_note)}[/dim]", highlight=False)
    if any(v.last_hour is not None for v in status.versions):
        console.print(f"[dim]{LAST_HOUR_P99_NOTE}[/dim]", highlight=False)
    if status.rollout is not None:
        console.print(f"rollout open: {_rollout_line(status.rollout)}", highlight=False)
    if status.last_rollout is not None:
        console.print(f"last rollout: {_rollout_line(status.last_rollout)}", highlight=False)
    if status.rollout is None and status.last_rollout is None:
        console.print("no rollout", highlight=False)
    console.print(_servers_table(status))
    c = status.cost
    if c.ledger:
        console.print(
            f"GPU-hours: this month ({c.month}) {c.month_gpu_hours:.2f}"
            f"{_money_text(c.month_cost, c.currency)}, today ({c.today}) "
            f"{c.today_gpu_hours:.2f}{_money_text(c.today_cost, c.currency)}",
            highlight=False,
        )
    else:
        console.print("GPU-hours: no ledger", highlight=False)
    for note in (*c.notes, *status.notes):
        console.print(f"[dim]{escape(note)}[/dim]", highlight=False)


def _src(f: Facts, name: str) -> str:
    return " (toml)" if f.sources.get(name) == "toml" else ""


def _when(at: datetime | None) -> str:
    return "-" if at is None else f"{at:%Y-%m-%d %H:%M:%S}"


def _versions_table(status: ModelStatus) -> Table:
    slo = status.facts.slo_p99_ms if status.facts else None
    p99 = f"p99 ms\n(SLO {slo:g})" if slo is not None else "p99 ms"
    # the figures' headers on two lines: the table fits 200 columns
    table = Table(
        "version", "state", "published (UTC)", "by", "served on",
        "succeeded", "failed", "failure\n%", p99,
        "1h\nrequests", "1h\nfailure %", "1h p99 ms\n(max)", title="versions",
    )  # fmt: skip
    for v in status.versions:
        live, hour = v.live, v.last_hour
        if live is None:
            figures: tuple[str, ...] = ("-", "-", "-", "-")
        else:
            figures = (
                _count(live.succeeded), _count(live.failed),
                _percent(live.failure_rate), _p99(live.p99_ms, live.breach),
            )  # fmt: skip
        if hour is None:
            figures += ("-", "-", "-")
        else:
            requests = None if hour.requests is None else round(hour.requests)
            figures += (
                _count(requests), _percent(hour.failure_rate), _p99(hour.p99_ms, hour.breach)
            )  # fmt: skip
        state = escape(v.label)
        if v.state == "rolled_back":
            state = f"[red]{state}[/red]"
        elif v.state == "serving":
            state = f"[green]{state}[/green]"
        table.add_row(
            str(v.version), state, _when(v.published_at), escape(v.published_by) or "-",
            escape(", ".join(v.served_on)) or "-", *figures,
        )  # fmt: skip
    return table


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.2f}"


def _p99(ms: float | None, breach: bool) -> str:
    shown = "-" if ms is None else f"{ms:.1f}"
    return f"[red]{shown} breach[/red]" if breach else shown


def _rollout_line(r: RolloutView) -> str:
    what = f"version {r.new_version} beside {r.old_version}, {r.state.replace('_', ' ')}"
    if r.state in OPEN:
        steps = "?" if r.steps is None else str(r.steps)
        share = "?" if r.percent is None else f"{r.percent:g}"
        what += f", step {r.step} of {steps} at {share}% since {_when(r.since)}"
    else:
        what += f" at {_when(r.updated_at)}"
    if r.reason:
        what += f": {r.reason}"
    return escape(what)


def _servers_table(status: ModelStatus) -> Table:
    table = Table("server", "state", escape(f"{status.model} READY"), title="servers")
    if status.servers is None:
        table.add_row("[yellow]unknown[/yellow]", escape(status.servers_note) or "-", "-")
        return table
    if not status.servers:
        table.add_row("-", "no running Triton server", "-")
    for s in status.servers:
        if not s.reachable:
            table.add_row(escape(s.address), f"[red]unreachable[/red]: {escape(s.error)}", "-")
            continue
        state = "up" + (f" (metrics: {escape(s.metrics_error)})" if s.metrics_error else "")
        ready = ", ".join(f"v{v}" for v in s.versions) or ("yes" if s.holds else "-")
        table.add_row(escape(s.address), state, ready)
    return table


def _money_text(amount: Decimal | None, currency: str | None) -> str:
    return "" if amount is None else f", {amount} {currency or ''}".rstrip()
