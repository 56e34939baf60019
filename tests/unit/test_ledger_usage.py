"""Used vs allocated: the GPU sampler's per-job records into the ledger and the report.

The records here are written in the sampler's own format by its own `summarise` (the
real NVML path needs a GPU; see slurm_plugins/README.md)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from accounting.attribution import Context
from accounting.db import open_ledger
from accounting.errors import LedgerError
from accounting.ingest import ingest_records
from accounting.inventory import NodeCapacity, record_inventory
from accounting.report import Window, build_report
from accounting.usage import ingest_usage, read_spool, utilization_by_job
from bridge.cli import app
from bridge.slurm.model import AccountingRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "slurm_plugins"))
import gpu_sampler

T0 = datetime(2026, 11, 3, 8, tzinfo=UTC)


def _record(spool: Path, job: str, node: str, gpus: int, utils: list[float]) -> None:
    who = gpu_sampler.JobOnNode(job, node, "lab", tuple(str(i) for i in range(gpus)))
    samples = [
        {"t": 0, "gpus": [{"id": str(i), "util": u, "mem": 1000} for i in range(gpus)]}
        for u in utils
    ]
    data = gpu_sampler.summarise(who, samples, T0.timestamp(), T0.timestamp() + 3600)
    (spool / f"job-{job}-{node}-{int(T0.timestamp())}.json").write_text(json.dumps(data))


def _job(job: str, gpus: int, account: str) -> AccountingRecord:
    return AccountingRecord(
        cluster="lab", job_id=job, array_job_id=None, array_task_id=None, name="j",
        partition="train", account=account, user="u", qos="normal", state="COMPLETED",
        submit=T0, start=T0, end=T0 + timedelta(hours=1), elapsed_s=3600, nodes=("n1",),
        gpus=gpus, gpu_type="h100", comment="", restarts=0,
    )  # fmt: skip


def test_used_vs_allocated_from_the_samplers_records(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    _record(spool, "1", "n1", 2, [50.0, 70.0])  # mean 60%
    url = f"sqlite:///{tmp_path / 'l.db'}"
    engine = open_ledger(url)
    record_inventory(engine, "lab", [NodeCapacity("n1", "training", "h100", 4)], T0)
    ctx = Context(pool_of_node={"n1": "training"}, horizon=T0 + timedelta(hours=1))
    ingest_records(engine, [_job("1", 2, "nlp"), _job("2", 2, "vision")], ctx)
    assert ingest_usage(engine, read_spool(spool)) == 1
    assert ingest_usage(engine, read_spool(spool)) == 0  # idempotent
    assert utilization_by_job(engine) == {("lab", "1"): pytest.approx(0.6)}
    rep = build_report(
        engine, Window.parse("2026-11-03"), ["team"], usage=utilization_by_job(engine)
    )
    lines = {li.keys["team"]: li.as_dict() for li in rep.lines}
    assert lines["nlp"]["measured_gpu_hours"] == 2.0
    assert lines["nlp"]["used_gpu_hours"] == pytest.approx(1.2)
    assert lines["vision"]["measured_gpu_hours"] == 0.0  # no record: not measured
    assert "used_gpu_hours" in rep.columns()
    cfg = tmp_path / "stb.toml"
    cfg.write_text(f'[accounting]\nledger_url = "{url}"\n')
    res = CliRunner().invoke(
        app, ["report", "--window", "2026-11-03", "--by", "team", "--usage", "--format", "csv",
              "-c", str(cfg)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "nlp,2.0,2.0,1.2" in res.stdout


def test_a_bad_usage_record_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    _record(spool, "1", "n1", 1, [10.0])
    (spool / "job-2-n1-0.json").write_text('{"job_id": "2", "mean_util_pct": 140}')
    engine = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(LedgerError, match=r"job-2-n1-0\.json: not a GPU usage record"):
        ingest_usage(engine, read_spool(spool))
    assert utilization_by_job(engine) == {}
