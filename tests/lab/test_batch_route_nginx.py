"""The batch route against a real nginx and real HTTP backends (no Slurm, no Triton).

Each test starts its own nginx (`NginxProcess`, every file under tmp_path, a free port of
127.0.0.1) and stand-in replicas on 127.0.2.x (as tests/lab/test_routing_nginx.py). Checks:
with the gate open `/batch/v2/models/<m>/infer` reaches the model's replicas as the online
path does (the backend sees the online path); closed, nginx answers 429 with Retry-After
and a JSON body while online requests keep being served, and no online request fails
while the gate flips; a model without a replica answers 503 on the batch route; the batch
access log counts each batch request (passed or refused) and no online one; the batch
client (deploy/batch/batch_infer.py) waits out a closed gate and finishes. Needs the
nginx binary (not root); all traffic stays on 127.x, a few hundred requests at most.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from bridge.routing import nginx
from bridge.routing.batchlog import BatchLog
from bridge.routing.nginxctl import NginxProcess, find_nginx
from bridge.routing.publisher import RoutingPublisher
from bridge.routing.table import BatchGate, RoutingTable

INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}


@pytest.fixture(autouse=True)
def _nginx(request: pytest.FixtureRequest) -> None:
    """nginx, as tests/lab/test_routing_nginx.py finds it: installed by `stb lab up` in a
    run with lab tests, else these tests skip."""
    lab_run = any(item.get_closest_marker("lab") for item in request.session.items)
    if not os.access(find_nginx(), os.X_OK) and lab_run:
        request.getfixturevalue("lab")
    if not os.access(find_nginx(), os.X_OK):
        pytest.skip(f"nginx is not installed ({find_nginx()} missing; apt-get install nginx-light)")


class Backend:
    """A stand-in replica: answers POST /v2/models/<m>/infer with JSON naming itself and
    the model, any other path 404 (so a batch path that reached it uncut would show)."""

    def __init__(self, name: str, host: str) -> None:
        me = name

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                parts = self.path.split("/")  # "", v2, models, <m>, infer
                if len(parts) == 5 and parts[1:3] == ["v2", "models"] and parts[4] == "infer":
                    status, payload = 200, {"backend": me, "model": parts[3]}
                else:
                    status, payload = 404, {"error": f"{me}: no {self.path}"}
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class BatchRig:
    publisher: RoutingPublisher
    base_url: str
    backends: list[Backend]
    log: BatchLog

    def table(self, gate: BatchGate | None, **routes: list[str]) -> RoutingTable:
        every = {"echo": [b.endpoint for b in self.backends]}
        return RoutingTable.build(routes or every, batch=gate)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[BatchRig]:
    backends = [Backend("b1", "127.0.2.1"), Backend("b2", "127.0.2.2")]
    proc = NginxProcess(tmp_path / "nginx")
    proc.start()
    port = _free_port()
    log_path = tmp_path / "nginx" / "logs" / "batch-access.log"
    publisher = RoutingPublisher(
        proc.routing_conf,
        tmp_path / "sd.json",
        proc.control,
        settings=nginx.NginxSettings(listen=f"127.0.0.1:{port}", batch_log=str(log_path)),
    )
    try:
        yield BatchRig(publisher, f"http://127.0.0.1:{port}", backends, BatchLog(log_path))
    finally:
        proc.stop()
        for b in backends:
            b.stop()


def _post(client: httpx.Client, url: str) -> httpx.Response:
    return client.post(url, json=INFER_BODY, timeout=5)


def test_open_gate_passes_batch_requests_to_the_models_replicas(rig: BatchRig) -> None:
    rig.publisher.publish(rig.table(BatchGate(open=True)))
    rig.log.read(0.0)  # from here on
    with httpx.Client() as client:
        answers = [_post(client, f"{rig.base_url}/batch/v2/models/echo/infer") for _ in range(6)]
        online = [_post(client, f"{rig.base_url}/v2/models/echo/infer") for _ in range(4)]
        stray = client.get(f"{rig.base_url}/batch/v2/models/nope/infer", timeout=5)
    assert [r.status_code for r in answers] == [200] * 6
    # the replica saw the online path (the /batch prefix cut off), and both took turns
    assert {r.json()["model"] for r in answers} == {"echo"}
    assert {r.json()["backend"] for r in answers} == {"b1", "b2"}
    assert [r.status_code for r in online] == [200] * 4
    assert stray.status_code == 404
    counts = rig.log.read(10.0)
    assert counts.passed == {"echo": 6} and counts.refused == {}  # online is not counted
    assert counts.rates() == {"echo": 0.6}


def test_closed_gate_answers_429_and_online_goes_on(rig: BatchRig) -> None:
    rig.publisher.publish(rig.table(BatchGate(open=False, retry_after_s=45)))
    rig.log.read(0.0)
    with httpx.Client() as client:
        refused = _post(client, f"{rig.base_url}/batch/v2/models/echo/infer")
        stream = _post(client, f"{rig.base_url}/batch/v2/models/echo/generate_stream")
        online = _post(client, f"{rig.base_url}/v2/models/echo/infer")
    assert refused.status_code == 429 and stream.status_code == 429
    assert refused.headers["Retry-After"] == "45"
    assert refused.json() == {
        "error": "the batch route is closed for online load: retry after 45 s"
    }
    assert online.status_code == 200 and online.json()["model"] == "echo"
    counts = rig.log.read(1.0)
    assert counts.passed == {} and counts.refused == {"echo": 2}


def test_the_gate_flips_without_losing_an_online_request(rig: BatchRig) -> None:
    """Online requests run throughout while the gate opens and closes three times (each
    flip a graceful reload): none fails; batch requests get 200 or 429 by the gate."""
    rig.publisher.publish(rig.table(BatchGate(open=True)))
    stop = threading.Event()
    statuses: list[int] = []

    def online() -> None:
        with httpx.Client() as client:
            while not stop.is_set() and len(statuses) < 2000:
                statuses.append(_post(client, f"{rig.base_url}/v2/models/echo/infer").status_code)

    worker = threading.Thread(target=online)
    worker.start()
    seen: list[int] = []
    try:
        with httpx.Client() as client:
            for is_open in (False, True, False, True, False, True):
                rig.publisher.publish(rig.table(BatchGate(open=is_open)))
                got = _post(client, f"{rig.base_url}/batch/v2/models/echo/infer").status_code
                seen.append(got)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert seen == [429, 200, 429, 200, 429, 200]
    assert statuses and set(statuses) == {200}, statuses


def test_a_model_without_replica_answers_503_on_the_batch_route(rig: BatchRig) -> None:
    rig.publisher.publish(rig.table(BatchGate(open=True), echo=[rig.backends[0].endpoint], cold=[]))
    with httpx.Client() as client:
        cold = _post(client, f"{rig.base_url}/batch/v2/models/cold/infer")
        echo = _post(client, f"{rig.base_url}/batch/v2/models/echo/infer")
    assert cold.status_code == 503 and cold.headers["Retry-After"] == "1"
    assert cold.json() == {"error": "model cold has no ready replica"}
    assert echo.status_code == 200


def test_the_batch_client_waits_out_a_closed_gate_and_finishes(
    rig: BatchRig, tmp_path: Path
) -> None:
    """deploy/batch/batch_infer.py through the real nginx: the gate closed (Retry-After
    1), the client pauses on 429; the gate opened, it sends the same requests again and
    every one is answered once."""
    rig.publisher.publish(rig.table(BatchGate(open=False, retry_after_s=1)))
    rig.log.read(0.0)
    inputs = tmp_path / "requests.jsonl"
    inputs.write_text("".join(json.dumps({"model": "echo", "request": INFER_BODY}) + "\n"
                              for _ in range(5)))  # fmt: skip
    out = tmp_path / "answers.jsonl"
    client = Path(__file__).resolve().parents[2] / "deploy" / "batch" / "batch_infer.py"
    proc = subprocess.Popen(
        [sys.executable, str(client), "--url", rig.base_url, "--input", str(inputs),
         "--out", str(out)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)
    assert proc.poll() is None  # still waiting at the closed gate
    rig.publisher.publish(rig.table(BatchGate(open=True)))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "batch route closed (429): waiting 1 s" in err
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(a["line"], a["status"]) for a in answers] == [(i, 200) for i in range(5)]
    counts = rig.log.read(10.0)
    assert counts.passed == {"echo": 5} and counts.refused["echo"] >= 1
