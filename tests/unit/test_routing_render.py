"""Routing rendering on literal tables: the nginx include, name validation, the http_sd
document, and the publisher's idempotence (with a recording stand-in for nginx; the real
nginx is in tests/lab/test_routing_nginx.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bridge.routing import http_sd, nginx
from bridge.routing.errors import InvalidRoute, NginxConfigRejected
from bridge.routing.nginxctl import NginxControl
from bridge.routing.publisher import RoutingPublisher
from bridge.routing.table import BASELINE, MetricsTarget, RoutingTable, Split

A, B, C = "127.0.1.4:8000", "127.0.1.3:8000", "127.0.1.2:8000"


def _locations(text: str) -> dict[str, str]:
    """location spec -> its body, for one-line locations."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("location ") and line.endswith("}"):
            spec, _, body = line.removeprefix("location ").partition("{")
            out[spec.strip()] = body.rstrip("}").strip()
    return out


def _upstreams(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("upstream "):
            current = line.split()[1]
            out[current] = []
        elif current and line.strip().startswith("server "):
            out[current].append(line.split()[1].rstrip(";"))
        elif line == "}":
            current = None
    return out


def test_one_model() -> None:
    text = nginx.render(RoutingTable.build({"echo": [A]}))
    assert _upstreams(text) == {"stb_echo": [A], "stb-any": [A]}
    locs = _locations(text)
    assert locs["= /v2/models/echo"] == "proxy_pass http://stb_echo;"
    assert locs["/v2/models/echo/"] == "proxy_pass http://stb_echo;"
    assert locs["= /v2/health/ready"] == "proxy_pass http://stb-any;"
    assert "listen 127.0.0.1:8080;" in text
    assert "keepalive 32;" in text
    assert 'proxy_set_header Connection "";' in text  # upstream keepalive needs it
    assert "keepalive_timeout 0s;" in text  # no client keepalive: reloads lose nothing


def test_requests_go_to_the_replica_with_the_fewest_in_flight() -> None:
    """least_conn in every upstream, before keepalive (nginx requires that order)."""
    text = nginx.render(RoutingTable.build({"echo": [A]}))
    blocks = text.split("upstream ")[1:]
    assert len(blocks) == 2
    for block in blocks:
        body = [line.strip() for line in block.split("}")[0].splitlines()[1:]]
        assert body[0].startswith("zone stb") and body[1] == "least_conn;"
        assert body.index("least_conn;") < body.index("keepalive 32;")


def test_two_models_and_health_from_any() -> None:
    text = nginx.render(
        RoutingTable.build({"echo": [A, B], "busy": [B, C]}),
        nginx.NginxSettings(listen="127.0.0.1:18080", keepalive=8),
    )
    assert _upstreams(text) == {
        "stb_busy": [C, B],
        "stb_echo": [B, A],
        "stb-any": [C, B, A],
    }
    locs = _locations(text)
    assert locs["/v2/models/busy/"] == "proxy_pass http://stb_busy;"
    assert locs["/v2/models/echo/"] == "proxy_pass http://stb_echo;"
    assert "listen 127.0.0.1:18080;" in text and "keepalive 8;" in text


def _stream_location(text: str, model: str) -> tuple[re.Pattern[str], str]:
    """The regex location of a model's token streams: (its pattern, its body)."""
    (spec,) = [k for k in _locations(text) if k.startswith(f"~ ^/v2/models/{re.escape(model)}/")]
    return re.compile(spec.removeprefix("~ ")), _locations(text)[spec]


@pytest.mark.parametrize("model", ["smol", "llama-3.1-8b"])
def test_token_streams_are_passed_on_unbuffered(model: str) -> None:
    """generate_stream and generate (any version) go to the model's upstream with nginx's
    buffering off, whatever the replica's X-Accel-Buffering says; infer stays buffered."""
    text = nginx.render(RoutingTable.build({model: [A, B]}))
    pattern, body = _stream_location(text, model)
    streams = ("generate_stream", "generate", "versions/2/generate_stream", "versions/1/generate")
    for path in streams:
        assert pattern.fullmatch(f"/v2/models/{model}/{path}"), path
    for path in ("infer", "generate_streamx", "versions/x/generate", "versions/1/infer", ""):
        assert not pattern.fullmatch(f"/v2/models/{model}/{path}"), path
    if "." in model:  # the model's name is a literal: a '.' in it matches only a '.'
        assert not pattern.fullmatch(f"/v2/models/{model.replace('.', 'x')}/generate")
    assert not pattern.fullmatch(f"/v2/models/{model}x/generate")
    assert body == (
        "proxy_buffering off; proxy_cache off; proxy_ignore_headers X-Accel-Buffering; "
        "add_header X-Accel-Buffering no always; add_header X-Stb-Upstream $upstream_addr "
        f"always; proxy_pass http://stb_{model};"
    )
    # infer and the rest are buffered as before (nginx's default), on the same upstream
    assert _locations(text)[f"/v2/models/{model}/"] == f"proxy_pass http://stb_{model};"
    assert "proxy_buffering" not in text.replace(nginx.STREAM_DIRECTIVES, "")


def test_a_model_without_replica_has_no_stream_location() -> None:
    text = nginx.render(RoutingTable.build({"smol": [], "echo": [A]}))
    assert not any(k.startswith("~ ^/v2/models/smol/") for k in _locations(text))
    assert _locations(text)["/v2/models/smol/"].startswith("add_header Retry-After 1 always;")


def test_a_rollouts_split_applies_to_token_streams_as_to_infer() -> None:
    text = nginx.render(RoutingTable.build({"smol": [A]}, splits=[Split("smol", 1, 2, 25)]))
    locs = _locations(text)
    assert locs["= /v2/models/smol/infer"] == (
        "rewrite ^ /v2/models/smol/versions/$stb_split_0/infer break; proxy_pass http://stb_smol;"
    )
    for path in ("generate", "generate_stream"):
        assert locs[f"= /v2/models/smol/{path}"] == (
            f"rewrite ^ /v2/models/smol/versions/$stb_split_0/{path} break; "
            f"{nginx.STREAM_DIRECTIVES} proxy_pass http://stb_smol;"
        )
    # a request that names a version is not split, and still streams unbuffered
    pattern, _ = _stream_location(text, "smol")
    assert pattern.fullmatch("/v2/models/smol/versions/1/generate_stream")


def test_model_without_replica_answers_503_json() -> None:
    text = nginx.render(RoutingTable.build({"echo": [A], "busy": []}))
    assert "stb_busy" not in _upstreams(text)
    body = _locations(text)["/v2/models/busy/"]
    assert body.startswith("add_header Retry-After 1 always; return 503 '")
    payload = body.split("'")[1]
    assert json.loads(payload) == {"error": "model busy has no ready replica"}
    assert _locations(text)["= /v2/models/busy"] == body


def test_no_replica_at_all_health_answers_503() -> None:
    text = nginx.render(RoutingTable.build({"echo": []}))
    assert _upstreams(text) == {}
    assert _locations(text)["= /v2/health/ready"].startswith("return 503 ")


def test_rendering_is_stable_whatever_the_order() -> None:
    t1 = RoutingTable.build({"echo": [A, B], "busy": [C]})
    t2 = RoutingTable.build({"busy": [C], "echo": [B, A, B]})
    assert t1 == t2 and t1.version == t2.version
    assert nginx.render(t1) == nginx.render(t2)
    assert t1.models == ("busy", "echo")
    assert t1.endpoints("echo") == (B, A)
    assert t1.version != RoutingTable.build({"echo": [A], "busy": [C]}).version


def test_without_endpoint_keeps_metrics_targets() -> None:
    target = MetricsTarget("127.0.1.3:8002", "n3", "77", "L-1", ("echo",))
    t = RoutingTable.build({"echo": [A, B]}, [target]).without_endpoint(B)
    assert t.endpoints("echo") == (A,) and t.targets == (target,)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a b",
        "echo;",
        "x{",
        "x}",
        "a'b",
        'a"b',
        "$host",
        "a/b",
        "..",
        ".hidden",
        "-x",
        "a\nb",
        "é",
        "a" * 129,
    ],
)
def test_model_names_that_could_inject_are_refused(name: str) -> None:
    with pytest.raises(InvalidRoute, match="invalid model name"):
        RoutingTable.build({name: [A]})


@pytest.mark.parametrize("name", ["echo", "busy", "resnet50_v1.5", "llama-3.1-8b", "_x", "A1"])
def test_triton_model_names_are_accepted(name: str) -> None:
    assert f"location /v2/models/{name}/" in nginx.render(RoutingTable.build({name: [A]}))


@pytest.mark.parametrize(
    "endpoint", ["127.0.1.4", "127.0.1.4:0", "127.0.1.4:65536", "h;x:80", "a b:80", ":80", "h:08"]
)
def test_bad_endpoints_and_listen_are_refused(endpoint: str) -> None:
    with pytest.raises(InvalidRoute, match="invalid endpoint"):
        RoutingTable.build({"echo": [endpoint]})
    with pytest.raises(InvalidRoute, match="invalid endpoint"):
        nginx.NginxSettings(listen=endpoint)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidRoute, match="keepalive"):
        nginx.NginxSettings(keepalive=0)


def _table() -> RoutingTable:
    return RoutingTable.build(
        {"echo": [A, B], "busy": [A]},
        [
            MetricsTarget("127.0.1.4:8002", "n4", "101", BASELINE, ("echo", "busy")),
            MetricsTarget("127.0.1.3:8002", "n3", "202", "lease-7", ("echo",)),
        ],
    )


def test_http_sd_document_shape() -> None:
    doc = json.loads(http_sd.render(_table(), bridge_metrics="127.0.0.1:9100"))
    assert doc == [
        {
            "targets": ["127.0.1.3:8002"],
            "labels": {
                "__meta_stb_lease": "lease-7",
                "__meta_stb_models": ",echo,",
                "__meta_stb_node": "n3",
                "__meta_stb_role": "triton",
                "__meta_stb_slurm_job_id": "202",
                "job": "triton",
            },
        },
        {
            "targets": ["127.0.1.4:8002"],
            "labels": {
                "__meta_stb_lease": "baseline",
                "__meta_stb_models": ",busy,echo,",
                "__meta_stb_node": "n4",
                "__meta_stb_role": "triton",
                "__meta_stb_slurm_job_id": "101",
                "job": "triton",
            },
        },
        {
            "targets": ["127.0.0.1:9100"],
            "labels": {"__meta_stb_role": "bridge", "job": "stb-bridge"},
        },
    ]


def test_http_sd_label_names_are_valid_prometheus_names() -> None:
    for group in json.loads(http_sd.render(_table(), bridge_metrics="127.0.0.1:9100")):
        assert set(group) == {"targets", "labels"}
        assert all(isinstance(v, str) for v in group["labels"].values())
        for name in group["labels"]:
            assert http_sd.LABEL_NAME_RE.fullmatch(name), name
            assert not name.startswith("__") or name.startswith("__meta_"), name


def test_http_sd_empty_is_an_empty_list_and_response_headers() -> None:
    data = http_sd.render(RoutingTable())
    assert json.loads(data) == []
    status, headers, body = http_sd.http_response(data)
    assert status == 200 and body == data
    assert ("Content-Type", "application/json") in headers


def test_http_sd_write_skips_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "sd.json"
    data = http_sd.render(_table())
    assert http_sd.write(path, data) is True
    mtime = path.stat().st_mtime_ns
    assert http_sd.write(path, data) is False
    assert path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == ["sd.json"]  # no temporary left


@dataclass(frozen=True)
class RecordingControl(NginxControl):
    """Records install/reload instead of running nginx (unit aid only)."""

    calls: list[str] = field(default_factory=list)

    def install(self, path: Path, text: str) -> None:
        self.calls.append("install")
        path.write_text(text)

    def reload(self) -> float:
        self.calls.append("reload")
        return 0.001


def _publisher(tmp_path: Path) -> tuple[RoutingPublisher, RecordingControl]:
    control = RecordingControl(main_conf=tmp_path / "nginx.conf", pid_file=tmp_path / "pid")
    pub = RoutingPublisher(tmp_path / "routing.conf", tmp_path / "sd.json", control)
    return pub, control


def test_publish_unchanged_content_writes_and_reloads_nothing(tmp_path: Path) -> None:
    pub, control = _publisher(tmp_path)
    first = pub.publish(_table())
    assert first.nginx_changed and first.sd_changed and control.calls == ["install", "reload"]
    again = pub.publish(RoutingTable.build({"busy": [A], "echo": [B, A]}, _table().targets))
    assert not again.nginx_changed and not again.sd_changed and again.reload_s is None
    assert control.calls == ["install", "reload"]
    assert pub.document() == http_sd.render(_table())


def test_publish_metrics_only_change_skips_nginx(tmp_path: Path) -> None:
    pub, control = _publisher(tmp_path)
    pub.publish(_table())
    result = pub.publish(RoutingTable.build({"echo": [A, B], "busy": [A]}))
    assert not result.nginx_changed and result.sd_changed
    assert control.calls == ["install", "reload"]


def test_publish_rejected_writes_no_document(tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class Rejecting(RecordingControl):
        def install(self, path: Path, text: str) -> None:
            raise NginxConfigRejected(str(path), "[emerg] nope")

    control = Rejecting(main_conf=tmp_path / "nginx.conf", pid_file=tmp_path / "pid")
    pub = RoutingPublisher(tmp_path / "routing.conf", tmp_path / "sd.json", control)
    with pytest.raises(NginxConfigRejected, match="nope"):
        pub.publish(_table())
    assert not (tmp_path / "sd.json").exists()


# ---- weights: replicas of different sizes ----------------------------------------------


def _servers(text: str, upstream: str) -> list[str]:
    block = text.split(f"upstream {upstream} {{")[1].split("}")[0]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("server ")]


def test_replicas_of_different_sizes_are_weighed_by_their_gpus() -> None:
    # a whole node of 8 GPUs and a partial lease of 2 serve `echo`; `other` is on the
    # node alone: each weight over the model's greatest common divisor, a weight of 1
    # left unsaid, replicas alike (or one) with none, health checks unweighted
    table = RoutingTable.build(
        {"echo": [A, B], "other": [A], "same": [A, C]},
        weights={"echo": {A: 8, B: 2}, "other": {A: 8}, "same": {A: 4, C: 4}},
    )
    assert table.weights == (("echo", ((B, 1), (A, 4))),)
    assert table.weight("echo", A) == 4 and table.weight("echo", B) == 1
    assert table.weight("same", A) == table.weight("absent", A) == 1
    text = nginx.render(table)
    assert sorted(_servers(text, "stb_echo")) == sorted([f"server {B};", f"server {A} weight=4;"])
    assert _servers(text, "stb_other") == [f"server {A};"]
    assert "weight=" not in "".join(_servers(text, "stb_same") + _servers(text, "stb-any"))
    # weights that say nothing leave the table (and its version) as without them
    plain = RoutingTable.build({"echo": [A, B], "other": [A], "same": [A, C]})
    alike = RoutingTable.build(
        {"echo": [A, B], "other": [A], "same": [A, C]},
        weights={"echo": {A: 8, B: 8}, "same": {A: 1, C: 1}},
    )
    assert alike == plain and alike.version == plain.version
    assert table.version != plain.version
    # a return's first step keeps the weights of the endpoints left: one left, none
    three = RoutingTable.build({"echo": [A, B, C]}, weights={"echo": {A: 8, B: 2, C: 2}})
    assert three.without_endpoint(B).weights == (("echo", ((C, 1), (A, 4))),)
    assert table.without_endpoint(B).weights == ()


@pytest.mark.parametrize("weight", [0, -1, 1001, 1.5, True, "2"])
def test_bad_weights_are_refused_naming_the_endpoint(weight: object) -> None:
    with pytest.raises(InvalidRoute, match=re.escape(A)):
        RoutingTable.build({"echo": [A]}, weights={"echo": {A: weight}})  # type: ignore[dict-item]


def test_weights_for_a_bad_model_name_are_refused_even_when_alike() -> None:
    with pytest.raises(InvalidRoute, match="invalid model name"):
        RoutingTable.build({"echo": [A]}, weights={"../echo": {A: 2, B: 2}})
