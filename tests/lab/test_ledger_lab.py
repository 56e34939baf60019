"""The ledger against Slurm's own accounting, on the lab.

Jobs of three teams (one multi-node, one array, one elastic), a weight-staging job of the
bridge's (booked as workload staging) and a Triton server that
serves two models under load run on the lab; the daemon's ledger feed stores the server's
scraped compute counters; then `ingest_window` books the window. Checked:

- per account, the ledger's GPU-ms equal Slurm's: sacct's own text output
  (`-X --truncate`: AllocTRES gres/gpu x ElapsedRaw within the window). Tolerance 0.1%
  (the issue's goal); both sides count whole seconds, so the figures agree exactly.
  sreport is not compared: it reads slurmdbd's hourly rollup, which covers only complete
  hours, and a fresh lab has none (see the closing note of issue 5).
- the Triton job is split among its models by compute time: the busy model's GPU-ms equal
  the compute time Triton reports for it (within 2 ms of rounding), echo's likewise, the
  rest is the job's (unattributed) row, and the parts sum to the job.
- per pool and hour, allocated + idle (+ down lines) = the capacity of the pool's nodes
  since slurmdbd registered the cluster.
- re-ingesting the same window changes nothing; `stb report --format json` gives the same
  per-account totals.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from sqlalchemy import select
from typer.testing import CliRunner

from accounting.buckets import floor_hour
from accounting.db import open_ledger
from accounting.schema import CAPACITY_SOURCE, UNATTRIBUTED
from accounting.tables import LEDGER
from bridge.cli import app
from bridge.lab import triton
from bridge.lab.demo import lab_config
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import MIG_POOL, LabSpec
from bridge.ledger.feed import LedgerFeed, gpu_equivalents, ingest_window
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.slices import SliceRules, needs_shares, shares_from_tres
from bridge.triton.client import TritonHttpClient
from bridge.triton.metrics import parse_page

from .helpers import sbatch, squeue_state, wait_sacct_final

pytestmark = pytest.mark.lab


def _sacct_gpu_ms(lab: LabSpec, since: datetime, until: datetime) -> dict[str, int]:
    """GPU-ms per account as Slurm computes them: AllocTRES gres/gpu x ElapsedRaw, with
    start and end truncated to the window by sacct itself."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    out = subprocess.run(
        ["sacct", "-X", "--allusers", "--duplicates", "--truncate", "-n", "-P",
         "-S", since.strftime(fmt), "-E", until.strftime(fmt),
         "--format=JobIDRaw,Account,AllocTRES,ElapsedRaw,State"],
        env=os.environ | lab.env() | {"TZ": "UTC"}, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    totals: dict[str, int] = defaultdict(int)
    for line in out.splitlines():
        _job, account, tres, elapsed, _state = line.split("|")
        gpus: int | Fraction = 0
        for item in tres.split(","):
            key, _, value = item.partition("=")
            if key == "gres/gpu":
                gpus = int(value)
        if needs_shares(tres):  # a MIG slice: its fraction of a GPU (a lab up with --mig)
            gpus = sum(shares_from_tres(tres, SliceRules()).values(), Fraction(0))
        if gpus:
            totals[account] += int(gpus * int(elapsed) * 1000)
    return dict(totals)


def _wait_idle_queue(lab: LabSpec, jobs: list[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(squeue_state(lab, j)[0] == "" for j in jobs):
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs still queued after {timeout_s}s: {jobs}")


def test_ledger_agrees_with_sacct_and_splits_the_serving_job(
    lab: LabSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = lab_config(lab)
    config = config.model_copy(
        update={
            "database_url": f"sqlite:///{tmp_path / 'bridge.db'}",
            "accounting": config.accounting.model_copy(
                update={"ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}", "sample_interval_s": 0}
            ),
        }
    )
    ledger = open_ledger(config.accounting.ledger_url)
    feed = LedgerFeed(config, ledger)
    t0 = datetime.now(UTC)

    batch = [
        sbatch(lab, "--partition=train", "--account=team-vision", "--gres=gpu:2",
               "--wrap", "sleep 6"),
        sbatch(lab, "--partition=train", "--account=team-nlp", "-N2", "--gres=gpu:2",
               "--wrap", "sleep 5"),
        sbatch(lab, "--partition=train", "--account=team-nlp", "--array=1-2",
               "--gres=gpu:1", "--wrap", "sleep 4"),
        sbatch(lab, "--partition=elastic", "--account=team-research", "--gres=gpu:3",
               "--requeue", "--wrap", "sleep 5"),
        # a weight-staging job of the bridge's (bridge.slurm.staging's name and comment),
        # here given a GPU so that it books GPU time
        sbatch(lab, "--partition=elastic", "--account=bridge", "--gres=gpu:1",
               "--job-name=stb-staging-weighty-1", "--comment=stb:staging", "--requeue",
               "--wrap", "sleep 3"),
    ]  # fmt: skip
    reserved = lab.pool_nodes("infer")[0].name
    serving = triton.submit(lab, node=reserved, gpus=2, models="busy,echo", name="stb-ledger")
    try:
        served = triton.wait_ready(lab, serving, timeout_s=120)
        metrics = TritonHttpClient(served.http_url, api_key=triton.api_key(lab))

        def scrape() -> dict[str, float]:
            page = parse_page(metrics.metrics_text())
            feed.record_page(serving, served.http_url, time.time(), page)
            return {
                model: sum(
                    (v or 0.0)
                    for v in (
                        s.compute_input_duration_us,
                        s.compute_infer_duration_us,
                        s.compute_output_duration_us,
                    )
                )
                for (model, _), s in page.models.items()
            }

        scrape()
        client = httpclient.InferenceServerClient(served.http_url)
        for i in range(40):
            for model in ("busy", "echo") if i % 2 == 0 else ("busy",):
                data = np.ones((1, 4) if model == "echo" else (4,), dtype=np.float32)
                inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
                inp.set_data_from_numpy(data)
                client.infer(model, [inp])
            if i == 20:
                scrape()
        client.close()
        compute_us = scrape()
        metrics.close()
    finally:
        slurm(lab, "scancel", serving, check=False)
    assert compute_us["busy"] > 500_000, compute_us  # 40 requests of 20 ms

    for job in batch:
        wait_sacct_final(lab, job, timeout_s=90)
    serving_rec = wait_sacct_final(lab, serving, timeout_s=90)
    _wait_idle_queue(lab, [*batch, serving])
    time.sleep(1)

    cli = SlurmCLI(env=lab.env())
    since = floor_hour(t0)
    until = datetime.now(UTC).replace(microsecond=0)
    first = ingest_window(config, cli, ledger, since, until, now=until)
    assert first.new >= 7, first.line()  # 5 batch jobs (one with 2 array tasks) + Triton
    assert not first.deferred, first.deferred

    # 1. Per account, the ledger equals Slurm's own figures for the window.
    in_window = select(LEDGER).where(LEDGER.c.bucket >= since).order_by(LEDGER.c.id)
    with ledger.connect() as conn:
        rows = conn.execute(in_window).all()
    ours: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.source != CAPACITY_SOURCE:
            ours[r.account] += r.gpu_ms
    theirs = _sacct_gpu_ms(lab, since, until)
    print("GPU-ms per account, ledger vs sacct:", {a: (ours[a], theirs.get(a)) for a in ours})
    assert set(ours) == set(theirs), (ours, theirs)
    for account, ms in theirs.items():
        assert abs(ours[account] - ms) <= 0.001 * ms, (account, ours[account], ms)
    for team in ("team-vision", "team-nlp", "team-research", "bridge"):
        assert ours[team] > 0, ours

    # 2. The serving job's split: models by compute time, the rest unattributed.
    job_rows = [r for r in rows if r.source.startswith(f"{lab.cluster}:{serving}:")]
    by_model: dict[str, int] = defaultdict(int)
    for r in job_rows:
        by_model[r.model] += r.gpu_ms
        assert r.workload == "inference" and r.pool == "inference"
    whole = sum(by_model.values())
    assert whole == 2 * serving_rec["time"]["elapsed"] * 1000  # 2 GPUs x its elapsed time
    assert abs(by_model["busy"] - compute_us["busy"] / 1000) <= 2, (by_model, compute_us)
    assert abs(by_model["echo"] - compute_us["echo"] / 1000) <= 2, (by_model, compute_us)
    assert by_model[UNATTRIBUTED] == whole - by_model["busy"] - by_model["echo"] > 0
    teams = {r.model: r.team for r in job_rows}
    assert teams["busy"] == "team-vision"  # stb.team in busy's config.pbtxt
    assert teams[UNATTRIBUTED] == "inference-platform"  # [accounting.teams] bridge = ...

    # 2b. The staging job is serving's overhead: workload staging, under the model it stages.
    stage_rows = [r for r in rows if r.source.startswith(f"{lab.cluster}:{batch[-1]}:")]
    assert stage_rows, [r.source for r in rows]
    assert {(r.workload, r.model, r.account, r.pool) for r in stage_rows} == {
        ("staging", "weighty", "bridge", "elastic")
    }

    # 3. Per pool and hour: allocated + idle = capacity (GPUs x seconds since `since`).
    gpus_of_pool: dict[str, float] = defaultdict(float)
    for node in cli.nodes():
        pool = (
            "inference"
            if node.partitions == ("infer",)
            else ("elastic" if "elastic" in node.partitions else "training")
        )
        if node.partitions == (MIG_POOL,):  # in no pool: under its partition
            pool = MIG_POOL
        # a MIG slice books its fraction of a GPU
        gpus_of_pool[pool] += float(gpu_equivalents(node, SliceRules()))
    cells: dict[tuple[str, datetime], int] = defaultdict(int)
    for r in rows:
        cells[(r.pool, r.bucket)] += r.gpu_ms
    # capacity counts from slurmdbd's registration of the cluster (a lab younger than the
    # hour has less of it)
    registrations = [e for e in cli.events(since, until) if e.is_registration]
    registered = min(e.start for e in registrations)
    # the node of MIG slices from the first registration that lists it (a lab made before
    # it had one registered it later)
    mig_names = {n.name for n in lab.mig_nodes}
    mig_registered = min(
        (e.start for e in registrations if mig_names & set(e.nodes)), default=registered
    )
    for (pool, bucket), ms in cells.items():
        lo = max(bucket, since, mig_registered if pool == MIG_POOL else registered)
        hi = min(bucket + timedelta(hours=1), until)
        expected = gpus_of_pool[pool] * int((hi - lo).total_seconds() * 1000)
        # whole GPUs exactly; slices floored to the millisecond, one per slice
        assert abs(ms - expected) <= (len(lab.mig_profiles) if pool == MIG_POOL else 0), (
            pool, bucket, ms, expected,
        )  # fmt: skip

    # 4. Re-ingest: nothing changes.
    again = ingest_window(config, cli, ledger, since, until, now=until)
    assert (again.new, again.changed, again.rows_written) == (0, 0, 0), again.line()
    with ledger.connect() as conn:
        assert conn.execute(in_window).all() == rows

    # 5. The report (CLI, JSON) says the same per account.
    cfg_file = tmp_path / "bridge.toml"
    cfg_file.write_text(
        f'database_url = "{config.database_url}"\n[accounting]\n'
        f'ledger_url = "{config.accounting.ledger_url}"\ncluster = "{lab.cluster}"\n'
        '[accounting.teams]\nbridge = "inference-platform"\n'
    )
    window = f"{since.isoformat()}..{(floor_hour(until) + timedelta(hours=1)).isoformat()}"
    res = CliRunner().invoke(
        app, ["report", "--window", window, "--by", "account", "--format", "json",
              "-c", str(cfg_file)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    reported = {line["account"]: line["gpu_ms"] for line in doc["lines"] if line["account"]}
    assert reported == dict(ours)

    # 6. The command line's ingest of the same window (same configuration): a no-op.
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)
    res = CliRunner().invoke(
        app, ["accounting", "ingest", "--since", since.isoformat(), "--until",
              until.isoformat(), "-c", str(cfg_file)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "0 new, 0 changed" in res.output and "0 rows written" in res.output, res.output

    # 7. The unit economics from Triton's own counters: exactly the requests sent, per
    # model and version, and the model's ledger time per request.
    res = CliRunner().invoke(
        app, ["report", "--window", window, "--by", "model", "--format", "json", "--with",
              "economics", "-c", str(cfg_file)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows_ = json.loads(res.stdout)["sections"]["unit_economics"]["rows"]
    econ = {(r["model"], r["version"]): r for r in rows_}
    assert econ[("busy", "1")]["requests"] == econ[("busy", "*")]["requests"] == 40, econ
    assert econ[("echo", "1")]["requests"] == 20, econ
    assert econ[("busy", "*")]["gpu_hours"] == round(by_model["busy"] / 3_600_000, 6)
    assert econ[("busy", "*")]["gpu_seconds_per_request"] == pytest.approx(
        by_model["busy"] / 1000 / 40
    )
    # loaded: busy and echo carry the job's unattributed time between them
    loaded = econ[("busy", "*")]["loaded_gpu_hours"] + econ[("echo", "*")]["loaded_gpu_hours"]
    assert loaded == pytest.approx(whole / 3_600_000, abs=1e-5)
