"""Staging jobs in the ledger: the bridge's weight-staging runs (`bridge.slurm.staging`:
name `stb-staging-<model>-<version>`, comment `stb:staging`, the bridge's account) are
booked as workload `staging` under the model they stage, whatever workload tag
job_submit.lua gave their partition; a run that holds no GPU books nothing; another
account's job that calls itself staging keeps its own workload. Literal `sacct --json`
records (Slurm 22.05's shape), the feed's context, the attribution's two paths, the
ingest and the report by workload."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from accounting.attribution import (
    _as_tuple,
    digest,
    is_staging,
    job_entries,
    job_entry_tuples,
    staged_model,
)
from accounting.db import open_ledger
from accounting.ingest import ingest_records
from accounting.report import Window, build_report
from bridge.config import BridgeConfig
from bridge.ledger.feed import context, staging_account
from bridge.slurm.model import Node
from bridge.slurm.sacct import parse_sacct_json

T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)
END = T0 + timedelta(hours=2)
NODES = [
    Node("n1", "127.0.1.1", ("train",), "idle", frozenset(), "", "h100", 4, 0),
    Node("n3", "127.0.1.3", ("elastic", "infer"), "idle", frozenset(), "", "h100", 4, 0),
]


def _gres(gpus: int) -> list[dict[str, Any]]:
    cpu = [{"type": "cpu", "name": None, "id": 1, "count": 1}]
    if not gpus:
        return cpu
    return [
        *cpu,
        {"type": "gres", "name": "gpu", "id": 1001, "count": gpus},
        {"type": "gres", "name": "gpu:h100", "id": 1002, "count": gpus},
    ]


def _job(
    job_id: int,
    name: str,
    account: str,
    comment: str | None,
    gpus: int,
    minutes: int,
    *,
    partition: str = "elastic",
    admin: str = "stb:workload=elastic",
) -> dict[str, Any]:
    start = int(T0.timestamp())
    return {
        "account": account,
        "cluster": "lab",
        "comment": {"administrator": admin, "job": comment, "system": None},
        "job_id": job_id,
        "name": name,
        "nodes": "n3",
        "partition": partition,
        "qos": "normal",
        "state": {"current": "COMPLETED", "reason": "None"},
        "time": {
            "elapsed": minutes * 60,
            "eligible": start,
            "end": start + minutes * 60,
            "start": start,
            "submission": start,
        },
        "tres": {"allocated": _gres(gpus), "requested": _gres(gpus)},
        "user": "stb",
        "array": {"job_id": 0, "task_id": None},
        "restart_cnt": 0,
    }


SACCT = json.dumps(
    {
        "meta": {},
        "errors": [],
        "jobs": [
            # a staging job given a GPU (a site that allocates whole nodes): staging
            _job(101, "stb-staging-weighty-1", "bridge", "stb:staging", 1, 30),
            # the usual staging job: no GPU asked, none held, nothing booked
            _job(102, "stb-staging-weighty-1", "bridge", "stb:staging", 0, 30),
            # another account's job that says stb:staging: its own workload
            _job(103, "wrap", "team-research", "stb:staging", 2, 60),
            # the comment lost (a slurmdbd without job_comment): the name still tells
            _job(104, "stb-staging-llm-7b-12", "bridge", None, 2, 15),
            # a plain elastic job of the bridge's account: elastic
            _job(105, "stb-stagingish", "bridge", None, 1, 10),
            # a serving job: inference, as before
            _job(106, "triton", "bridge", "stb:triton", 1, 60, partition="infer",
                 admin="stb:workload=inference"),
        ],
    }
)  # fmt: skip

CONFIG = BridgeConfig.model_validate(
    {"accounting": {"teams": {"bridge": "inference-platform"}}, "triton": {"account": "bridge"}}
)


def _records_and_ctx() -> tuple[dict[str, Any], Any]:
    records = {r.job_id: r for r in parse_sacct_json(SACCT)}
    return records, context(CONFIG, NODES, [], horizon=END, cluster="lab")


def test_a_staging_run_is_booked_as_staging_under_its_model() -> None:
    records, ctx = _records_and_ctx()
    assert ctx.staging_accounts == frozenset({"bridge"})
    got = {
        job: [(e.workload, e.model, e.team, e.pool, e.account, e.gpu_ms) for e in entries]
        for job, rec in records.items()
        if (entries := job_entries(rec, ctx))
    }
    assert got == {
        "101": [("staging", "weighty", "inference-platform", "elastic", "bridge", 1_800_000)],
        "103": [("elastic", "", "team-research", "elastic", "team-research", 7_200_000)],
        "104": [("staging", "llm-7b", "inference-platform", "elastic", "bridge", 1_800_000)],
        "105": [("elastic", "", "inference-platform", "elastic", "bridge", 600_000)],
        "106": [
            ("inference", "(unattributed)", "inference-platform", "elastic", "bridge", 3_600_000)
        ],
    }
    # the bulk path books the same rows
    for rec in records.values():
        assert job_entry_tuples(rec, ctx) == [_as_tuple(e) for e in job_entries(rec, ctx)]


def test_which_runs_are_staging_and_their_models() -> None:
    records, ctx = _records_and_ctx()
    assert {j for j, r in records.items() if is_staging(r, ctx)} == {"101", "102", "104"}
    # without the bridge's account known, any account's marked job counts
    anyone = context(CONFIG, NODES, [], horizon=END, cluster="lab")
    anyone = type(anyone)(**{**anyone.__dict__, "staging_accounts": frozenset()})
    assert is_staging(records["103"], anyone)
    assert staged_model("stb-staging-weighty-1") == "weighty"
    assert staged_model("stb-staging-a-b-c-30") == "a-b-c"
    assert staged_model("stb-staging") == staged_model("stb-staging-x-y") == ""
    assert staged_model("wrap") == ""
    # the staging account: [weights] account, else the Triton jobs'
    assert staging_account(CONFIG) == "bridge"
    other = CONFIG.model_copy(
        update={"weights": CONFIG.weights.model_copy(update={"account": "ops"})}
    )
    assert staging_account(other) == "ops"


def test_the_digest_changes_only_for_staging_runs() -> None:
    records, ctx = _records_and_ctx()
    plain = type(ctx)(**{**ctx.__dict__, "staging_accounts": frozenset({"nobody"})})
    # a record that is no staging run hashes as before the staging rule existed
    for job in ("103", "105", "106"):
        assert digest(records[job], ctx) == digest(records[job], plain)
    # a staging run's rows depend on the rule: its digest does too, so it is re-booked
    assert digest(records["101"], ctx) != digest(records["101"], plain)


def test_the_report_shows_staging_beside_serving(tmp_path: Path) -> None:
    records, ctx = _records_and_ctx()
    engine = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    summary = ingest_records(engine, records.values(), ctx, now=END)
    assert (summary.new, summary.skipped) == (5, 1)  # job 102 held no GPU
    window = Window(T0, END, "t")
    report = build_report(engine, window, ("workload", "model"))
    hours = {
        (line.keys["workload"], line.keys["model"]): line.gpu_ms / 3_600_000
        for line in report.lines
        if line.keys["workload"] != "idle"
    }
    assert hours == {
        ("staging", "weighty"): 0.5,
        ("staging", "llm-7b"): 0.5,
        ("elastic", ""): 2 + 1 / 6,
        ("inference", "(unattributed)"): 1.0,
    }
    by_team = build_report(engine, window, ("team", "workload"), filters={"workload": "staging"})
    assert [(line.keys["team"], line.gpu_ms) for line in by_team.lines] == [
        ("inference-platform", 3_600_000)
    ]
