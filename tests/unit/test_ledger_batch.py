"""Batch inference in the ledger: an elastic job submitted with `--comment=stb:batch`
carries `stb:workload=batch-inference` in its admin comment (job_submit.lua), and the
ledger books its GPU time under that workload, to its own team, beside elastic and
serving work; a tag a user wrote in the job's own comment loses to the plugin's admin
tag; a partition the site maps to `batch-inference` books its untagged jobs so. Literal
`sacct --json` records (Slurm 22.05's shape), the attribution's two paths, the ingest and
the report by team and workload."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from accounting.attribution import _as_tuple, job_entries, job_entry_tuples, tags
from accounting.db import open_ledger
from accounting.ingest import ingest_records
from accounting.report import Window, build_report
from accounting.schema import BATCH_INFERENCE, WORKLOADS
from bridge.config import BridgeConfig
from bridge.ledger.feed import context
from bridge.slurm.model import Node
from bridge.slurm.sacct import parse_sacct_json

T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)
END = T0 + timedelta(hours=2)
NODES = [
    Node("n3", "127.0.1.3", ("elastic", "infer"), "idle", frozenset(), "", "h100", 4, 0),
    Node("n4", "127.0.1.4", ("batchq",), "idle", frozenset(), "", "h100", 4, 0),
]


def _job(
    job_id: int,
    account: str,
    comment: str | None,
    admin: str | None,
    gpus: int,
    minutes: int,
    *,
    partition: str = "elastic",
    node: str = "n3",
) -> dict[str, Any]:
    start = int(T0.timestamp())
    gres = [{"type": "cpu", "name": None, "id": 1, "count": 1}]
    if gpus:
        gres += [
            {"type": "gres", "name": "gpu", "id": 1001, "count": gpus},
            {"type": "gres", "name": "gpu:h100", "id": 1002, "count": gpus},
        ]
    return {
        "account": account,
        "cluster": "lab",
        "comment": {"administrator": admin, "job": comment, "system": None},
        "job_id": job_id,
        "name": "wrap",
        "nodes": node,
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
        "tres": {"allocated": gres, "requested": gres},
        "user": "ana",
        "array": {"job_id": 0, "task_id": None},
        "restart_cnt": 0,
    }


SACCT = json.dumps(
    {
        "meta": {},
        "errors": [],
        "jobs": [
            # what job_submit.lua makes of `sbatch -p elastic --comment=stb:batch`
            _job(201, "team-nlp", "stb:batch", "stb:workload=batch-inference", 1, 60),
            # a plain elastic job of the same team
            _job(202, "team-nlp", None, "stb:workload=elastic", 2, 30),
            # a user's own tag loses to the plugin's (the admin comment comes last)
            _job(203, "team-vision", "stb:workload=batch-inference", "stb:workload=elastic",
                 1, 60),
            # untagged, on a partition the site maps to batch-inference
            _job(204, "team-vision", None, None, 1, 30, partition="batchq", node="n4"),
            # a serving job: inference, as before
            _job(205, "bridge", "stb:triton", "stb:workload=inference", 1, 60,
                 partition="infer"),
        ],
    }
)  # fmt: skip

CONFIG = BridgeConfig.model_validate(
    {
        "accounting": {
            "teams": {"bridge": "inference-platform", "team-nlp": "nlp"},
            "workloads": {"batchq": "batch-inference"},
        },
        "triton": {"account": "bridge"},
    }
)


def _records_and_ctx() -> tuple[dict[str, Any], Any]:
    records = {r.job_id: r for r in parse_sacct_json(SACCT)}
    return records, context(CONFIG, NODES, [], horizon=END, cluster="lab")


def test_batch_inference_is_a_workload_of_the_ledger() -> None:
    assert BATCH_INFERENCE in WORKLOADS
    # it fits the ledger's workload column (16 characters)
    assert len(BATCH_INFERENCE) <= 16
    records, _ = _records_and_ctx()
    assert tags(records["201"].comment)["workload"] == BATCH_INFERENCE
    assert tags(records["203"].comment)["workload"] == "elastic"


def test_a_batch_job_is_booked_as_batch_inference_to_its_own_team() -> None:
    records, ctx = _records_and_ctx()
    got = {
        job: [(e.workload, e.team, e.pool, e.model, e.gpu_ms) for e in job_entries(rec, ctx)]
        for job, rec in records.items()
    }
    assert got == {
        "201": [("batch-inference", "nlp", "elastic", "", 3_600_000)],
        "202": [("elastic", "nlp", "elastic", "", 3_600_000)],
        "203": [("elastic", "team-vision", "elastic", "", 3_600_000)],
        "204": [("batch-inference", "team-vision", "batchq", "", 1_800_000)],
        "205": [("inference", "inference-platform", "elastic", "(unattributed)", 3_600_000)],
    }
    for rec in records.values():  # the bulk path books the same rows
        assert job_entry_tuples(rec, ctx) == [_as_tuple(e) for e in job_entries(rec, ctx)]


def test_the_report_shows_batch_inference_by_team(tmp_path: Path) -> None:
    records, ctx = _records_and_ctx()
    engine = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    summary = ingest_records(engine, records.values(), ctx, now=END)
    assert summary.new == 5
    window = Window(T0, END, "t")
    report = build_report(
        engine, window, ("team", "workload"), filters={"workload": "batch-inference"}
    )
    assert sorted((line.keys["team"], line.gpu_ms) for line in report.lines) == [
        ("nlp", 3_600_000),
        ("team-vision", 1_800_000),
    ]
    # re-ingesting the same window changes nothing
    again = ingest_records(engine, records.values(), ctx, now=END)
    assert again.new == 0


def test_the_partition_map_takes_batch_inference_and_nothing_unknown() -> None:
    with pytest.raises(ValidationError, match="batch-inference"):
        BridgeConfig.model_validate({"accounting": {"workloads": {"q": "batch"}}})
