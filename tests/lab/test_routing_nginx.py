"""Routing against a real nginx and real HTTP backends (no Slurm, no Triton).

Each test starts its own nginx (`NginxProcess`, every file under tmp_path, listening on a
free port of 127.0.0.1) and small stdlib HTTP servers on 127.0.2.x that answer Triton's
inference path with their own name. Checks: requests reach the right model's replicas
(least_conn: one at a time they alternate, a replica with requests in flight is passed
over); a publish without a replica removes it after a graceful reload with no failed
request across the reloads; a configuration nginx refuses leaves the old one serving and
raises nginx's words; the http_sd document served over HTTP. Needs the nginx binary (not
root); each test takes about a second; all traffic stays on 127.x.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from bridge.routing import http_sd, nginx
from bridge.routing.errors import NginxConfigRejected
from bridge.routing.nginxctl import NginxProcess, child_pids, find_nginx
from bridge.routing.publisher import RoutingPublisher
from bridge.routing.table import BASELINE, MetricsTarget, RoutingTable


@pytest.fixture(autouse=True)
def _nginx(request: pytest.FixtureRequest) -> None:
    """nginx, looked for when the test runs, not when it is collected: on a fresh machine
    `stb lab up` (the lab fixture) is what installs it, in a run that has lab tests (not in
    the quick loop, `-m "not lab"`, which never starts the lab: these tests skip there)."""
    lab_run = any(item.get_closest_marker("lab") for item in request.session.items)
    if not os.access(find_nginx(), os.X_OK) and lab_run:
        request.getfixturevalue("lab")
    if not os.access(find_nginx(), os.X_OK):
        pytest.skip(f"nginx is not installed ({find_nginx()} missing; apt-get install nginx-light)")


BACKEND_HOSTS = ("127.0.2.1", "127.0.2.2", "127.0.2.3")
INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}


class Backend:
    """A stand-in replica: answers POST /v2/models/<m>/infer and GET /v2/health/ready with
    JSON naming itself. HTTP/1.1, so nginx's upstream keepalive is exercised."""

    def __init__(self, name: str, host: str) -> None:
        me = name
        #: seconds each inference takes (a replica holding a backlog)
        self.delay_s = 0.0
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stall

            def _answer(self, status: int, payload: dict[str, str]) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                parts = self.path.split("/")  # "", v2, models, <m>, infer
                if len(parts) == 5 and parts[1:3] == ["v2", "models"] and parts[4] == "infer":
                    time.sleep(backend.delay_s)
                    self._answer(200, {"backend": me, "model": parts[3]})
                else:
                    self._answer(404, {"error": f"{me}: no {self.path}"})

            def do_GET(self) -> None:
                if self.path == "/v2/health/ready":
                    self._answer(200, {"backend": me})
                else:
                    self._answer(404, {"error": f"{me}: no {self.path}"})

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.name = name
        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Rig:
    proc: NginxProcess
    publisher: RoutingPublisher
    base_url: str
    backends: dict[str, Backend] = field(default_factory=dict)

    def ep(self, name: str) -> str:
        return self.backends[name].endpoint


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    backends = {f"b{i + 1}": Backend(f"b{i + 1}", h) for i, h in enumerate(BACKEND_HOSTS)}
    proc = NginxProcess(tmp_path / "nginx")
    proc.start()
    port = _free_port()
    publisher = RoutingPublisher(
        proc.routing_conf,
        tmp_path / "sd.json",
        proc.control,
        settings=nginx.NginxSettings(listen=f"127.0.0.1:{port}"),
        bridge_metrics="127.0.0.1:9100",
    )
    try:
        yield Rig(proc, publisher, f"http://127.0.0.1:{port}", backends)
    finally:
        proc.stop()
        for b in backends.values():
            b.stop()
    assert proc.pid() is None


def _infer(client: httpx.Client, base: str, model: str) -> httpx.Response:
    return client.post(f"{base}/v2/models/{model}/infer", json=INFER_BODY, timeout=5)


def test_a_slow_replica_gets_fewer_of_the_concurrent_requests(rig: Rig) -> None:
    """least_conn: a replica with requests in flight (a backlog) is passed over while
    another has fewer; round robin would give each half."""
    rig.publisher.publish(RoutingTable.build({"echo": [rig.ep("b1"), rig.ep("b2")]}))
    rig.backends["b1"].delay_s = 1.0
    names: list[str] = []

    def one() -> None:
        with httpx.Client() as client:
            names.append(_infer(client, rig.base_url, "echo").json()["backend"])

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert len(names) == 20
    assert names.count("b1") <= 3, names


def test_requests_reach_the_models_replicas_in_turn(rig: Rig) -> None:
    table = RoutingTable.build({"echo": [rig.ep("b1"), rig.ep("b2")], "busy": [rig.ep("b3")]})
    first = rig.publisher.publish(table)
    assert first.nginx_changed and first.reload_s is not None
    with httpx.Client() as client:
        seen = [_infer(client, rig.base_url, "echo").json() for _ in range(6)]
        assert {s["model"] for s in seen} == {"echo"}
        names = [s["backend"] for s in seen]
        assert sorted(names) == ["b1"] * 3 + ["b2"] * 3
        assert all(a != b for a, b in itertools.pairwise(names)), names  # alternates
        assert [_infer(client, rig.base_url, "busy").json()["backend"] for _ in range(3)] == [
            "b3"
        ] * 3
        ready = client.get(f"{rig.base_url}/v2/health/ready")
        assert ready.status_code == 200 and ready.json()["backend"] in {"b1", "b2", "b3"}
        unrouted = _infer(client, rig.base_url, "nosuchmodel")
        assert unrouted.status_code == 404 and "not routed" in unrouted.json()["error"]

    # The same table again: nothing written, no reload (the master keeps its workers).
    master = rig.proc.control.master_pid()
    workers = child_pids(master)
    mtime = rig.proc.routing_conf.stat().st_mtime_ns
    again = rig.publisher.publish(
        RoutingTable.build({"busy": [rig.ep("b3")], **dict(table.routes)})
    )
    assert not again.nginx_changed and not again.sd_changed and again.reload_s is None
    assert rig.proc.routing_conf.stat().st_mtime_ns == mtime
    assert child_pids(master) == workers


def test_model_without_replica_answers_503(rig: Rig) -> None:
    rig.publisher.publish(RoutingTable.build({"echo": [rig.ep("b1")], "busy": []}))
    r = httpx.post(f"{rig.base_url}/v2/models/busy/infer", json=INFER_BODY)
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/json"
    assert r.headers["retry-after"] == "1"
    assert r.json() == {"error": "model busy has no ready replica"}


@dataclass
class Traffic:
    """Sends infer requests back to back (keepalive client, like `stb load`) until stopped
    or bounded, recording (send time, backend or error)."""

    base_url: str
    max_requests: int = 20000
    max_s: float = 20.0
    results: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        deadline = time.monotonic() + self.max_s
        with httpx.Client(timeout=5) as client:
            while not self.stop.is_set() and len(self.results) < self.max_requests:
                if time.monotonic() > deadline:
                    break
                sent = time.monotonic()
                try:
                    r = _infer(client, self.base_url, "echo")
                    outcome = (
                        r.json()["backend"] if r.status_code == 200 else f"HTTP {r.status_code}"
                    )
                except httpx.HTTPError as exc:
                    outcome = f"error {type(exc).__name__}: {exc}"
                self.results.append((sent, outcome))

    def failures(self) -> list[str]:
        return [o for _, o in self.results if o not in {"b1", "b2", "b3"}]


def test_publish_without_a_replica_removes_it_with_no_failed_request(rig: Rig) -> None:
    both = RoutingTable.build({"echo": [rig.ep("b1"), rig.ep("b2")]})
    only_b1 = both.without_endpoint(rig.ep("b2"))
    rig.publisher.publish(both)

    traffic = Traffic(rig.base_url)
    thread = threading.Thread(target=traffic.run, daemon=True)
    thread.start()
    reloads: list[float] = []
    removed_at: list[float] = []
    try:
        time.sleep(0.3)
        for i in range(10):  # remove b2, put it back, ... : ten graceful reloads under load
            result = rig.publisher.publish(only_b1 if i % 2 == 0 else both)
            assert result.nginx_changed and result.reload_s is not None
            reloads.append(result.reload_s)
            if i % 2 == 0:
                removed_at.append(time.monotonic())
            time.sleep(0.25)
    finally:
        traffic.stop.set()
        thread.join(timeout=10)

    failures = traffic.failures()
    print(
        f"\nrouting: {len(traffic.results)} requests across {len(reloads)} reloads, "
        f"{len(failures)} failed; reload (SIGHUP until no old worker accepts) "
        f"median {sorted(reloads)[len(reloads) // 2] * 1000:.1f} ms, "
        f"max {max(reloads) * 1000:.1f} ms"
    )
    assert failures == [], failures[:5]
    assert max(reloads) < 1.0  # nginx waits 100 ms before telling old workers to quit
    assert len(traffic.results) > 200  # the loop really ran across the reloads
    # After each removal took effect, b2 got no new request (one already in flight on an
    # old worker may still finish there: allow 50 ms).
    for t_removed in removed_at:
        window = [o for t, o in traffic.results if t_removed + 0.05 < t < t_removed + 0.25]
        assert window and set(window) == {"b1"}, window[:10]


def test_config_nginx_refuses_keeps_the_old_one_serving(rig: Rig) -> None:
    good = RoutingTable.build({"echo": [rig.ep("b1"), rig.ep("b2")]})
    rig.publisher.publish(good)
    before = rig.proc.routing_conf.read_bytes()

    def bad_render(table: RoutingTable, settings: nginx.NginxSettings) -> str:
        return nginx.render(table, settings).replace("keepalive 32;", "keepalive 32 oops;")

    broken = RoutingPublisher(
        rig.proc.routing_conf,
        rig.publisher.sd_path,
        rig.proc.control,
        settings=rig.publisher.settings,
        render=bad_render,
    )
    with pytest.raises(NginxConfigRejected) as info:
        broken.publish(RoutingTable.build({"echo": [rig.ep("b3")]}))
    print(f"\nnginx said: {info.value.output}")
    assert "[emerg]" in info.value.output and '"keepalive"' in info.value.output
    assert rig.proc.routing_conf.read_bytes() == before
    assert sorted(p.name for p in rig.proc.routing_conf.parent.iterdir()) == [
        "nginx.conf",
        "routing.conf",
    ]  # no candidate or backup left behind
    with httpx.Client() as client:
        assert {_infer(client, rig.base_url, "echo").json()["backend"] for _ in range(4)} == {
            "b1",
            "b2",
        }
    # A listen address nginx cannot use is refused in nginx's words too, old file kept.
    bad_listen = RoutingPublisher(
        rig.proc.routing_conf,
        rig.publisher.sd_path,
        rig.proc.control,
        settings=rig.publisher.settings,
        render=lambda t, s: nginx.render(t, s).replace(
            f"listen {rig.publisher.settings.listen};", "listen 127.0.0.1:99999;"
        ),
    )
    with pytest.raises(NginxConfigRejected, match="invalid port"):
        bad_listen.publish(good)
    assert rig.proc.routing_conf.read_bytes() == before
    # The good publisher still works afterwards.
    assert rig.publisher.publish(RoutingTable.build({"echo": [rig.ep("b3")]})).nginx_changed
    assert _infer(httpx.Client(), rig.base_url, "echo").json()["backend"] == "b3"


def test_http_sd_document_served_over_http(rig: Rig) -> None:
    table = RoutingTable.build(
        {"echo": [rig.ep("b1")]},
        [
            MetricsTarget("127.0.2.1:18002", "n4", "101", BASELINE, ("echo",)),
            MetricsTarget("127.0.2.2:18002", "n3", "202", "lease-7", ("echo", "busy")),
        ],
    )
    rig.publisher.publish(table)
    with http_sd.SdServer(("127.0.0.1", 0), rig.publisher.document) as server:
        r = httpx.get(server.url, timeout=5)
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        doc = r.json()
        assert httpx.get(server.url.replace("/sd", "/other"), timeout=5).status_code == 404
    assert [g["targets"] for g in doc] == [
        ["127.0.2.1:18002"],
        ["127.0.2.2:18002"],
        ["127.0.0.1:9100"],
    ]
    assert doc[1]["labels"]["__meta_stb_lease"] == "lease-7"
    assert doc[1]["labels"]["__meta_stb_models"] == ",busy,echo,"
    assert doc[2]["labels"]["job"] == "stb-bridge"
    assert json.loads(rig.publisher.sd_path.read_bytes()) == doc
