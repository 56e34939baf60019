"""Scale to zero on literal inputs: the policy lends from zero for a model with requests
waiting at the activator (and only then), within the usual bounds, and lets its last lent
replica go when no request comes; the baselines leave such a model out; nginx sends its
requests to the activator while it has no replica."""

from __future__ import annotations

from pathlib import Path

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig, TritonJobConfig
from bridge.daemon.launcher import start_models, triton_job
from bridge.daemon.service import activator_address
from bridge.modelfacts import merge_models, toml_models
from bridge.policy import LeaseView, Lend, ModelSample, NodeView, ReplicaView, Return, Snapshot
from bridge.policy import decide as policy_decide
from bridge.routing import nginx
from bridge.routing.table import RoutingTable

T0 = 1_800_000_000.0
TICK = 5.0
A = "127.0.1.3:8000"

CONFIG = BridgeConfig(
    models={
        "busy": ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=3),
        "cold": ModelConfig(slo_p99_ms=500, min_replicas=0, max_replicas=2),
        "frost": ModelConfig(slo_p99_ms=500, min_replicas=0, max_replicas=2),
    },
    policy=PolicyConfig(
        breach_evaluations=3,
        scale_out_cooldown_s=60,
        scale_in_cooldown_s=120,
        max_lent_nodes=2,
        return_dwell_s=20,
    ),
)
RESERVED = NodeView("n4", "inference", True, 4, has_triton=True)
ELASTIC = NodeView("n3", "elastic", True, 4)
ELASTIC2 = NodeView("n5", "elastic", True, 4)
TRAIN = NodeView("n1", "training", True, 4)
BASELINE = ReplicaView("n4", ("busy",))


def quiet(rate: float | None = 0.0, n: int = 6) -> tuple[ModelSample, ...]:
    """`n` samples one tick apart: no request (rate 0, no p99), or none read (None)."""
    return tuple(ModelSample(T0 - (n - 1 - i) * TICK, None, rate) for i in range(n))


def snap(
    waiting: dict[str, int],
    *,
    leases: tuple[LeaseView, ...] = (),
    replicas: tuple[ReplicaView, ...] = (BASELINE,),
    nodes: tuple[NodeView, ...] = (TRAIN, ELASTIC, RESERVED),
    cold: tuple[ModelSample, ...] | None = None,
) -> Snapshot:
    history = {"busy": quiet(5.0), "cold": quiet(None) if cold is None else cold, "frost": ()}
    return Snapshot(
        nodes, replicas, history, leases, {}, models=toml_models(CONFIG), waiting=waiting
    )


def decide(s: Snapshot, config: BridgeConfig = CONFIG, now: float = T0) -> list[object]:
    return list(policy_decide(s, config, now))


def test_a_model_at_zero_with_requests_waiting_is_lent_a_node_at_the_next_tick() -> None:
    (action,) = decide(snap({"cold": 3}))
    assert isinstance(action, Lend)
    assert (action.node, action.pool, action.models) == ("n3", "elastic", ("cold",))
    assert action.reason == "scale from zero: cold, 3 request(s) waiting"


def test_no_request_waiting_lends_nothing() -> None:
    assert decide(snap({})) == []
    assert decide(snap({"cold": 0})) == []


def test_the_most_waiting_model_first_each_on_a_node_of_its_own() -> None:
    lends = decide(snap({"cold": 1, "frost": 4}, nodes=(TRAIN, ELASTIC, ELASTIC2, RESERVED)))
    assert [(a.models, a.reason.split(":")[0]) for a in lends if isinstance(a, Lend)] == [
        (("frost",), "scale from zero"),
        (("cold",), "scale from zero"),
    ]


def test_a_lend_in_flight_or_a_ready_replica_is_not_lent_again() -> None:
    starting = LeaseView(1, "n3", "elastic", "preempt", "starting", ("cold",), T0 - 3)
    assert decide(snap({"cold": 5}, leases=(starting,))) == []
    ready = ReplicaView("n3", ("cold",), lease_id=2)
    serving = LeaseView(2, "n3", "elastic", "preempt", "serving", ("cold",), T0 - 30, T0 - 10)
    assert decide(snap({"cold": 5}, leases=(serving,), replicas=(BASELINE, ready))) == []


def test_a_model_with_baseline_replicas_is_never_lent_from_zero() -> None:
    assert decide(snap({"busy": 9})) == []


def test_the_lent_node_cap_and_the_pools_bound_a_lend_from_zero() -> None:
    capped = CONFIG.model_copy(
        update={"policy": CONFIG.policy.model_copy(update={"max_lent_nodes": 0})}
    )
    assert decide(snap({"cold": 3}), capped) == []
    # no lendable node free (a site reservation holds the elastic one, training busy)
    held = NodeView("n3", "elastic", True, 4, reserved=True)
    assert decide(snap({"cold": 3}, nodes=(held, RESERVED))) == []


def test_the_last_lent_replica_of_a_model_at_zero_returns_when_no_request_comes() -> None:
    ready = ReplicaView("n3", ("cold",), lease_id=2)
    serving = LeaseView(2, "n3", "elastic", "preempt", "serving", ("cold",), T0 - 700, T0 - 600)
    actions = decide(snap({}, leases=(serving,), replicas=(BASELINE, ready), cold=quiet(0.0)))
    assert [type(a) for a in actions] == [Return]
    assert actions[0].lease_id == 2  # type: ignore[attr-defined]
    # while requests come it stays
    busy = tuple(ModelSample(s.at, 30.0, 4.0, 0.0, 20.0, 10.0) for s in quiet())
    assert decide(snap({}, leases=(serving,), replicas=(BASELINE, ready), cold=busy)) == []


def test_the_baselines_leave_out_the_models_served_from_zero(tmp_path: Path) -> None:
    for name in ("busy", "cold"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    assert start_models(tmp_path) is None
    assert start_models(tmp_path, skip=["cold"]) == ["busy"]
    key = tmp_path / "api.key"
    key.write_text("k\n")
    (tmp_path / "libstbkey.so").write_bytes(b"")
    cfg = TritonJobConfig(key_file=key, model_repository=tmp_path)
    assert triton_job(cfg, node="n4", skip=["cold"]).env["STB_MODELS"] == "busy"
    # a lend names its models: a model served from zero is loaded there
    assert triton_job(cfg, node="n3", models=["cold"], skip=["cold"]).env["STB_MODELS"] == "cold"
    assert merge_models(None, CONFIG.models).from_zero == ("cold", "frost")


ACTIVATOR = nginx.NginxSettings(activator="127.0.0.1:9108", cold_start_s=180)


def _location(text: str, spec: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(f"location {spec} {{"):
            return line.removeprefix(f"location {spec} {{").rstrip("}").strip()
    raise AssertionError(f"no location {spec}")


def test_nginx_sends_a_model_at_zero_to_the_activator() -> None:
    table = RoutingTable.build({"busy": [A], "cold": []}, zero=["cold"])
    text = nginx.render(table, ACTIVATOR)
    assert "upstream stb-activator {\n    server 127.0.0.1:9108;\n}" in text
    to_activator = "proxy_read_timeout 480s; proxy_pass http://stb-activator;"
    assert _location(text, "/v2/models/cold/") == to_activator
    assert _location(text, "= /v2/models/cold") == to_activator
    stream = _location(text, r"~ ^/v2/models/cold/(versions/[0-9]+/)?generate(_stream)?$")
    assert stream == f"{nginx.STREAM_DIRECTIVES} {to_activator}"
    # a model with a replica goes to it; a model not served from zero answers 503
    assert _location(text, "/v2/models/busy/") == "proxy_pass http://stb_busy;"
    plain = nginx.render(RoutingTable.build({"busy": [A], "cold": []}), ACTIVATOR)
    assert "stb-activator" not in plain
    assert _location(plain, "/v2/models/cold/").startswith("add_header Retry-After 1")


def test_a_model_at_zero_with_a_replica_is_routed_to_it_and_without_activator_503() -> None:
    table = RoutingTable.build({"cold": [A]}, zero=["cold"])
    assert _location(nginx.render(table, ACTIVATOR), "/v2/models/cold/") == (
        "proxy_pass http://stb_cold;"
    )
    alone = RoutingTable.build({"cold": []}, zero=["cold"])
    assert _location(nginx.render(alone), "/v2/models/cold/").startswith("add_header Retry")
    # the zero set is part of the content (a change republishes); absent, versions as before
    assert RoutingTable.build({"cold": []}).version != alone.version
    assert "zero" not in RoutingTable.build({"cold": []}).canonical()


def test_nginx_reaches_a_wildcard_listening_daemon_on_loopback() -> None:
    assert activator_address("0.0.0.0:9108") == "127.0.0.1:9108"
    assert activator_address("10.1.2.3:9108") == "10.1.2.3:9108"
