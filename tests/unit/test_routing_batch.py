"""The batch route in the rendered nginx configuration, on literal tables: absent
without a gate (the text is as before), per model behind `/batch` with the gate open (the
online upstream, never the activator, a rollout's split, streams unbuffered), one 429 with
Retry-After when closed, the batch access log on every batch location, and the gate in
the table's version. The real nginx answering these is tests/lab/test_routing_nginx.py."""

from __future__ import annotations

import json
import re

import pytest

from bridge.routing import nginx
from bridge.routing.errors import InvalidRoute
from bridge.routing.table import BatchGate, RoutingTable, Split

A, B = "127.0.1.4:8000", "127.0.1.3:8000"
LOG = "/var/log/stb/batch-access.log"
LOGGED = nginx.NginxSettings(batch_log=LOG)


def _locations(text: str) -> dict[str, str]:
    """location spec -> its body, for one-line locations."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("location ") and line.endswith("}"):
            spec, _, body = line.removeprefix("location ").partition("{")
            out[spec.strip()] = body.rstrip("}").strip()
    return out


def _batch(text: str) -> dict[str, str]:
    return {k: v for k, v in _locations(text).items() if "/batch" in k}


def test_without_a_gate_nothing_changes() -> None:
    table = RoutingTable.build({"echo": [A]})
    text = nginx.render(table, LOGGED)
    assert "/batch" not in text and "log_format" not in text and "access_log" not in text
    assert "batch" not in table.canonical()


def test_an_open_gate_routes_each_model_to_its_online_upstream() -> None:
    table = RoutingTable.build({"echo": [A, B], "smol": [B]}, batch=BatchGate(open=True))
    text = nginx.render(table, LOGGED)
    locs = _batch(text)
    log = f"access_log {LOG} stb_batch;"
    cut = "rewrite ^/batch(/v2/models/.*)$ $1 break;"
    assert locs["/batch/v2/models/echo/"] == f"{log} {cut} proxy_pass http://stb_echo;"
    assert locs["/batch/v2/models/smol/"] == f"{log} {cut} proxy_pass http://stb_smol;"
    # the log format once, in the http context (before the server block)
    fmt = (
        "log_format stb_batch '$msec $status $request_uri $stb_batch_job $upstream_response_time';"
    )
    assert text.count(fmt) == 1
    assert text.index("log_format") < text.index("server {")
    # the job the client names, sanitised: digits and underscores, else "-"
    assert text.count("map $http_x_stb_job $stb_batch_job {") == 1
    assert '"~^[0-9][0-9_]{0,63}$" $http_x_stb_job;' in text
    assert text.index("map $http_x_stb_job") < text.index("log_format")
    # the streams: unbuffered, same upstream
    (spec,) = [k for k in locs if k.startswith("~ ^/batch/v2/models/smol/")]
    pattern = re.compile(spec.removeprefix("~ "))
    assert pattern.fullmatch("/batch/v2/models/smol/generate_stream")
    assert pattern.fullmatch("/batch/v2/models/smol/versions/3/generate")
    assert not pattern.fullmatch("/batch/v2/models/smol/infer")
    assert not pattern.fullmatch("/v2/models/smol/generate")
    assert locs[spec] == f"{log} {nginx.STREAM_DIRECTIVES} {cut} proxy_pass http://stb_smol;"
    # online routes are untouched
    assert _locations(text)["/v2/models/echo/"] == "proxy_pass http://stb_echo;"


def test_a_model_without_replica_answers_503_on_batch_never_the_activator() -> None:
    settings = nginx.NginxSettings(activator="127.0.0.1:9108", batch_log=LOG)
    table = RoutingTable.build({"cold": [], "echo": [A]}, zero=["cold"], batch=BatchGate(True))
    text = nginx.render(table, settings)
    body = _batch(text)["/batch/v2/models/cold/"]
    assert "return 503" in body and "Retry-After 1" in body
    assert "stb-activator" not in body
    # the online route of the same model does go to the activator
    assert "stb-activator" in _locations(text)["/v2/models/cold/"]


def test_a_rollouts_split_applies_to_batch_infer() -> None:
    split = Split("echo", 1, 2, 25.0)
    table = RoutingTable.build({"echo": [A]}, splits=[split], batch=BatchGate(True))
    locs = _batch(nginx.render(table, LOGGED))
    assert locs["= /batch/v2/models/echo/infer"] == (
        f"access_log {LOG} stb_batch; rewrite ^ /v2/models/echo/versions/$stb_split_0/infer "
        "break; proxy_pass http://stb_echo;"
    )


def test_a_closed_gate_answers_429_with_retry_after_for_every_batch_path() -> None:
    table = RoutingTable.build({"echo": [A]}, batch=BatchGate(open=False, retry_after_s=45))
    text = nginx.render(table, LOGGED)
    locs = _batch(text)
    assert list(locs) == ["^~ /batch/"]  # no regex location can pass it
    body = locs["^~ /batch/"]
    assert body.startswith(f"access_log {LOG} stb_batch; add_header Retry-After 45 always;")
    answer = re.search(r"return 429 '(.*)';", body)
    assert answer is not None
    assert json.loads(answer.group(1)) == {
        "error": "the batch route is closed for online load: retry after 45 s"
    }
    # online keeps serving
    assert _locations(text)["/v2/models/echo/"] == "proxy_pass http://stb_echo;"


def test_without_a_log_batch_routes_but_logs_nothing() -> None:
    text = nginx.render(RoutingTable.build({"echo": [A]}, batch=BatchGate(True)))
    assert "access_log" not in text and "log_format" not in text
    assert _batch(text)["/batch/v2/models/echo/"].endswith("proxy_pass http://stb_echo;")


def test_the_gate_is_part_of_the_tables_version() -> None:
    base = RoutingTable.build({"echo": [A]})
    opened = RoutingTable.build({"echo": [A]}, batch=BatchGate(True))
    closed = RoutingTable.build({"echo": [A]}, batch=BatchGate(False))
    assert len({base.version, opened.version, closed.version}) == 3
    assert opened.version == RoutingTable.build({"echo": [A]}, batch=BatchGate(True)).version
    # a return's first step keeps the gate
    assert opened.without_endpoint(A).batch == BatchGate(True)


@pytest.mark.parametrize("retry", [0, -1, 86401, 1.5, True])
def test_bad_gates_are_refused(retry: object) -> None:
    with pytest.raises(InvalidRoute, match="retry_after_s"):
        BatchGate(True, retry)  # type: ignore[arg-type]
    with pytest.raises(InvalidRoute, match="open"):
        BatchGate("yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "path", ["relative/log", "/var/log/a b.log", "/x;y", "/x'y", "/var/$log", "/{x}", ""]
)
def test_unsafe_batch_log_paths_are_refused(path: str) -> None:
    with pytest.raises(InvalidRoute, match="batch_log"):
        nginx.NginxSettings(batch_log=path)
