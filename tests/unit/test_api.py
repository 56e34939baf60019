"""The daemon's HTTP API over real HTTP(S) on loopback, against a real lease database
(SQLite): bearer tokens and roles (401, 403, 200), TLS, operator requests recorded under
the token's name (in the audit trail too), pool holds, hostile requests refused with
nothing written, and the OpenAPI document the server publishes checked against the routes
it answers."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from accounting.db import open_ledger
from bridge.cli import app
from bridge.config import BridgeConfig, ModelConfig
from bridge.daemon.metrics import BridgeMetrics
from bridge.http.app import create_app
from bridge.http.auth import TokensError, TokenTable, add_token, parse_tokens
from bridge.http.routes import finance_routes, operator_routes
from bridge.http.server import HttpServer, tls_context
from bridge.leases.audit import AuditStore
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from tests.unit.helpers import write_tokens

OPERATOR = "o" * 24
FINANCE = "f" * 24
BOTH = "b" * 24


@dataclass
class Served:
    url: str
    queue: RequestQueue
    store: LeaseStore
    verify: ssl.SSLContext | bool = True

    def call(
        self,
        method: str,
        path: str,
        token: str | None,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        headers = dict(headers or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.request(
            method, self.url + path, headers=headers, verify=self.verify, timeout=5, **kw
        )


def _config() -> BridgeConfig:
    return BridgeConfig(models={"echo": ModelConfig(slo_p99_ms=50)})


def _serve(tmp_path: Path, tls: bool = False) -> tuple[HttpServer, Served]:
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    queue, store = RequestQueue(engine), LeaseStore(engine)
    tokens = write_tokens(
        tmp_path / "tokens",
        {
            "olga": ("operator", OPERATOR),
            "fred": ("finance", FINANCE),
            "ann": ("finance,operator", BOTH),
        },
    )
    routes = [
        operator_routes(_config(), queue, store),
        finance_routes(open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}"), "line"),
    ]
    context = verify = None
    if tls:
        cert, key = _self_signed(tmp_path)
        context, verify = tls_context(cert, key), ssl.create_default_context(cafile=cert)
    app = create_app(
        BridgeMetrics(), 5, tokens=TokenTable(tokens), sd_document=lambda: b"[]", routers=routes
    )
    server = HttpServer(app, ("127.0.0.1", 0), tls=context).start()
    return server, Served(server.url, queue, store, verify if verify else True)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Served]:
    server, served = _serve(tmp_path)
    try:
        yield served
    finally:
        server.stop()


def test_no_token_401_wrong_role_403_right_role_200(api: Served) -> None:
    report = "/api/report?window=2026-11"
    no = api.call("GET", report, None)
    assert no.status_code == 401 and "missing bearer token" in no.json()["error"]
    assert no.headers["WWW-Authenticate"].startswith("Bearer")
    assert api.call("GET", report, "x" * 24).status_code == 401  # unknown token
    wrong = api.call("GET", report, OPERATOR)
    assert wrong.status_code == 403 and "olga does not hold the role 'finance'" in wrong.text
    assert api.call("GET", report, FINANCE).status_code == 200
    assert api.call("GET", report, BOTH).status_code == 200
    lend = api.call("POST", "/api/lend", FINANCE, json={"node": "n3"})
    assert lend.status_code == 403 and api.queue.pending() == []
    # the open paths stay open
    assert httpx.get(api.url + "/metrics").status_code == 200
    assert httpx.get(api.url + "/healthz").status_code == 503  # no tick yet: open, unhealthy


def test_operator_requests_record_who_asked(api: Served) -> None:
    got = api.call("POST", "/api/lend", OPERATOR, json={"node": "n3", "models": ["echo"]})
    assert got.status_code == 202, got.text
    (req,) = api.queue.pending()
    assert (req.kind, req.node, req.models, req.requested_by) == ("lend", "n3", ["echo"], "olga")
    (entry,) = AuditStore.beside(api.queue).walk()
    assert (entry.action, entry.target, entry.actor, entry.token, entry.detail) == (
        "lend.request", "node n3", "olga", "olga", f"request {req.id}: models echo"
    )  # fmt: skip
    state = api.call("GET", "/api/request", OPERATOR, params={"id": req.id}).json()
    assert state == {
        "request": req.id, "kind": "lend", "requested_by": "olga", "done": False, "outcome": ""
    }  # fmt: skip
    gone = api.call("POST", "/api/return", BOTH, json={"lease": 99})
    assert gone.status_code == 404 and "not an open lease" in gone.json()["error"]


def test_drain_holds_a_pool_until_resumed(api: Served) -> None:
    held = api.call("POST", "/api/drain", OPERATOR, json={"pool": "training", "reason": "fw"})
    assert held.status_code == 200 and held.json()["held_by"] == "olga"
    hold = api.queue.holds()["training"]
    assert (hold.held_by, hold.reason) == ("olga", "fw")
    again = api.call("POST", "/api/drain", BOTH, json={"pool": "training"})
    assert again.json()["held_by"] == "olga"  # the hold in force, not a second one
    reserved = api.call("POST", "/api/drain", OPERATOR, json={"pool": "inference"})
    assert reserved.status_code == 400 and "reserved pool" in reserved.json()["error"]
    assert api.call("POST", "/api/resume", BOTH, json={"pool": "training"}).status_code == 200
    assert api.queue.holds() == {}
    again = api.call("POST", "/api/resume", BOTH, json={"pool": "training"})
    assert again.status_code == 404 and "not held" in again.json()["error"]
    # each in the audit trail once, under the token's name, with its outcome
    trail = [
        (e.action, e.target, e.token, e.outcome, e.detail)
        for e in AuditStore.beside(api.queue).walk()
    ]
    assert trail == [
        ("pool.drain", "pool training", "olga", "ok", "hold 1: fw"),
        ("pool.drain", "pool training", "ann", "ok", "already held by olga (hold 1)"),
        ("pool.resume", "pool training", "ann", "ok", "hold 1 by olga lifted"),
        ("pool.resume", "pool training", "ann", "refused", "not held"),
    ]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/api/lend", b"{not json", 400, "the body is not JSON"),
        ("/api/lend", b"[1, 2]", 400, "must be a JSON object"),
        ("/api/lend", b"\xff\xfe", 400, "the body is not JSON"),
        ("/api/lend", b'{"node": "n3", "colour": "red"}', 400, "colour: Extra inputs"),
        ("/api/lend", b'{"node": 3}', 400, "node: Input should be a valid string"),
        ("/api/lend", b'{"node": "../../etc"}', 400, "node: String should match pattern"),
        ("/api/lend", b'{"node": "n3; rm -rf /"}', 400, "node: String should match"),
        ("/api/lend", ('{"node": "' + "n" * 200 + '"}').encode(), 400, "node: String should"),
        ("/api/lend", b'{"node": "n3", "models": ["nope"]}', 400, "models: unknown nope"),
        ("/api/lend", b'{"node": "n3", "models": "echo"}', 400, "models: Input should be"),
        ("/api/return", b'{"lease": "7"}', 400, "lease: Input should be a valid integer"),
        ("/api/return", b'{"lease": -1}', 400, "lease: Input should be greater than"),
        ("/api/return", b'{"lease": 1e400}', 400, "lease: Input should be a valid integer"),
        ("/api/drain", b'{"pool": "nope"}', 404, "no pool 'nope'"),
        ("/api/drain", b'{"pool": "training", "reason": "' + b"x" * 600 + b'"}', 400, "reason"),
        ("/api/lend", b"x" * (64 * 1024 + 1), 413, "body over 65536 bytes"),
    ],
)
def test_hostile_bodies_are_refused_and_write_nothing(
    api: Served, path: str, body: bytes, status: int, message: str
) -> None:
    got = api.call("POST", path, BOTH, content=body, headers={"Content-Type": "application/json"})
    assert got.status_code == status, got.text
    assert message in got.json()["error"], got.json()
    assert api.queue.pending() == [] and api.queue.holds() == {}


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/api/report?window=" + "9" * 5000, 414, "query string over 4096"),
        ("GET", "/api/report?" + "&".join(f"k{i}=1" for i in range(60)), 400, "bad query"),
        ("GET", "/api/report?window=2026-13", 400, "window"),
        ("GET", "/api/request?id=1e9", 400, "id: one request id"),
        ("GET", "/api/request?id=1&id=2", 400, "id: one request id"),
        ("GET", "/api/request?id=99999999999999999999", 400, "id: one request id"),
        ("GET", "/api/lend", 405, "takes POST"),
        ("POST", "/api/report", 405, "takes GET"),
        ("GET", "/api/nope", 404, "no such path"),
    ],
)
def test_hostile_queries_are_refused(
    api: Served, method: str, path: str, status: int, message: str
) -> None:
    got = api.call(method, path, BOTH, content=b"{}" if method == "POST" else None)
    assert got.status_code == status, got.text
    assert message in got.json()["error"], got.json()


def test_a_post_without_length_is_refused(api: Served) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"node": "n3"}'

    got = api.call("POST", "/api/lend", OPERATOR, content=chunks())
    assert got.status_code == 411 and api.queue.pending() == []


#: every route the daemon serves with all its parts: (path, method) -> the role it needs
ROUTES: dict[tuple[str, str], str | None] = {
    ("/api/lend", "post"): "operator",
    ("/api/return", "post"): "operator",
    ("/api/drain", "post"): "operator",
    ("/api/resume", "post"): "operator",
    ("/api/request", "get"): "operator",
    ("/api/models/status", "get"): "operator",
    ("/api/report", "get"): "finance",
    ("/sd", "get"): "metrics",
    ("/metrics", "get"): None,
    ("/healthz", "get"): None,
}


def test_the_openapi_document_lists_every_route_its_method_and_role(api: Served) -> None:
    got = api.call("GET", "/openapi.json", None)  # open, like /metrics
    assert got.status_code == 200 and got.headers["Content-Type"] == "application/json"
    doc = got.json()
    assert doc["openapi"].startswith("3.") and doc["info"]["version"]
    listed = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert listed == set(ROUTES)
    assert doc["components"]["securitySchemes"]["bearer"]["type"] == "http"
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for (path, method), role in ROUTES.items():
        op = doc["paths"][path][method]
        assert op.get("security") == ([{"bearer": [role]}] if role else None), (path, op)
        # what the document says is what the server does: a guarded route refuses a
        # request without a token, an open one answers it
        status = api.call(method.upper(), path, None, content=b"{}" if method == "post" else None)
        assert status.status_code in ((401,) if role else (200, 503)), (path, status.text)
    lend = doc["paths"]["/api/lend"]["post"]
    body = lend["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["node"] and body["additionalProperties"] is False
    assert body["properties"]["node"]["pattern"] == "^[A-Za-z0-9_.-]{1,128}$"
    assert {"202", "400", "401", "403", "413"} <= set(lend["responses"])
    (param,) = doc["paths"]["/api/request"]["get"]["parameters"]
    assert (param["name"], param["in"], param["schema"]["type"]) == ("id", "query", "integer")


def test_a_405_names_the_method_and_allows_it(api: Served) -> None:
    got = api.call("DELETE", "/api/drain", OPERATOR)
    assert got.status_code == 405 and got.json() == {"error": "/api/drain takes POST"}
    assert got.headers["Allow"] == "POST"


def test_a_failing_handler_answers_json_and_names_no_internals(tmp_path: Path) -> None:
    from fastapi import APIRouter

    boom = APIRouter()

    @boom.get("/boom")
    def fail() -> None:
        raise RuntimeError("postgresql://bridge:secret@db/bridge is down")

    server = HttpServer(create_app(BridgeMetrics(), 5, routers=[boom]), ("127.0.0.1", 0))
    server.start()
    try:
        got = httpx.get(server.url + "/boom", timeout=5)
        assert got.status_code == 500 and "secret" not in got.text
        assert got.json() == {
            "error": "internal error (RuntimeError); the daemon's log has the details"
        }
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 503  # still serving
    finally:
        server.stop()


def test_over_tls(tmp_path: Path) -> None:
    server, api = _serve(tmp_path, tls=True)
    try:
        assert api.url.startswith("https://")
        assert api.call("GET", "/api/report?window=2026-11", None).status_code == 401
        assert api.call("GET", "/api/report?window=2026-11", FINANCE).status_code == 200
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is refused
            httpx.get(api.url + "/metrics", timeout=5)
        with pytest.raises(httpx.RemoteProtocolError):  # no plain HTTP on the TLS port
            httpx.get(api.url.replace("https", "http") + "/metrics", timeout=5)
    finally:
        server.stop()


def test_no_tokens_file_closes_the_api(tmp_path: Path) -> None:
    server = HttpServer(create_app(BridgeMetrics(), 5), ("127.0.0.1", 0)).start()
    try:
        got = httpx.get(server.url + "/sd")
        assert got.status_code == 404  # no routing, no /sd
    finally:
        server.stop()
    app = create_app(BridgeMetrics(), 5, sd_document=lambda: b"[]")
    server = HttpServer(app, ("127.0.0.1", 0)).start()
    try:
        got = httpx.get(server.url + "/sd", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert got.status_code == 401 and "no api.tokens_file" in got.json()["error"]
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("olga operator\n", "line 1: expected `name roles token`"),
        ("olga admin " + "t" * 20 + "\n", "unknown role(s) admin"),
        ("olga operator short\n", "shorter than 16"),
        ("ol/ga operator " + "t" * 20 + "\n", "bad name"),
        (f"a operator {'t' * 20}\nb finance {'t' * 20}\n", "line 2: the token of b is used twice"),
    ],
)
def test_bad_tokens_files_are_named(text: str, message: str) -> None:
    with pytest.raises(TokensError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_tokens(text)


def test_tokens_file_mode_reload_and_add(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "tokens", {"olga": ("operator", OPERATOR)})
    path.chmod(0o644)
    with pytest.raises(TokensError, match="readable by group or others"):
        TokenTable(path)
    path.chmod(0o600)
    table = TokenTable(path)
    assert table.authorize(f"Bearer {OPERATOR}", "operator").status == 200
    new = add_token(path, "fred", {"finance"})
    assert table.authorize(f"Bearer {new}", "finance").principal.name == "fred"  # type: ignore[union-attr]
    path.write_text(f"fred finance {new}\n")  # olga revoked, without a restart
    assert table.authorize(f"Bearer {OPERATOR}", "operator").status == 401
    with pytest.raises(TokensError):
        add_token(path, "bad name", {"finance"})
    assert path.read_text() == f"fred finance {new}\n"  # nothing half-written
    assert table.authorize("Basic b2xnYTpwdw==", "finance").status == 401


def test_the_cli_sends_operator_commands_through_the_api(api: Served, tmp_path: Path) -> None:
    token = tmp_path / "my.token"
    token.write_text(OPERATOR + "\n")
    cfg = tmp_path / "cli.toml"  # the CLI's own database is not the daemon's: unused
    cfg.write_text(
        f'database_url = "sqlite:///{tmp_path / "elsewhere.db"}"\n[models.echo]\nslo_p99_ms = 50\n'
    )
    flags = ["--api", api.url, "--token-file", str(token), "-c", str(cfg)]
    out = CliRunner().invoke(app, ["lend", "n3", "--models", "echo", "--wait", "0", *flags])
    assert out.exit_code == 0, out.output
    (req,) = api.queue.pending()
    assert (req.node, req.models, req.requested_by) == ("n3", ["echo"], "olga")
    out = CliRunner().invoke(app, ["drain", "training", "--reason", "fw", *flags])
    assert out.exit_code == 0 and "pool training held" in out.output, out.output
    assert api.queue.holds()["training"].held_by == "olga"
    bad = CliRunner().invoke(app, ["return", "99", "--wait", "0", *flags])
    assert bad.exit_code == 1 and "404" in bad.output and "not an open lease" in bad.output
