"""`stb models status M` (`bridge.models.status`): one model's facts, its versions and their
state (serving, canary at X%, old beside the canary, rolled back and why, superseded,
retired), the open and the last rollout, where each version serves and its live figures
beside the SLO, each version's last hour from Prometheus, replicas and lends, GPU-hours
and cost; from real SQLite databases, a real model repository and ledger in tmp_path,
small fake Triton servers (the metrics pages and repository indexes they answer) and a
real HTTP server on 127.0.0.1 answering /api/v1/query with recorded Prometheus answers
by the query's text. With no server, no database, no ledger and no Prometheus it says
so and creates nothing; a Prometheus that is down, silent or answers an error is a note;
an unknown model exits 2; the API answers the same JSON."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from accounting.attribution import Context, ServingPoint
from accounting.db import open_ledger
from accounting.ingest import ingest_records
from accounting.rates import RateSpec, add_rates
from accounting.samples import record_serving
from bridge.cli import app
from bridge.config import BridgeConfig, ObserveConfig, TritonJobConfig
from bridge.daemon.metrics import BridgeMetrics
from bridge.http.app import create_app
from bridge.http.auth import TokenTable
from bridge.http.routes import operator_routes
from bridge.http.server import HttpServer
from bridge.leases.requests import RequestQueue
from bridge.leases.rollouts import RolloutStore
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.models import cli as models_cli
from bridge.models import history
from bridge.models.repo import ModelRepository
from bridge.models.status import UnknownModel, gather
from bridge.models.status_hour import last_hour_queries, prometheus_url
from bridge.models.status_render import render
from bridge.models.status_views import LAST_HOUR_P99_NOTE, LIVE_NOTE
from bridge.slurm.errors import ControllerUnreachable
from bridge.slurm.model import AccountingRecord
from bridge.triton.catalog import ModelCatalog
from tests.unit.helpers import write_tokens
from tests.unit.models_status_fakes import (
    NOW,
    ROOT,
    FakeClient,
    FakeServer,
    T,
    prometheus,
    vector,
)

H = timedelta(hours=1)


def page(rows: Mapping[str, tuple[int, int, float]]) -> str:
    """A Triton metrics page of echo: version -> (succeeded, failed, p99 in µs)."""
    out = [
        "# TYPE nv_inference_request_success counter",
        *(f'nv_inference_request_success{{model="echo",version="{v}"}} {ok}'
          for v, (ok, _, _) in rows.items()),
        "# TYPE nv_inference_request_failure counter",
        *(f'nv_inference_request_failure{{model="echo",reason="BACKEND",version="{v}"}} {bad}'
          for v, (_, bad, _) in rows.items()),
        "# TYPE nv_inference_request_summary_us summary",
    ]  # fmt: skip
    for v, (ok, bad, p99) in rows.items():
        out += [
            f'nv_inference_request_summary_us_count{{model="echo",version="{v}"}} {ok + bad}',
            f'nv_inference_request_summary_us_sum{{model="echo",version="{v}"}} {p99 * ok}',
            f'nv_inference_request_summary_us{{model="echo",version="{v}",quantile="0.99"}} {p99}',
        ]
    return "\n".join(out) + "\n"


def servers() -> list[FakeServer]:
    """a holds echo 2 and the canary 3; b holds echo 2; c does not answer."""
    a = FakeClient(
        "10.0.0.1:8000",
        {"echo": ["2", "3"], "busy": ["1"]},
        page({"2": (900, 10, 40_000), "3": (100, 0, 62_000)}),
    )
    b = FakeClient("10.0.0.2:8000", {"echo": ["2"]}, page({"2": (100, 0, 45_000)}))
    c = FakeClient("10.0.0.3:8000", {})
    c.unreachable = True
    return [FakeServer(x.address, x) for x in (a, b, c)]


# ---- the places that hold the facts -------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    """echo with versions 1, 2 and 3 (3 the canary), version 4 set aside; a journal."""
    root = tmp_path / "models"
    shutil.copytree(ROOT / "triton_repo", root, ignore=shutil.ignore_patterns("__pycache__"))
    repo = ModelRepository(root)
    for v in ("2", "3", "4"):
        shutil.copytree(root / "echo" / "1", root / "echo" / v)
    repo.set_aside("echo", 4, "p99 78 ms over the SLO (50 ms)")
    for v, who in ((1, "alice"), (2, "bob"), (3, "carol"), (4, "dave")):
        entry = history.Entry(NOW - (6 - v) * H, "echo", "publish", v, v, who, f"v{v}")
        history.append(repo.archive, entry)
    return repo


def _lease(store: LeaseStore, node: str, models: list[str], at: datetime) -> None:
    lease = store.create(node, "elastic", "preempt", models, f"lend-{node}", at)
    assert lease.id is not None
    for state in (LeaseState.SUBMITTED, LeaseState.STARTING, LeaseState.SERVING):
        store.set_status(lease.id, state, at, "test")


@pytest.fixture
def database(tmp_path: Path) -> str:
    """The bridge's database: echo's rollout 1 -> 2 promoted, 2 -> 3 running at step 2
    (50%); two serving leases with echo (one lent yesterday), one today with busy only."""
    url = f"sqlite:///{tmp_path / 'bridge.db'}"
    engine = make_engine(url)
    create_schema(engine)
    rollouts = RolloutStore(engine)
    done = rollouts.start("echo", 1, 2, "10%", 60, NOW - 5 * H, who="bob")
    assert done.id is not None
    rollouts.move(done.id, "running", NOW - 5 * H, "loaded", step=0)
    rollouts.move(done.id, "running", NOW - 5 * H, "advance", step=1)
    rollouts.move(done.id, "promoting", NOW - 4 * H, "every step held")
    rollouts.move(done.id, "promoted", NOW - 4 * H, "version 2 serves alone")
    open_ = rollouts.start("echo", 2, 3, "10%,50%", 300, NOW - H, who="carol", why="fp16")
    assert open_.id is not None
    rollouts.move(open_.id, "running", NOW - H, "loaded", step=0)
    figures = {"new": {"requests": 400, "failures": 0, "p99_ms": 48.0}}
    rollouts.move(
        open_.id, "running", NOW - H / 2, "10% held 300 s: advance", step=1, figures=figures
    )
    leases = LeaseStore(engine)
    _lease(leases, "n3", ["echo"], NOW - 24 * H)
    _lease(leases, "n4", ["echo", "busy"], NOW - 2 * H)
    _lease(leases, "n5", ["busy"], NOW - H)
    engine.dispose()
    return url


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    """One 1-GPU serving job today 10:00-11:00 in which echo computed 600 s of the hour;
    H100 at 3.00 USD per GPU-hour."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = open_ledger(url)
    t0 = NOW - 2 * H
    record_serving(
        engine,
        "lab",
        [
            ServingPoint("7", "n4:8000", "echo", t0, 0.0, "2", 0),
            ServingPoint("7", "n4:8000", "echo", t0 + timedelta(minutes=30), 600e6, "2", 1000),
        ],
    )
    ctx = Context(
        pool_of_node={"n4": "inference"},
        gpu_type_of_node={"n4": "h100"},
        workload_of_partition={"infer": "inference"},
        team_of_account={"bridge": "platform"},
        team_of_model={"echo": "team-platform"},
        known_gpu_types=frozenset({"h100"}),
    )
    job = AccountingRecord(
        cluster="lab", job_id="7", array_job_id=None, array_task_id=None, name="triton",
        partition="infer", account="bridge", user="stb", qos="normal", state="COMPLETED",
        submit=t0, start=t0, end=t0 + H, elapsed_s=3600, nodes=("n4",), gpus=1,
        gpu_type="h100", comment="stb:triton", restarts=0,
    )  # fmt: skip
    ingest_records(engine, [job], ctx)
    add_rates(engine, [RateSpec("h100", Decimal("3.00"), date(2026, 1, 1))])
    engine.dispose()
    return url


def _facts(repo: ModelRepository) -> Any:
    return ModelCatalog(repo.root, {}, say=False).facts()


# ---- gather -------------------------------------------------------------------------------


def test_everything_from_its_own_place(repo: ModelRepository, database: str, ledger: str) -> None:
    status = gather(
        "echo", repo, _facts(repo), database_url=database, ledger_url=ledger,
        servers=servers(), now=NOW,
    )  # fmt: skip
    f = status.facts
    assert f is not None
    assert (f.team, f.slo_p99_ms, f.min_replicas, f.max_replicas) == ("team-platform", 50, 1, 2)

    by = {v.version: v for v in status.versions}
    assert [v.version for v in status.versions] == [4, 3, 2, 1]
    assert (by[3].state, by[3].label, by[3].percent) == ("canary", "canary at 50%", 50.0)
    assert by[2].label == "old (beside canary)"
    assert by[1].label == "superseded"
    assert by[4].state == "rolled_back"
    assert by[4].label == "rolled back: p99 78 ms over the SLO (50 ms)"
    assert (by[3].published_by, by[3].published_at) == ("carol", NOW - 3 * H)

    # where each version serves, and its live figures beside the SLO
    assert by[2].served_on == ("10.0.0.1:8000", "10.0.0.2:8000")
    assert by[3].served_on == ("10.0.0.1:8000",) and by[1].served_on == ()
    two, three = by[2].live, by[3].live
    assert two is not None and three is not None and by[1].live is None
    assert (two.succeeded, two.failed) == (1000, 10)  # summed over the servers
    assert two.failure_rate == pytest.approx(10 / 1010)
    assert two.p99_ms == pytest.approx(45.0) and not two.breach  # the largest p99
    assert three.p99_ms == pytest.approx(62.0) and three.breach

    # the servers: the unreachable one is listed, not raised
    assert status.servers is not None
    views = {s.address: s for s in status.servers}
    assert views["10.0.0.1:8000"].versions == (2, 3) and views["10.0.0.2:8000"].versions == (2,)
    c = views["10.0.0.3:8000"]
    assert not c.reachable and "connection refused" in c.error

    # the rollouts: the open one at step 2 of 2 (+100%), and the last finished one
    r = status.rollout
    assert r is not None
    assert (r.state, r.old_version, r.new_version) == ("running", 2, 3)
    assert (r.step, r.steps, r.percent, r.since) == (2, 3, 50.0, NOW - H / 2)
    assert r.reason == "10% held 300 s: advance" and r.figures["new"]["p99_ms"] == 48.0
    last = status.last_rollout
    assert last is not None and (last.state, last.new_version) == ("promoted", 2)
    assert last.reason == "version 2 serves alone"

    # replicas: two servers hold echo READY, two serving leases carry it, one lent today
    assert (status.replicas.now, status.replicas.lent, status.replicas.lends_today) == (2, 2, 1)

    # the ledger: echo's 600 s of GPU time today, this month the same; at 3.00 per hour
    cost = status.cost
    assert cost.ledger and (cost.month, cost.today) == ("2026-11", "2026-11-03")
    assert cost.month_gpu_hours == pytest.approx(600 / 3600)
    assert cost.today_gpu_hours == pytest.approx(600 / 3600)
    assert (cost.currency, cost.month_cost, cost.today_cost) == (
        "USD", Decimal("0.50"), Decimal("0.50")
    )  # fmt: skip

    doc = status.to_json()
    assert json.loads(json.dumps(doc)) == doc  # plain JSON
    assert doc["live_note"] == LIVE_NOTE
    assert doc["versions"][1]["label"] == "canary at 50%"
    assert doc["cost"]["month_cost"] == "0.50"
    assert doc["rollout"]["since"] == (NOW - H / 2).isoformat()


def test_no_server_no_database_no_ledger_creates_nothing(
    repo: ModelRepository, tmp_path: Path
) -> None:
    db, led = tmp_path / "none" / "bridge.db", tmp_path / "none" / "ledger.db"
    status = gather(
        "echo", repo, _facts(repo), database_url=f"sqlite:///{db}",
        ledger_url=f"sqlite:///{led}", servers=None, now=NOW, servers_note="Slurm is away",
    )  # fmt: skip
    assert not db.exists() and not led.exists() and not db.parent.exists()
    # no open rollout: the repository's latest serves
    assert [(v.version, v.label) for v in status.versions] == [
        (4, "rolled back: p99 78 ms over the SLO (50 ms)"),
        (3, "serving"),
        (2, "superseded"),
        (1, "superseded"),
    ]
    assert all(v.live is None and v.served_on == () for v in status.versions)
    assert status.servers is None and status.servers_note == "Slurm is away"
    assert status.rollout is None and status.last_rollout is None
    assert (status.replicas.now, status.replicas.lent, status.replicas.lends_today) == (None, 0, 0)
    assert status.replicas.note == f"no bridge database at {db}"
    assert not status.cost.ledger and status.cost.month_gpu_hours == 0
    assert status.cost.notes == (f"no ledger at {led}",)

    # no server running at all: zero replicas, not unknown
    none = gather(
        "echo", repo, _facts(repo), database_url=None, ledger_url=None, servers=[], now=NOW
    )
    assert none.servers == () and none.replicas.now == 0


def test_an_empty_ledger_says_zero(repo: ModelRepository, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).dispose()
    cost = gather(
        "echo", repo, _facts(repo), database_url=None, ledger_url=url, servers=[], now=NOW
    ).cost
    assert cost.ledger and cost.month_gpu_hours == 0 and cost.month_cost is None
    assert any("no ledger rows for echo in 2026-11" in n for n in cost.notes)


def test_a_retired_model_and_an_unknown_one(repo: ModelRepository) -> None:
    repo.retire("busy", "nobody calls it")
    entry = history.Entry(NOW - H, "busy", "retire", 1, None, "alice", "nobody calls it")
    history.append(repo.archive, entry)
    status = gather(
        "busy", repo, _facts(repo), database_url=None, ledger_url=None, servers=[], now=NOW
    )
    assert [(v.version, v.state) for v in status.versions] == [(1, "retired")]
    with pytest.raises(UnknownModel, match="'nope'"):
        gather("nope", repo, _facts(repo), database_url=None, ledger_url=None, servers=[], now=NOW)


def test_render_says_what_the_figures_are(
    repo: ModelRepository, database: str, ledger: str
) -> None:
    status = gather(
        "echo", repo, _facts(repo), database_url=database, ledger_url=ledger,
        servers=servers(), now=NOW,
    )  # fmt: skip
    console = Console(record=True, width=200)
    render(status, console)
    text = console.export_text()
    for said in (
        "team team-platform", "SLO p99 50 ms", "replicas 1-2", "canary at 50%",
        "old (beside canary)", "rolled back: p99 78 ms over the SLO (50 ms)", "62.0 breach",
        "rollout open: version 3 beside 2, running, step 2 of 3 at 50%",
        "last rollout: version 2 beside 1, promoted", "unreachable", "since each version was",
        "60 s", "replicas now 2 (2 on lent nodes); lends today 1",
        "this month (2026-11) 0.17, 0.50 USD",
    ):  # fmt: skip
        assert said in text, said


# ---- the last hour from Prometheus ----------------------------------------------------------

#: the queries of echo's last hour, as Prometheus receives them
SUCCEEDED = (
    'sum by (version) (increase(nv_inference_request_success{job="triton",model="echo"}[1h]))'
)
FAILURES = (
    'sum by (version) (increase(nv_inference_request_failure{job="triton",model="echo"}[1h]))'
)
P99 = (
    "max by (version) (max_over_time(nv_inference_request_summary_us"
    '{job="triton",model="echo",quantile="0.99"}[1h]))'
)


#: what Prometheus answers of echo's hour: version 2 (the old one, under the SLO), the
#: canary 3 (over it: 61 ms > 50 ms), version 1 (gone half an hour ago: no p99 left)
ANSWERS = {
    SUCCEEDED: vector(({"version": "2"}, "3590.4"), ({"version": "3"}, "400"),
                      ({"version": "1"}, "12.5"), ({"version": ""}, "3")),
    FAILURES: vector(({"version": "2"}, "9.6"), ({"version": "3"}, "0")),
    P99: vector(({"version": "2"}, "48000"), ({"version": "3"}, "61000"),
                ({"version": "1"}, "NaN")),
}  # fmt: skip


def _at(repo: ModelRepository, observe: ObserveConfig | None, model: str = "echo") -> Any:
    return gather(
        model, repo, _facts(repo), database_url=None, ledger_url=None, servers=servers(),
        now=NOW, observe=observe,
    )  # fmt: skip


def test_the_last_hour_per_version_from_prometheus(repo: ModelRepository) -> None:
    with prometheus(ANSWERS) as prom:
        status = _at(repo, ObserveConfig(source="prometheus", prometheus_url=prom.url + "/"))
    # the three queries, each as of `now`
    assert sorted(prom.asked) == sorted((q, f"{T:.3f}") for q in (SUCCEEDED, FAILURES, P99))
    assert status.last_hour_note == f"prometheus {prom.url}, 1h window"
    by = {v.version: v for v in status.versions}
    two, three, one = by[2].last_hour, by[3].last_hour, by[1].last_hour
    assert two is not None and three is not None and one is not None
    assert by[4].last_hour is None  # set aside before the hour: no series
    assert (two.requests, two.succeeded, two.failures) == (3600.0, 3590.4, 9.6)
    assert two.failure_rate == pytest.approx(9.6 / 3600)
    assert two.p99_ms == pytest.approx(48.0) and not two.breach  # under the 50 ms SLO
    assert (three.requests, three.failures, three.failure_rate) == (400.0, 0.0, 0.0)
    assert three.p99_ms == pytest.approx(61.0) and three.breach
    # no failure series and a NaN p99: unknown, never zero
    assert (one.requests, one.failures, one.failure_rate) == (12.5, None, 0.0)
    assert one.p99_ms is None and not one.breach
    # the live figures are still Triton's own
    assert by[3].live is not None and by[3].live.p99_ms == pytest.approx(62.0)

    doc = status.to_json()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["last_hour_note"] == f"prometheus {prom.url}, 1h window"
    assert doc["last_hour_p99_note"] == LAST_HOUR_P99_NOTE
    assert "upper bound" in LAST_HOUR_P99_NOTE and "60 s" in LAST_HOUR_P99_NOTE
    assert doc["versions"][1]["last_hour"] == {
        "requests": 400.0, "succeeded": 400.0, "failures": 0.0, "failure_rate": 0.0,
        "p99_ms": 61.0, "breach": True,
    }  # fmt: skip
    assert doc["versions"][0]["last_hour"] is None

    console = Console(record=True, width=200)  # the table fits COLUMNS=200
    render(status, console)
    text = console.export_text()
    row = next(line for line in text.splitlines() if line.startswith("│ 3 "))
    live_and_hour = [cell.strip() for cell in row.split("│")[6:13]]
    assert live_and_hour == ["100", "0", "0.00", "62.0 breach", "400", "0.00", "61.0 breach"]
    for said in (
        "1h p99 ms", "(max)", "requests", "│ 3600 ", "0.27",
        "rolled back: p99 78 ms over the SLO (50 ms)",
        f"last hour: prometheus {prom.url}, 1h window", "upper bound of the hour's p99",
    ):  # fmt: skip
        assert said in text, said
    assert max(len(line) for line in text.splitlines()) <= 200


def test_a_prometheus_that_is_down_or_errs_is_a_note(repo: ModelRepository) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    status = _at(repo, ObserveConfig(source="prometheus", prometheus_url=closed))
    assert status.last_hour_note.startswith(f"Prometheus did not answer: {closed}: ")
    assert all(v.last_hour is None for v in status.versions)
    assert status.versions[1].live is not None  # the rest is shown
    console = Console(record=True, width=200)
    render(status, console)
    assert "last hour: Prometheus did not answer" in console.export_text()

    # it answers an error (here: a query it does not know)
    with prometheus({}) as prom:
        erred = _at(repo, ObserveConfig(source="prometheus", prometheus_url=prom.url))
    assert erred.last_hour_note.startswith("Prometheus did not answer: ")
    assert "HTTP 400" in erred.last_hour_note and "unknown query" in erred.last_hour_note
    assert all(v.last_hour is None for v in erred.versions)

    # it accepts the connection and never answers: the bridge's timeout bounds it
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        observe = ObserveConfig(source="prometheus", prometheus_url=url, timeout_s=0.3)
        slow = _at(repo, observe)
    assert slow.last_hour_note.startswith(f"Prometheus did not answer: {url}: ")
    assert "no answer within 0.3s" in slow.last_hour_note


def test_no_prometheus_configured(repo: ModelRepository) -> None:
    for observe in (None, ObserveConfig()):  # none given; the direct source, no URL set
        status = _at(repo, observe)
        assert status.last_hour_note == "no Prometheus configured"
        assert all(v.last_hour is None for v in status.versions)
        assert status.to_json()["last_hour_note"] == "no Prometheus configured"
    # a URL set names a Prometheus even where the signal is read directly
    assert prometheus_url(ObserveConfig(prometheus_url="http://prom:9090")) == "http://prom:9090"
    assert prometheus_url(ObserveConfig(source="prometheus")) == "http://127.0.0.1:9090"


def test_the_model_name_stays_inside_its_promql_string() -> None:
    assert last_hour_queries("echo") == {
        "succeeded": SUCCEEDED,
        "failures": FAILURES,
        "p99_us": P99,
    }
    query = last_hour_queries('a"b\\c')["succeeded"]
    assert 'model="a\\"b\\\\c"' in query


# ---- the command and the API --------------------------------------------------------------


def _config(tmp_path: Path, database: str, ledger: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(f'database_url = "{database}"\n[accounting]\nledger_url = "{ledger}"\n')
    return path


def test_the_cli_shows_the_status(
    repo: ModelRepository,
    database: str,
    ledger: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @contextmanager
    def running(cfg: BridgeConfig) -> Iterator[list[FakeServer]]:
        yield servers()

    monkeypatch.setattr(models_cli, "running_servers", running)
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["models", "status", "echo", "--repository", str(repo.root)]
    args += ["-c", str(_config(tmp_path, database, ledger))]
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert "canary at 50%" in shown.output and "breach" in shown.output
    assert "Triton's own" in shown.output
    done = runner.invoke(app, [*args, "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["model"] == "echo" and doc["replicas"]["now"] == 2
    assert doc["facts"]["slo_p99_ms"] == 50

    # Slurm does not answer: the servers are unknown, the rest is shown
    @contextmanager
    def away(cfg: BridgeConfig) -> Iterator[list[FakeServer]]:
        raise ControllerUnreachable("squeue: slurmctld does not answer")
        yield []

    monkeypatch.setattr(models_cli, "running_servers", away)
    unknown = runner.invoke(app, [*args, "--json"])
    assert unknown.exit_code == 0, unknown.output
    doc = json.loads(unknown.stdout)
    assert doc["servers"] is None and "slurmctld does not answer" in doc["servers_note"]
    assert doc["versions"][1]["label"] == "canary at 50%"

    bad = runner.invoke(app, ["models", "status", "nope", "--repository", str(repo.root)])
    assert bad.exit_code == 2 and "'nope'" in bad.output


def test_the_api_answers_the_same_json(
    repo: ModelRepository, database: str, ledger: str, tmp_path: Path
) -> None:
    cfg = BridgeConfig(
        database_url=database,
        triton=TritonJobConfig(model_repository=repo.root),
        accounting={"ledger_url": ledger},
    )
    engine = make_engine(database)

    @contextmanager
    def running() -> Iterator[list[FakeServer]]:
        yield servers()

    routes = operator_routes(
        cfg, RequestQueue(engine), LeaseStore(engine), clock=lambda: NOW, servers=running
    )
    tokens = write_tokens(
        tmp_path / "tokens", {"olga": ("operator", "o" * 24), "fred": ("finance", "f" * 24)}
    )
    app = create_app(BridgeMetrics(), 5, tokens=TokenTable(tokens), routers=[routes])
    server = HttpServer(app, ("127.0.0.1", 0)).start()
    try:

        def get(token: str, **params: str) -> httpx.Response:
            return httpx.get(
                server.url + "/api/models/status", params=params, timeout=10,
                headers={"Authorization": f"Bearer {token}"},
            )  # fmt: skip

        got = get("o" * 24, model="echo")
        assert got.status_code == 200, got.text
        expected = gather(
            "echo", repo, ModelCatalog(repo.root, cfg.models, say=False).facts(),
            database_url=database, ledger_url=ledger, servers=servers(), now=NOW,
        ).to_json()  # fmt: skip
        assert got.json() == expected
        assert get("f" * 24, model="echo").status_code == 403
        missing = get("o" * 24, model="nope")
        assert missing.status_code == 404 and "'nope'" in missing.json()["error"]
        assert get("o" * 24).status_code == 400
        assert get("o" * 24, model="../x").status_code == 400
    finally:
        server.stop()
        engine.dispose()
