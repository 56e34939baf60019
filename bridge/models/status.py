"""One model's status as its team sees it: `gather` reads each fact from the one place that
holds it, and works out each version's state; `stb models status M` (bridge.models.cli)
and the daemon's `GET /api/models/status?model=M` (bridge.http.routes) both call `gather`.
The status's parts are in `bridge.models.status_views`, its rendering for a terminal in
`bridge.models.status_render`.

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
- each version's last hour, where the site runs Prometheus (`[observe]` names it): three
  instant queries as of `now` (`bridge.models.status_hour`, which says what they ask and
  what the hour's p99 is). `last_hour_note` says the source, or why there are no such
  figures (no Prometheus configured, or it did not answer: a note, never an exception);
- replicas now and lends today: the servers holding the model READY, and the lease store;
- GPU-hours and cost: the ledger's report for the model, this month and today;
- the weight cache: per version, the nodes holding a complete copy (the catalogue in the
  bridge's database) and the staging jobs in flight (Slurm's `stb:staging` jobs, given
  by the caller: `bridge.weights.view`).
The databases, the servers and the repository's archive are read by
`bridge.models.status_sources`.

Reading never creates a database: a SQLite file that is missing is "no database" (as the
reports do, `bridge.ledger.views`), and a database that does not answer is said, not
raised; so is a Prometheus that does not answer. A model the repository lacks and the
journal never saw is `UnknownModel`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from bridge.config import ObserveConfig
from bridge.leases.rollouts import Rollout
from bridge.modelfacts import ModelFacts
from bridge.models import history
from bridge.models.repo import ModelRepository
from bridge.models.status_hour import last_hour, prometheus_url
from bridge.models.status_sources import (
    StatusServer,
    live_figures,
    read_cost,
    read_database,
    read_servers,
    read_weights,
    rejected_versions,
    retired_versions,
)
from bridge.models.status_tokens import last_hour_tokens, live_tokens
from bridge.models.status_views import (
    Facts,
    LastHour,
    ModelStatus,
    Replicas,
    ServerView,
    Tokens,
    VersionView,
)
from bridge.policy.rollout import PlanError, parse_plan
from bridge.slurm.model import Job
from bridge.triton.metrics import ModelSample
from bridge.weights.view import cache_view

#: the words of the open rollout's states, for the new version
_NEW_LABEL = {"pending": "pending", "promoting": "promoting", "rolling_back": "rolling back"}


#: the weight cache's note where the caller read no staging jobs from Slurm
STAGING_NOT_READ = "Slurm's staging jobs not read: in flight as the catalogue says"


class UnknownModel(LookupError):
    """The repository has no such model and the journal never saw it."""


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
    staging_jobs: Sequence[Job] | None = None,
    staging_note: str = STAGING_NOT_READ,
) -> ModelStatus:
    """`model`'s status now. `servers` None: unknown (say why in `servers_note`);
    `database_url`/`ledger_url` None: none; `observe` (the bridge's `[observe]`) names the
    Prometheus server asked for each version's last hour (None: no Prometheus). The
    last-hour p99 is the highest of Triton's 60 s p99 windows over the hour: an upper
    bound of the hour's p99. `staging_jobs`: Slurm's staging jobs (None: not read,
    `staging_note` says why). Reads only: creates no database or file."""
    journal = check_known(model, repo)
    notes = []
    if journal.skipped:
        notes.append(f"{journal.skipped} line(s) of the journal are no entry and are left out")
    db = read_database(model, database_url, now)
    views, samples = read_servers(model, servers)
    slo = _facts(model, facts)
    hours, hour_note = last_hour(
        model, prometheus_url(observe), now, slo.slo_p99_ms if slo else None,
        timeout_s=observe.timeout_s if observe else 3.0,
    )  # fmt: skip
    ttft_slo = slo.slo_ttft_p99_ms if slo else None
    tpot_slo = slo.slo_tpot_p99_ms if slo else None
    token_hours: dict[int, Tokens] = {}
    if ttft_slo is not None or tpot_slo is not None:
        token_hours, token_note = last_hour_tokens(
            model, prometheus_url(observe), now, ttft_slo, tpot_slo,
            timeout_s=observe.timeout_s if observe else 3.0,
        )  # fmt: skip
        if token_note:
            notes.append(token_note)
    versions = _versions(model, repo, journal, db.open_row, views, samples, slo, hours)
    versions = tuple(
        replace(
            v,
            tokens=live_tokens(
                [s for s in samples if s.version == str(v.version)], ttft_slo, tpot_slo
            ),
            tokens_hour=token_hours.get(v.version),
        )
        for v in versions
    )
    replicas = Replicas(
        now=None if views is None else sum(v.holds for v in views),
        lent=db.lent,
        lends_today=db.lends_today,
        note=db.note,
    )
    copies, copies_note = read_weights(model, database_url)
    weights_note = "; ".join(
        n for n in (copies_note, staging_note if staging_jobs is None else "") if n
    )
    weights = cache_view(copies, staging_jobs, weights_note).of_model(model)
    return ModelStatus(
        model=model, at=now, facts=slo, versions=versions, rollout=db.rollout,
        last_rollout=db.last_rollout, servers=views, replicas=replicas,
        cost=read_cost(model, ledger_url, now), servers_note=servers_note, notes=tuple(notes),
        last_hour_note=hour_note, weights=weights,
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
        slo_ttft_p99_ms=m.slo_ttft_p99_ms if m else None,
        slo_tpot_p99_ms=m.slo_tpot_p99_ms if m else None,
    )


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
    rejected, retired = rejected_versions(repo, model), retired_versions(repo, model)
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
            served_on=tuple(where.get(v, ())), live=live_figures(by_version.get(v, []), slo),
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
