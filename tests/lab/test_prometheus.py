"""A real Prometheus with deploy/prometheus's configuration finds, through the bridge's
http_sd document, the bridge itself and every ready Triton server (the baseline and a lent
replica) and scrapes them; its alert and recording rules load; under steady load the
signal read from Prometheus (`[observe] source = "prometheus"`) agrees with the direct
path's, a replica whose last scrape is too old gives no data, and a model's last hour per
version (`stb models status`) reads the load."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text as sql

from bridge.audit.asks import ask_lend
from bridge.lab.spec import LabSpec
from bridge.lab.tokens import token_file
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.models.status_hour import last_hour
from bridge.paths import project_root
from bridge.slurm.cli import SlurmCLI
from bridge.triton.client import TritonHttpClient
from bridge.triton.metrics import parse_page
from bridge.triton.prometheus import PrometheusSignal
from bridge.triton.signal import Scrape, instance_signal, model_signals

pytestmark = pytest.mark.lab


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _targets(url: str) -> list[dict[str, Any]]:
    try:
        return list(httpx.get(f"{url}/api/v1/targets", timeout=2).json()["data"]["activeTargets"])
    except (httpx.HTTPError, KeyError, ValueError):
        return []


def test_prometheus_scrapes_the_bridge_and_every_ready_triton(
    lab: LabSpec, daemon_config: Path, tmp_path: Path
) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is installed by `stb lab up`"
    exporter = next(
        line.split('"')[1]
        for line in daemon_config.read_text().splitlines()
        if line.startswith("exporter_listen")
    )
    conf_dir = tmp_path / "prometheus"
    conf_dir.mkdir()
    text = (project_root() / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "127.0.0.1:9108" in text
    (conf_dir / "prometheus.yml").write_text(text.replace("127.0.0.1:9108", exporter))
    for rule_file in ("alerts.yml", "rules.yml"):
        shutil.copy(project_root() / "deploy" / "prometheus" / rule_file, conf_dir)
    shutil.copy(token_file(lab.api_dir, "metrics"), conf_dir / "stb-metrics.token")
    finance = {"Authorization": f"Bearer {token_file(lab.api_dir, 'finance').read_text().strip()}"}
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = os.environ | lab.env()
    stb = str(Path(sys.executable).with_name("stb"))
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    store, queue, cli = LeaseStore(engine), RequestQueue(engine), SlurmCLI(env=lab.env())
    with open(tmp_path / "daemon.log", "ab") as log, open(tmp_path / "prom.log", "ab") as plog:
        daemon = subprocess.Popen(
            [stb, "daemon", "-c", str(daemon_config)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={conf_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=plog,
            stderr=subprocess.STDOUT,
        )
        try:
            ask_lend(queue, lab.pool_nodes("elastic")[0].name, ["busy"])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                serving = any(lease.state == LeaseState.SERVING for lease in store.open_leases())
                up = {
                    (t["labels"].get("role"), t["labels"].get("node"))
                    for t in _targets(url)
                    if t["health"] == "up"
                }
                want = {
                    ("bridge", None),
                    ("triton", lab.pool_nodes("infer")[0].name),
                    ("triton", lab.pool_nodes("elastic")[0].name),
                }
                if serving and want <= up:
                    break
                time.sleep(1)
            else:
                pytest.fail(
                    f"targets up: {up}; log: {(tmp_path / 'daemon.log').read_text()[-2000:]}"
                )
            lent = [
                t
                for t in _targets(url)
                if t["labels"].get("node") == lab.pool_nodes("elastic")[0].name
            ]
            assert lent and lent[0]["labels"]["lease"] != "baseline"
            # The bridge's own metrics arrive, and the alert rules are loaded.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                res = httpx.get(
                    f"{url}/api/v1/query", params={"query": 'stb_leases{state="serving"}'}
                ).json()
                if res["data"]["result"] and res["data"]["result"][0]["value"][1] == "1":
                    break
                time.sleep(1)
            else:
                pytest.fail(f"stb_leases never showed the serving lease: {res}")
            # The ledger: the daemon ingests on its schedule, exports GPU-hours by team and
            # workload, serves the report over HTTP and stores Triton's compute counters.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                res = httpx.get(
                    f"{url}/api/v1/query",
                    params={"query": 'stb_ledger_gpu_hours_total{workload="inference"}'},
                ).json()
                if res["data"]["result"] and float(res["data"]["result"][0]["value"][1]) > 0:
                    break
                time.sleep(1)
            else:
                pytest.fail(f"stb_ledger_gpu_hours_total never showed inference: {res}")
            today = datetime.now(UTC).date().isoformat()
            api = httpx.get(
                f"http://{exporter}/api/report",
                params={"window": today, "by": "workload,pool"},
                headers=finance,
            )
            assert api.status_code == 200, api.text
            booked = {(li["workload"], li["pool"]) for li in api.json()["lines"]}
            assert {("inference", "inference"), ("idle", "training")} <= booked, booked
            bad = httpx.get(
                f"http://{exporter}/api/report", params={"window": "November"}, headers=finance
            )
            assert bad.status_code == 400 and "window 'November'" in bad.json()["error"]
            ledger = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
            with ledger.connect() as conn:
                samples = conn.execute(sql("SELECT DISTINCT model FROM serving_sample")).all()
            assert {m for (m,) in samples} >= {"busy", "echo"}
            rule_groups = httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"]
            rules = [r for g in rule_groups for r in g["rules"]]
            assert {r["name"] for r in rules} >= {
                "StbSloBreachSustained",
                "StbLeaseStuck",
                "StbNoGoodTick",
                "stb:triton_success:rate20s",
                "stb:triton_p99_us:max",
            }
            _signals_agree(lab, daemon_config, url)
        finally:
            prom.send_signal(signal.SIGTERM)
            daemon.send_signal(signal.SIGTERM)
            for proc in (prom, daemon):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for job in cli.jobs(tag="stb:triton"):
                cli.cancel(job.job_id)


def _direct_busy(lab: LabSpec, seconds: float) -> Any:
    """The direct path's signal of `busy` over `seconds`: every ready Triton's page read
    twice, folded as the observe step folds them."""
    addrs = {n.name: n.addr for n in lab.nodes}
    servers = [
        TritonHttpClient(f"{addrs[j.nodes[0]]}:8000")
        for j in SlurmCLI(env=lab.env()).jobs(tag="stb:triton")
        if j.state == "RUNNING"
    ]
    first = [Scrape(c.address, time.monotonic(), parse_page(c.metrics_text())) for c in servers]
    time.sleep(seconds)
    later = [Scrape(c.address, time.monotonic(), parse_page(c.metrics_text())) for c in servers]
    return model_signals(instance_signal(a, b) for a, b in zip(first, later, strict=True))["busy"]


def _signals_agree(lab: LabSpec, daemon_config: Path, url: str) -> None:
    """Under steady load on `busy` (both replicas, through the bridge's nginx), the
    Prometheus path's signal agrees with the direct path's; with a staleness bound no
    scrape meets, every replica is no data."""
    listen = next(
        line.split('"')[1]
        for line in daemon_config.read_text().splitlines()
        if line.startswith("listen")
    )
    body = {"inputs": [{"name": "INPUT0", "shape": [8], "datatype": "FP32", "data": [1.0] * 8}]}
    stop = threading.Event()

    def load() -> None:  # about 20 requests a second, loopback only, for this test's life
        with httpx.Client(timeout=5) as client:
            while not stop.is_set():
                client.post(f"http://{listen}/v2/models/busy/infer", json=body)
                stop.wait(0.05)

    sender = threading.Thread(target=load, daemon=True)
    sender.start()
    try:
        time.sleep(25)  # the 20 s rate window full of steady load
        direct = _direct_busy(lab, 10)
        source = PrometheusSignal(url)
        reading = source.read()
        via = reading.models["busy"]
        print(f"\nbusy direct: {direct}\nbusy via Prometheus: {via}")
        assert via.instances == direct.instances == 2 and reading.stale["busy"] == 0
        assert via.request_rate == pytest.approx(direct.request_rate, rel=0.25)
        assert via.mean_latency_ms == pytest.approx(direct.mean_latency_ms, rel=0.5, abs=2)
        assert via.mean_compute_ms == pytest.approx(direct.mean_compute_ms, rel=0.5, abs=2)
        assert via.p99_ms == pytest.approx(direct.p99_ms, rel=0.5, abs=5)
        stale = PrometheusSignal(url, max_staleness_s=1e-6).read()
        assert "busy" not in stale.models and stale.stale["busy"] == 2
        source.close()
        # The model team's last hour (`stb models status`) from the same server: busy's
        # one version, its requests of these 25 s, a p99 that is at least the live one's.
        hour, note = last_hour("busy", url, datetime.now(UTC), 100.0)
        print(f"busy last hour: {hour} ({note})")
        assert note.startswith("prometheus ") and set(hour) == {1}, (hour, note)
        one = hour[1]
        assert one.requests is not None and one.requests > 100 and not one.failures, one
        assert one.p99_ms is not None and one.p99_ms >= 0.5 * (direct.p99_ms or 0), one
    finally:
        stop.set()
        sender.join(10)
