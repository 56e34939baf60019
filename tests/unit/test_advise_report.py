"""`stb advise report` on literal rows: the summary (decisions per day, lends per pool and
model, breach minutes), the arrivals the replay reads (answers plus the queue's growth,
gaps), the window's batch jobs and fleet as the simulator's, the replay with and without
lending, and the command's JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bridge.advise.cli import parse_window, replay_span
from bridge.advise.replay import replay, sim_jobs, sim_nodes
from bridge.advise.summary import arrivals, summarise
from bridge.cli import app
from bridge.leases.advice import Advice, AdviceSample, AdviceStore
from bridge.leases.store import create_schema, make_engine
from bridge.sim.inputs import InputError
from bridge.slurm.model import AccountingRecord

from .fakes import N1, N3, N5, make_config

T0 = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def advice(seconds: float, kind: str, node: str, pool: str, models: list[str],
           serving: int = 0) -> Advice:  # fmt: skip
    return Advice(at=at(seconds), kind=kind, node=node, pool=pool, models=models,
                  reason="r", shadow_serving=serving)  # fmt: skip


def sample(seconds: float, model: str, rate: float | None, p99: float | None,
           pending: float | None = 0.0, compute: float | None = 20.0) -> AdviceSample:  # fmt: skip
    return AdviceSample(at=at(seconds), model=model, request_rate=rate, p99_ms=p99,
                        pending=pending, compute_ms=compute, replicas=1)  # fmt: skip


def record(job_id: str, partition: str, node: str, start: float, end: float | None,
           submit: float | None = None, comment: str = "") -> AccountingRecord:  # fmt: skip
    s, e = at(start), (at(end) if end is not None else None)
    elapsed = int(((e or at(3600)) - s).total_seconds())
    return AccountingRecord(
        "stblab", job_id, None, None, "job", partition, "team-nlp", "u", "normal",
        "COMPLETED" if e else "RUNNING", at(submit if submit is not None else start), s, e,
        elapsed, (node,), 4, "h100", comment, 0,
    )  # fmt: skip


def test_the_summary_counts_decisions_lends_and_breach_minutes(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    rows = [
        advice(10, "lend", "n3", "elastic", ["busy"]),
        advice(70, "lend", "n5", "training", ["busy", "calm"], serving=1),
        advice(200, "return", "n3", "elastic", ["busy"]),
        advice(86_400 + 5, "baseline", "n1", "inference", []),
    ]
    samples = [
        sample(5, "busy", 20.0, 50.0),
        sample(10, "busy", 200.0, 400.0),  # minute 0: a breach
        sample(65, "busy", 200.0, 90.0),  # minute 1: within
        sample(70, "busy", None, None),  # no reading: no minute
        sample(125, "busy", 30.0, 101.0, compute=24.0),  # minute 2: a breach
        sample(5, "calm", 1.0, 10.0, compute=None),
    ]
    s = summarise(rows, samples, cfg, at(0), at(2 * 86_400), "two days")
    assert s.per_day == {
        "2027-01-04": {"lend": 2, "return": 1, "place": 0, "baseline": 0},
        "2027-01-05": {"lend": 0, "return": 0, "place": 0, "baseline": 1},
    }
    assert s.lends_by_pool == {"elastic": 1, "training": 1}
    assert s.lends_by_model == {"busy": 2, "calm": 1}
    assert s.returns_by_pool == {"elastic": 1} and s.under_shadow == 1
    busy, calm = s.models["busy"], s.models["calm"]
    assert (busy.minutes, busy.breach_minutes, busy.p99_max_ms) == (3, 2, 400.0)
    assert busy.compute_ms == 20.0 and busy.rate_max == 200.0
    assert (calm.minutes, calm.breach_minutes, calm.compute_ms) == (1, 0, None)
    assert s.ticks == 5 and s.first_sample == at(5) and s.last_sample == at(125)
    assert json.dumps(s.as_dict())  # JSON-ready


def test_arrivals_add_the_queues_growth_and_leave_long_gaps_empty() -> None:
    samples = [
        sample(5, "busy", 50.0, 300.0, pending=0.0),
        sample(10, "busy", 50.0, 300.0, pending=50.0),  # 10 req/s more arrived than answered
        sample(15, "busy", 50.0, 300.0, pending=25.0),  # the queue shrank: 5 req/s fewer
        sample(20, "busy", 20.0, 30.0, pending=None),
        # the advisory was down from 20 s to 120 s
        sample(125, "busy", 4.0, 30.0, pending=0.0),
    ]
    a = arrivals(samples, ["busy", "calm"], at(0), at(125), 5.0, hold_s=10.0)
    busy = a.rates["busy"]
    assert a.steps == 25 and a.covered == 5
    # each sample reads the step that ends at it
    assert busy[:4] == [50.0, 60.0, 45.0, 20.0]
    assert busy[4:6] == [20.0, 20.0]  # held for hold_s
    assert busy[6:24] == [0.0] * 18  # then nothing is known
    assert busy[24] == 4.0
    assert a.rates["calm"] == [0.0] * 25


def test_windows_parse_like_the_other_reports_and_relative_ones() -> None:
    now = at(3600)
    assert parse_window("-30m", now) == (now - timedelta(minutes=30), now, "-30m")
    midnight = T0.replace(hour=0)
    assert parse_window("2027-01-04", now)[:2] == (midnight, midnight + timedelta(days=1))
    assert parse_window("2027-01-04T12:00:05..now", now)[:2] == (at(5), now)
    with pytest.raises(typer.BadParameter):
        parse_window("now..-1h", now)
    assert replay_span([sample(10, "busy", 1, 1), sample(50, "busy", 1, 1)], at(0), at(40), 5) == (
        at(5), at(40),
    )  # fmt: skip


def test_batch_jobs_and_the_fleet_become_the_simulators(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    records = [
        record("30", "elastic", "n3", -600, 300),  # running at the window's start
        record("31", "train", "n5", 60, 400, submit=30),
        record("32", "infer", "n1", 0, None, comment="stb:triton,stb:baseline"),
    ]
    jobs = sim_jobs(records, at(0), at(600), cfg)
    # each pool's partition gives its jobs' kind; Triton's jobs are no batch work
    assert [(j.job_id, j.kind, j.submit_s, j.duration_s, j.gpus_per_node) for j in jobs] == [
        ("30", "elastic", 0.0, 300.0, 4),
        ("31", "training", 30.0, 340.0, 4),
    ]
    with pytest.raises(InputError, match="debug"):  # a partition no pool names
        sim_jobs([record("33", "debug", "n9", 0, 100)], at(0), at(600), cfg)
    fleet = sim_nodes([N5, N3, N1], cfg)
    assert [(n.name, n.pool, n.partition, n.gpus) for n in fleet] == [
        ("n1", "inference", None, 4),
        ("n3", "elastic", "elastic", 4),
        ("n5", "training", "training", 4),
    ]


def test_the_replay_shows_what_lending_would_have_done(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"max_lent_nodes": 1})})
    # busy: 20 req/s, then 200 req/s for four minutes (more than the baseline's node
    # carries at 20 ms a request on 4 GPUs), then 20 again
    samples = []
    for k in range(1, 121):
        t = 5.0 * k
        rate = 200.0 if 60 <= t < 300 else 20.0
        samples += [sample(t, "busy", rate, 50.0), sample(t, "calm", 1.0, 10.0, compute=5.0)]
    records = [record("30", "elastic", "n3", -600, None), record("31", "train", "n5", -600, None)]
    s = summarise([], samples, cfg, at(0), at(600))
    load = arrivals(samples, list(cfg.models), at(0), at(600), cfg.tick_s)
    r = replay(cfg, [N1, N3, N5], records, load, s)
    none, lending = r.results["no lending"], r.results["lending"]
    assert none.lends == 0 and lending.lends >= 1
    assert lending.lends_by_pool == {"elastic": 1}  # the elastic job preempted, not training
    assert lending.preemptions == 1 and none.preemptions == 0
    assert lending.models["busy"].within_share > none.models["busy"].within_share
    assert r.nodes == {"inference": 1, "elastic": 1, "training": 1} and r.jobs == 2
    assert r.service_ms == {"busy": 20.0, "calm": 5.0}


def test_the_report_command_prints_one_json_document(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    engine = make_engine(cfg.database_url)
    create_schema(engine)
    store = AdviceStore(engine)
    store.write_tick(
        [advice(10, "lend", "n3", "elastic", ["busy"])], [sample(10, "busy", 200.0, 400.0)], []
    )
    toml = tmp_path / "bridge.toml"
    key = cfg.triton.key_file
    toml.write_text(
        f'database_url = "{cfg.database_url}"\n[triton]\nkey_file = "{key}"\n'
        "[models.busy]\nslo_p99_ms = 100\n"
    )
    result = CliRunner().invoke(
        app,
        [
            "advise",
            "report",
            "--window",
            "2027-01-04",
            "-c",
            str(toml),
            "--format",
            "json",
            "--no-replay",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["summary"]["lends_by_pool"] == {"elastic": 1}
    assert doc["summary"]["models"]["busy"]["breach_minutes"] == 1
    assert [a["node"] for a in doc["advice"]] == ["n3"] and doc["replay"] is None
