"""Batch inference on the lab: the bridge (a Reconciler on the real Slurm and Triton, its
own nginx) with `[batch]` on. The batch route opens after a calm dwell; the batch client
(deploy/batch/batch_infer.py) sends `busy` requests through it to the reserved replica,
which answers them, and the bridge counts them from nginx's batch access log as batch,
not online, load; an online load step then closes the gate in the pass that decides the
lend, published before the lend is carried out, and the client pauses on 429. The
client names a batch-inference job of team-nlp (`--job`: a `--comment=stb:batch` job on
the elastic partition); the pass stores its answered requests in a ledger, and the ledger
books the batch share of the reserved replica's serving time to team-nlp under
`batch-inference`, the parts summing to the serving job. About a minute on the lab;
traffic on 127.x only, bounded (one sequential client, 45 req/s online for 20 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from accounting.db import open_ledger
from accounting.schema import BATCH_INFERENCE
from accounting.tables import LEDGER, SOURCES
from bridge.config import BatchConfig
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.showcase import Load
from bridge.lab.spec import LabSpec
from bridge.ledger.feed import LedgerFeed, ingest_window
from bridge.paths import project_root
from bridge.policy import Lend
from bridge.triton.client import TritonHttpClient
from bridge.triton.metrics import parse_page

from .helpers import sbatch, tick_until, tick_until_baseline

pytestmark = pytest.mark.lab

BODY = {"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [1.0] * 16}]}


@pytest.fixture
def bridge_update(tmp_path: Path) -> dict[str, object]:
    return {
        "batch": BatchConfig(
            enabled=True, access_log=tmp_path / "batch-access.log", calm_s=6, retry_after_s=1
        )
    }


def test_batch_work_uses_the_reserved_replica_and_yields_to_an_online_step(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    log: list[str] = []
    t0 = datetime.now(UTC)
    # the batch job the client's requests name: a batch-inference job of team-nlp
    job = sbatch(lab, "--partition=elastic", "--account=team-nlp", "--comment=stb:batch",
                 "--wrap", "true")  # fmt: skip
    config = rec.config.model_copy(
        update={"accounting": rec.config.accounting.model_copy(update={"sample_interval_s": 0})}
    )
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    feed = LedgerFeed(config, ledger)
    assert rec.batch is not None
    rec.batch.attach_ledger(ledger, feed.cluster)
    tick_until_baseline(rec, lab, log)
    tick_until(rec, lambda: rec.batch_gate.open, 60, log)
    assert "batch route opened (calm)" in log
    obs = rec.last_observation
    assert obs is not None
    (server,) = [s for s in obs.servers if "busy" in s.models]
    metrics = TritonHttpClient(server.address, api_key=triton.api_key(lab))

    def scrape() -> None:  # the daemon's page hook, once: the serving job's counters
        page = parse_page(metrics.metrics_text())
        feed.record_page(server.job.job_id, server.address, time.time(), page)

    scrape()

    inputs = tmp_path / "requests.jsonl"
    inputs.write_text(
        "".join(json.dumps({"model": "busy", "request": BODY}) + "\n" for _ in range(3000))
    )
    out = tmp_path / "answers.jsonl"
    client = project_root() / "deploy" / "batch" / "batch_infer.py"
    proc = subprocess.Popen(
        [sys.executable, str(client), "--url", f"http://{endpoint}", "--input", str(inputs),
         "--out", str(out), "--max-wait-s", "2", "--job", job],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # batch work flows; the bridge sees it as batch load, so nothing is lent for it
        # and the gate stays open
        reports = []
        for _ in range(5):
            began = time.monotonic()
            reports.append(rec.run_once(datetime.now(UTC)))
            time.sleep(max(0.0, began + 1.0 - time.monotonic()))
        log += [line for r in reports for line in r.lines()]
        assert rec.batch_gate.open, "\n".join(log)
        assert not [a for r in reports for a in r.actions if isinstance(a, Lend)]
        rates = reports[-1].batch_rates.get("busy", 0.0)
        assert rates > 5.0, "\n".join(log)  # a sequential client on a 20 ms model
        answered = [json.loads(line) for line in out.read_text().splitlines()]
        assert answered and {a["status"] for a in answered} == {200}
        snap = rec.last_snapshot
        assert snap is not None
        measured = rec.last_observation.history["busy"][-1].request_rate  # type: ignore[union-attr]
        online = snap.history["busy"][-1].request_rate
        assert measured is not None and online is not None and online < measured

        # the online step: the lend's pass closes the gate, published before the lend
        step = Load(endpoint, 45.0, 20.0, seed=3)
        step.start()
        decided = None
        deadline = time.monotonic() + 30
        while decided is None and time.monotonic() < deadline:
            began = time.monotonic()
            report = rec.run_once(datetime.now(UTC))
            log += report.lines()
            if any(isinstance(a, Lend) for a in report.actions):
                decided = report
            time.sleep(max(0.0, began + 1.0 - time.monotonic()))
        assert decided is not None, "\n".join(log)
        assert not rec.batch_gate.open
        # in the lend's pass: the gate closed first, then the lend was carried out
        lines = decided.lines()
        (closed,) = [i for i, line in enumerate(lines) if line.startswith("batch route closed")]
        leased = [i for i, line in enumerate(lines) if line.startswith("lease ")]
        assert leased and closed < min(leased), "\n".join(lines)
        print(f"batch {rates:.1f} req/s, measured {measured:.1f}, online {online:.1f}")
        print("the lend's pass:", *lines, sep="\n  ")
        # the client is told 429 and waits
        time.sleep(3)
        step.stop_sending.set()
        step.join(60)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "batch route closed (429)" in err
    assert rec.batch.log.read(time.time()).refused.get("busy", 0) > 0
    # the online step lost nothing to the batch work or the gate
    assert step.report is not None and step.report.total.errors == {}
    assert step.report.total.dropped == 0

    # the ledger: the batch share of the serving job's time to the batch job's team
    scrape()
    now = datetime.now(UTC)
    ingest_window(config, rec.slurm, ledger, t0, now, now=now)
    serving = server.job.job_id
    with ledger.connect() as conn:
        (key, job_ms) = conn.execute(
            select(SOURCES.c.key, SOURCES.c.gpu_ms).where(SOURCES.c.job_id == serving)
        ).one()
        parts = conn.execute(
            select(LEDGER.c.workload, LEDGER.c.team, LEDGER.c.model, func.sum(LEDGER.c.gpu_ms))
            .where(LEDGER.c.source == key)
            .group_by(LEDGER.c.workload, LEDGER.c.team, LEDGER.c.model)
        ).all()
    booked = {(w, t, m): int(ms) for w, t, m, ms in parts}
    print("the serving job's rows:", *sorted(booked.items()), sep="\n  ")
    assert booked.get((BATCH_INFERENCE, "team-nlp", "busy"), 0) > 0, booked
    assert sum(booked.values()) == job_ms  # the parts sum to the serving job exactly
