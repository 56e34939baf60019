"""`stb simulate`'s site options resolved into the simulator's inputs: which window,
which arrivals, jobs, fleet, per-model SLO and service time, actuation and load times and
weight caches, each read by its module of `bridge.sim.inputs`, and one `about` saying
where each came from.
Called by `bridge.sim.cli` (the typer options; the run is in `bridge.sim.progress`); the clock is a
parameter (`now`: the end of a live Prometheus query without --until).

The window is --since to --until where given; else the site data's own span: the
arrivals' (a saved Prometheus answer, a CSV), else the sacct records'; a live Prometheus
query or the ledger's jobs without them end now and span --days (default 7). With only
generators, --days.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bridge.config import BridgeConfig
from bridge.modelfacts import ModelFact
from bridge.sim.cache_option import parse_cache
from bridge.sim.engine import Timing
from bridge.sim.inputs.arrivals import arrivals_from_csv
from bridge.sim.inputs.common import InputError, iso, parse_time, write_json
from bridge.sim.inputs.fleet import read_fleet
from bridge.sim.inputs.jobs import (
    JobReplay,
    partition_kinds,
    read_sacct_files,
    record_span,
    replay_records,
)
from bridge.sim.inputs.ledger_jobs import replay_ledger
from bridge.sim.inputs.loads import check_cache, load_timing, read_load_measures
from bridge.sim.inputs.prometheus import (
    DEFAULT_QUERY,
    arrivals_from_prometheus,
    query_instant,
    query_range,
)
from bridge.sim.inputs.service import (
    read_ledger_service,
    service_from_prometheus,
    service_query,
)
from bridge.sim.inputs.timing import lend_modes, read_lease_timelines, timing_from_leases
from bridge.sim.workload import ArrivalSeries, JobKind
from bridge.triton.catalog import site_models
from bridge.triton.prometheus import shown_url

#: arrivals and jobs read from a site (the others are generators or public traces)
SITE_ARRIVALS = ("prometheus", "csv")
SITE_JOBS = ("sacct", "ledger")
SERVICE_FROM = ("options", "prometheus", "ledger")
TIMING_FROM = ("default", "leases")
DAY_S = 86400.0
#: --days without site data to say otherwise
DEFAULT_DAYS = 7.0
#: the lease history read for --timing leases: all of it (the site's machinery, not the
#: simulated window, sets how long a lend takes)
HISTORY_FROM = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class SiteOptions:
    """The options of `stb simulate` that name a site's data (None, empty: not given)."""

    arrivals: str = "synthetic"
    jobs: str = "synthetic"
    days: float | None = None
    since: str | None = None
    until: str | None = None
    prometheus_url: str | None = None
    prometheus_json: Path | None = None
    prometheus_save: Path | None = None
    query: str = ""
    arrivals_file: Path | None = None
    scale: float = 1.0
    max_gap_s: float = 60.0
    sacct_json: Sequence[Path] = ()
    partition_kind: str = ""
    #: the ledger `--jobs ledger` and `--service-from ledger` read (None: --config's)
    ledger_url: str | None = None
    fleet_nodes: Path | None = None
    fleet_partitions: Path | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    slo_ms: float = 100.0
    service_ms: str = "20"
    service_from: str = "options"
    service_json: Path | None = None
    load_s: str = ""
    #: the node-local weight caches (`bridge.sim.cache_option`: off, N:S, stage:N:S, N,
    #: stage:N)
    cache: str = "off"
    timing: str = "default"
    #: the arrival series' step (the bridge's tick)
    step_s: float = 5.0


@dataclass(frozen=True)
class SiteInputs:
    """What the options resolve to. `series`, `jobs`: None where a generator makes them
    (the CLI's `build_scenario` does); `models`: model -> (SLO ms, service ms)."""

    days: float
    nodes: int
    gpus_per_node: int
    series: ArrivalSeries | None
    jobs: JobReplay | None
    models: dict[str, tuple[float, float]]
    timing: Timing
    about: dict[str, object] = field(default_factory=dict)


def per_model(text: str, option: str) -> tuple[float | None, dict[str, float]]:
    """`20` (every model), `busy=20,echo=1` (per model) or both (`20,busy=35`: the
    number for the models not named): the default and the per-model values, each a
    finite number >= 0."""
    default: float | None = None
    named: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        model, sep, raw = item.rpartition("=") if "=" in item else ("", "", item)
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise InputError(f"{option}: {raw!r} in {item!r} is not a number >= 0")
        if sep:
            if not model.strip():
                raise InputError(f"{option}: {item!r} names no model (MODEL=VALUE)")
            named[model.strip()] = value
        elif default is not None:
            raise InputError(f"{option}: two values for every model ({text!r})")
        else:
            default = value
    return default, named


#: --partition-kind's kinds: inference is no batch work (its jobs are left out)
_KINDS: Mapping[str, JobKind | None] = {
    "training": "training",
    "elastic": "elastic",
    "inference": None,
}


def _kinds(text: str) -> dict[str, JobKind | None]:
    """`--partition-kind gpu=training,debug=elastic`: partition -> job kind."""
    out: dict[str, JobKind | None] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        part, sep, kind = (x.strip() for x in item.partition("="))
        if not sep or not part or kind not in _KINDS:
            raise InputError(
                f"--partition-kind: {item!r}: give PARTITION=KIND, KIND training, elastic "
                "or inference (inference: not batch work, left out)"
            )
        out[part] = _KINDS[kind]
    return out


def check(opts: SiteOptions, cfg: BridgeConfig | None) -> None:
    """The options that go together, before anything is read; `InputError` naming them.
    Which option is read only beside which (a site file only with its source, ...) is
    `bridge.sim.options`' table, settled by the CLI before these options are made."""
    if opts.arrivals == "prometheus" and (
        (opts.prometheus_url is None) == (opts.prometheus_json is None)
    ):
        raise InputError(
            "--arrivals prometheus: give one of --prometheus-url URL (a live query) "
            "or --prometheus-json FILE (a saved answer of /api/v1/query_range)"
        )
    if opts.arrivals == "csv" and opts.arrivals_file is None:
        raise InputError("--arrivals csv and --arrivals-file FILE go together")
    if opts.jobs == "sacct" and not opts.sacct_json:
        raise InputError("--jobs sacct and --sacct-json FILE go together")
    if opts.service_from not in SERVICE_FROM:
        raise InputError(
            f"--service-from {opts.service_from!r}: choose from {', '.join(SERVICE_FROM)}"
        )
    if opts.service_from == "prometheus" and (
        (opts.prometheus_url is None) == (opts.service_json is None)
    ):
        raise InputError(
            "--service-from prometheus: give one of --prometheus-url URL or --service-json "
            "FILE (a saved answer of the service query)"
        )
    if opts.timing not in TIMING_FROM:
        raise InputError(f"--timing {opts.timing!r}: choose from {', '.join(TIMING_FROM)}")
    for option, needs in (
        ("--timing leases", opts.timing == "leases"),
        ("--service-from ledger", opts.service_from == "ledger" and opts.ledger_url is None),
        ("--jobs ledger", opts.jobs == "ledger" and opts.ledger_url is None),
    ):
        if needs and cfg is None:
            also = "" if option == "--timing leases" else " (its ledger_url) or --ledger-url URL"
            raise InputError(f"{option} reads the bridge's database: give --config FILE{also}")
    if not (math.isfinite(opts.scale) and opts.scale > 0):
        raise InputError(f"--scale must be a number > 0, got {opts.scale:g}")
    if not (math.isfinite(opts.max_gap_s) and opts.max_gap_s >= 0):
        raise InputError(f"--max-gap-s must be a number >= 0, got {opts.max_gap_s:g}")
    if opts.days is not None and not (math.isfinite(opts.days) and opts.days > 0):
        raise InputError(f"--days must be a number > 0, got {opts.days:g}")
    since = parse_time(opts.since, "--since") if opts.since else None
    until = parse_time(opts.until, "--until") if opts.until else None
    if since and until and until <= since:
        raise InputError(f"--until {opts.until} is not after --since {opts.since}")
    per_model(opts.service_ms, "--service-ms")
    per_model(opts.load_s, "--load-s")
    check_cache(parse_cache(opts.cache, history=True), history=opts.timing == "leases")
    _kinds(opts.partition_kind)


def _window(opts: SiteOptions) -> tuple[datetime | None, datetime | None]:
    since = parse_time(opts.since, "--since") if opts.since else None
    until = parse_time(opts.until, "--until") if opts.until else None
    days = timedelta(seconds=opts.days * DAY_S) if opts.days is not None else None
    if since and not until and days:
        until = since + days
    if until and not since and days:
        since = until - days
    return since, until


def _arrivals(
    opts: SiteOptions, since: datetime | None, until: datetime | None, now: datetime
) -> ArrivalSeries | None:
    """The site's arrival series over the window (None for a generator)."""
    if opts.arrivals == "csv":
        assert opts.arrivals_file is not None
        series, _ = arrivals_from_csv(
            opts.arrivals_file,
            step_s=opts.step_s,
            scale=opts.scale,
            start=since,
            end=until,
            max_gap_s=opts.max_gap_s,
        )
        return series
    if opts.arrivals != "prometheus":
        return None
    notes: dict[str, object] = {}
    query = opts.query or DEFAULT_QUERY
    answer: Mapping[str, Any] | Path
    if opts.prometheus_url is not None:
        end = until or _floor(now, opts.step_s)
        start = since or end - timedelta(seconds=(opts.days or DEFAULT_DAYS) * DAY_S)
        answer = query_range(opts.prometheus_url, query, start, end, opts.step_s)
        since, until = start, end
        notes.update(url=shown_url(opts.prometheus_url), query=query)
        if opts.prometheus_save is not None:
            write_json(opts.prometheus_save, answer)
            notes["saved"] = opts.prometheus_save.name
    else:
        assert opts.prometheus_json is not None
        answer = opts.prometheus_json
    series = arrivals_from_prometheus(
        answer,
        start=since,
        end=until,
        step_s=opts.step_s,
        scale=opts.scale,
        max_gap_s=opts.max_gap_s,
    )
    return replace(series, about={**series.about, **notes})


def _floor(t: datetime, step_s: float) -> datetime:
    s = t.timestamp()
    return datetime.fromtimestamp(s - s % step_s, tz=UTC)


def _models(
    opts: SiteOptions,
    names: Sequence[str],
    cfg: BridgeConfig | None,
    window: tuple[datetime, datetime] | None,
) -> tuple[dict[str, tuple[float, float]], dict[str, object]]:
    """Per model, (SLO ms, service ms) and where each came from."""
    default, named = per_model(opts.service_ms, "--service-ms")
    default = 20.0 if default is None else default
    measured: dict[str, float] = {}
    source = "--service-ms"
    if opts.service_from == "prometheus":
        if opts.service_json is not None:
            measured = service_from_prometheus(opts.service_json)
            source = f"prometheus answer {opts.service_json.name}"
        else:
            assert opts.prometheus_url is not None
            if window is None:
                raise InputError(
                    "--service-from prometheus: give the window (--since, --until) the "
                    "counters are read over, or site data that has one"
                )
            start, end = window
            query = service_query((end - start).total_seconds())
            measured = service_from_prometheus(query_instant(opts.prometheus_url, query, end))
            source = f"prometheus {shown_url(opts.prometheus_url)}"
    elif opts.service_from == "ledger":
        if window is None:
            raise InputError(
                "--service-from ledger: give the window (--since and --until) or site data "
                "that has one"
            )
        measured = read_ledger_service(_ledger_url(opts, cfg), *window)
        source = "ledger (the daemon's stored Triton counters)"
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise InputError(
            f"--service-ms names models the simulation has not: {', '.join(unknown)} "
            f"(its models: {', '.join(names)})"
        )
    models: dict[str, tuple[float, float]] = {}
    said: dict[str, object] = {}
    # the SLOs the site's daemon scales by: its repository's, with its TOML's overrides
    facts = site_models(cfg) if cfg is not None else None
    for m in names:
        fact = facts.facts.get(m) if facts is not None else None
        spec = fact.model if fact is not None else None
        slo = spec.slo_p99_ms if spec is not None else opts.slo_ms
        if m in named:
            service, whence = named[m], "--service-ms"
        elif m in measured:
            service, whence = measured[m] * 1000.0, source
        else:
            service = default
            whence = "--service-ms"
            if opts.service_from != "options":
                whence = f"--service-ms ({source} counted no request of it)"
        if not service > 0:
            raise InputError(f"model {m}: service time {service:g} ms: give one > 0")
        if service >= slo:
            raise InputError(
                f"model {m}: its service time {service:g} ms ({whence}) is not below its "
                f"SLO {slo:g} ms: no replica could meet it"
            )
        models[m] = (slo, service)
        said[m] = {
            "slo_from": _slo_from(fact) if fact is not None and spec is not None else "--slo-ms",
            "service_from": whence,
        }
    return models, said


def _slo_from(fact: ModelFact) -> str:
    """Where a model's SLO came from, as the report says it."""
    if fact.source_of("slo_p99_ms") == "toml":
        return "--config [models]"
    return "--config's model repository (stb.slo_p99_ms)"


def _ledger_url(opts: SiteOptions, cfg: BridgeConfig | None) -> str:
    """--ledger-url, else --config's [accounting] ledger_url (`check` made sure of one)."""
    if opts.ledger_url is not None:
        return opts.ledger_url
    assert cfg is not None
    return cfg.accounting.ledger_url


def _timing(
    opts: SiteOptions, cfg: BridgeConfig | None, names: Sequence[str], now: datetime
) -> tuple[Timing, dict[str, object]]:
    """The run's timing and where it came from: the lab's, or the lease history's
    (`timing_from_leases`) with the stored model loads (`read_load_measures`); the models'
    load times and the caches as `bridge.sim.inputs.loads.load_timing` sets them."""
    timing = Timing()
    about: dict[str, object] = {"source": "default (the lab's measured times)"}
    history = None
    if opts.timing == "leases":
        assert cfg is not None
        leases = read_lease_timelines(cfg.database_url, HISTORY_FROM, now)
        timing, about = timing_from_leases(
            leases, lend_mode_of_pool=lend_modes(cfg), tick_s=cfg.tick_s
        )
        history = read_load_measures(cfg.database_url)
    default, named = per_model(opts.load_s, "--load-s")
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise InputError(f"--load-s names models the simulation has not: {', '.join(unknown)}")
    cache = parse_cache(opts.cache, history=True)
    timing, notes = load_timing(
        timing, names, load_s=(default, named), cache=cache, history=history
    )
    return timing, {**about, **notes}


def resolve(
    opts: SiteOptions,
    cfg: BridgeConfig | None,
    generated_models: Sequence[str],
    *,
    now: datetime,
) -> SiteInputs:
    """The site's inputs the options name, read and checked (`InputError` naming the
    option, file or field). `generated_models`: the model names when the arrivals are
    generated (m0, m1, ...)."""
    check(opts, cfg)
    config = cfg or BridgeConfig()
    since, until = _window(opts)
    series = _arrivals(opts, since, until, now)
    records = read_sacct_files(list(opts.sacct_json)) if opts.jobs == "sacct" else None
    if series is not None:
        assert series.origin is not None
        since, until = series.origin, series.origin + timedelta(seconds=series.horizon_s)
    elif records is not None:
        span = record_span(records)
        if span is None and not (since and until):
            raise InputError(
                "--sacct-json: no job ran in the files: give the window (--since, --until)"
            )
        if span is not None:
            if since is None:
                since = span[0]
            if until is None:
                days = opts.days
                until = since + timedelta(seconds=days * DAY_S) if days else span[1]
    elif opts.jobs == "ledger":  # as a live query: the last --days up to now
        until = until or _floor(now, opts.step_s)
        since = since or until - timedelta(seconds=(opts.days or DEFAULT_DAYS) * DAY_S)
    window = (since, until) if since is not None and until is not None else None
    days = (
        (window[1] - window[0]).total_seconds() / DAY_S
        if window is not None
        else (opts.days or DEFAULT_DAYS)
    )
    replay = None
    kinds = {**partition_kinds(config), **_kinds(opts.partition_kind)}
    if records is not None:
        assert window is not None
        files = ", ".join(p.name for p in opts.sacct_json)
        replay = replay_records(
            records, start=window[0], end=window[1], kind_of_partition=kinds, source=files
        )
        replay.about.update(source="sacct", files=[p.name for p in opts.sacct_json])
        named = f"--sacct-json {files}"
    elif opts.jobs == "ledger":
        assert window is not None
        replay = replay_ledger(
            _ledger_url(opts, cfg), start=window[0], end=window[1], kind_of_partition=kinds
        )
        named = f"--jobs ledger {replay.about['ledger']}"
    if replay is not None and not replay.jobs:
        assert window is not None
        raise InputError(
            f"{named}: no batch job in the window {iso(window[0])} to "
            f"{iso(window[1])} (left out: {replay.about['left_out']})"
        )
    about: dict[str, object] = {}
    if window is not None:
        about["window"] = [iso(window[0]), iso(window[1])]
    if opts.fleet_nodes is not None:
        shape = read_fleet(opts.fleet_nodes, opts.fleet_partitions, config)
        nodes = len(shape.nodes)
        gpn = opts.gpus_per_node or shape.gpus_per_node
        fleet: dict[str, object] = {**shape.about}
        if opts.gpus_per_node is not None and len(shape.gpu_counts()) > 1:
            fleet["simulated_gpus_per_node"] = f"{gpn} (--gpus-per-node; the fleet mixes counts)"
    else:
        nodes, gpn = opts.nodes or 256, opts.gpus_per_node or 8
        fleet = {"source": "--nodes, --gpus-per-node", "nodes": nodes, "gpus_per_node": gpn}
    about["fleet"] = fleet
    if replay is not None:
        wide = [j for j in replay.jobs if j.gpus_per_node > gpn]
        if wide:
            raise InputError(
                f"--jobs {opts.jobs}: {len(wide)} jobs use more than the fleet's {gpn} GPUs a node "
                f"(e.g. job {wide[0].job_id}: {wide[0].gpus_per_node}): give the fleet "
                "(--fleet-nodes, --gpus-per-node) the jobs ran on"
            )
    names = sorted(series.rates) if series is not None else list(generated_models)
    models, said = _models(opts, names, cfg, window)
    about["model_inputs"] = said
    timing, timing_about = _timing(opts, cfg, names, now)
    about["timing_source"] = timing_about
    return SiteInputs(days, nodes, gpn, series, replay, models, timing, about)
