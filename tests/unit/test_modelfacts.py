"""One place for each model fact: the merge of the model repository's metadata with the
TOML's overrides (`bridge.modelfacts.merge_models`) on literal inputs, the repository's
reading (`published_of`, `PublishedModels`: parsed again only when a config changed), a
replica's GPUs (instance GPUs, tensor and pipeline parallel sizes), the catalog that logs
each override once, the observer that reads the repository each tick
(a model published between two ticks is in the second one's policy view), and what `stb
config check` and `stb status` say of it."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.protobuf import text_format
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2
from typer.testing import CliRunner

from bridge.cli import app
from bridge.config import (
    BridgeConfig,
    ConfigError,
    DaemonConfig,
    ModelConfig,
    ModelOverride,
    TritonJobConfig,
    load_config,
)
from bridge.config_cli import replica_gpus
from bridge.daemon.observation import snapshot
from bridge.daemon.observe import Observer
from bridge.modelfacts import (
    FILE,
    REPLICA_GPUS,
    ModelFactsError,
    Published,
    merge_models,
    toml_models,
)
from bridge.ops.cli import collect
from bridge.policy import Lend, ModelSample, NodeView, ReplicaView, Snapshot, decide
from bridge.policy.gang import gpus_per_replica
from bridge.triton.catalog import ModelCatalog, site_models
from bridge.triton.repository import (
    ModelConfigError,
    PublishedModels,
    check_model,
    instance_group_of,
    published_of,
    read_published,
)

from .fakes import BASELINE_JOB, N1, N3, FakeSlurm, FakeTriton, address_of

BUSY = Published("team-vision", 100.0, None, 3, 1)


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _write_model(root: Path, name: str, params: dict[str, str], count: int = 1) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text("# a model\n")
    lines = [
        f'name: "{name}"',
        'backend: "python"',
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]',
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]",
        *(
            f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
            for k, v in params.items()
        ),
    ]
    (folder / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return folder


# ---- the merge ------------------------------------------------------------------------


def test_repository_only_gives_every_fact_and_says_where_from() -> None:
    facts = merge_models({"busy": BUSY}, {})
    fact = facts.facts["busy"]
    assert fact.model == ModelConfig(slo_p99_ms=100, min_replicas=1, max_replicas=3, instances=1)
    assert fact.sources == {
        "slo_p99_ms": "repository",
        "min_replicas": "default",
        "max_replicas": "repository",
        "instances": "repository",
    }
    assert fact.team == "team-vision" and fact.in_repository and not fact.in_toml
    assert facts.notes() == [] and facts.problems == []
    assert facts.served == ("busy",) and list(facts.scaled) == ["busy"]


def test_toml_only_without_a_repository_is_the_toml_alone() -> None:
    facts = merge_models(None, {"busy": ModelOverride(slo_p99_ms=80, max_replicas=2)})
    fact = facts.facts["busy"]
    assert fact.model == ModelConfig(slo_p99_ms=80, min_replicas=1, max_replicas=2)
    assert fact.sources == {"slo_p99_ms": "toml", "min_replicas": "default", "max_replicas": "toml"}
    assert facts.repository is None and facts.notes() == []
    assert toml_models(BridgeConfig(models={"busy": ModelConfig(slo_p99_ms=80)})) == {
        "busy": ModelConfig(slo_p99_ms=80)
    }


def test_the_toml_overrides_field_by_field_and_says_so() -> None:
    facts = merge_models(
        {"busy": BUSY, "echo": Published("team-platform", 50.0)},
        {"busy": ModelOverride(slo_p99_ms=80), "echo": ModelOverride(slo_p99_ms=50)},
    )
    busy = facts.facts["busy"]
    assert busy.model is not None
    assert (busy.model.slo_p99_ms, busy.model.max_replicas) == (80, 3)  # max: the repository's
    assert busy.sources["slo_p99_ms"] == "toml" and busy.sources["max_replicas"] == "repository"
    assert busy.overrides == (
        "model busy: slo_p99_ms = 80 from the TOML [models.busy] overrides stb.slo_p99_ms in "
        "its config.pbtxt (100)",
    )
    # a TOML value equal to the repository's is said too: it can go
    (echo,) = facts.facts["echo"].overrides
    assert "repeats stb.slo_p99_ms" in echo and "can go" in echo
    assert busy.overrides[0] in facts.notes() and echo in facts.notes()


def test_bad_metadata_is_a_clear_error_naming_the_model_and_the_field() -> None:
    cfg = _config('parameters: { key: "stb.slo_p99_ms" value: { string_value: "fast" } }')
    facts = merge_models({"fresh": published_of(cfg), "busy": BUSY}, {})
    fresh = facts.facts["fresh"]
    assert fresh.model is None and list(facts.scaled) == ["busy"]  # the others still scale
    assert facts.problems == [
        "model fresh: slo_p99_ms: parameter stb.slo_p99_ms must be a number, got 'fast'"
    ]
    with pytest.raises(ModelFactsError, match=r"model fresh: slo_p99_ms: .*'fast'"):
        facts.check()
    # a bad field the TOML overrides: scaled by the TOML's, the repository's still said
    over = merge_models({"fresh": published_of(cfg)}, {"fresh": ModelOverride(slo_p99_ms=70)})
    assert over.scaled["fresh"].slo_p99_ms == 70 and over.problems == []
    assert any("'fast'" in w for w in over.facts["fresh"].warnings)


def test_bounds_that_contradict_each_other_across_sources_are_refused() -> None:
    facts = merge_models(
        {"busy": Published("t", 100.0, 3, 4)}, {"busy": ModelOverride(max_replicas=2)}
    )
    assert facts.scaled == {}
    assert facts.problems == [
        "model busy: max_replicas 2 (toml) is below min_replicas 3 (repository)"
    ]


def test_the_toml_naming_a_model_the_repository_does_not_have() -> None:
    facts = merge_models(
        {"busy": BUSY},
        {"typo": ModelOverride(max_replicas=2), "later": ModelOverride(slo_p99_ms=60)},
        "the model repository R",
    )
    typo, later = facts.facts["typo"], facts.facts["later"]
    assert typo.model is None and "not in the model repository R" in typo.why
    assert later.model is not None and later.model.slo_p99_ms == 60  # the TOML alone
    for fact in (typo, later):
        assert not fact.in_repository
        assert fact.warnings == (
            f"model {fact.name}: the TOML [models.{fact.name}] names a model the model "
            "repository R does not have (a typo, or not yet published?)",
        )
    assert facts.served == ("busy",)  # only the repository's can be loaded


def test_a_repository_model_without_an_slo_is_served_not_scaled() -> None:
    facts = merge_models({"plain": Published("t")}, {})
    plain = facts.facts["plain"]
    assert plain.model is None and facts.scaled == {} and facts.served == ("plain",)
    assert plain.why.startswith("served, not scaled: no stb.slo_p99_ms")
    assert facts.notes() == [f"model plain: {plain.why}"]


def test_a_model_absent_from_the_snapshots_models_is_never_lent_for() -> None:
    breach = tuple(ModelSample(1000.0 + 5 * i, 400.0, 10.0, 0.0, 300.0) for i in range(5))
    nodes = (
        NodeView("n3", "elastic", True, 4),
        NodeView("n4", "inference", True, 4, has_triton=True),
    )
    snap = Snapshot(nodes, (ReplicaView("n4", ("plain",)),), {"plain": breach}, ())
    config = BridgeConfig()
    assert decide(snap, config, 1020.0) == []
    scaled = replace(snap, models={"plain": ModelConfig(slo_p99_ms=100)})
    (lend,) = decide(scaled, config, 1020.0)
    assert isinstance(lend, Lend) and lend.models == ("plain",)


# ---- reading the repository -----------------------------------------------------------


def test_published_of_reads_each_parameter_on_its_own() -> None:
    cfg = _config(
        'parameters: { key: "stb.team" value: { string_value: "t" } }\n'
        'parameters: { key: "stb.slo_p99_ms" value: { string_value: "120" } }\n'
        'parameters: { key: "stb.min_replicas" value: { string_value: "2.5" } }\n'
        'parameters: { key: "stb.max_replicas" value: { string_value: "0" } }\n'
    )
    pub = published_of(cfg)
    assert (pub.team, pub.slo_p99_ms, pub.min_replicas, pub.max_replicas) == ("t", 120, None, None)
    assert pub.errors == {
        "min_replicas": "parameter stb.min_replicas must be a number (a whole one), got '2.5'",
        "max_replicas": "replica bounds: stb.max_replicas must be >= 1, got 0",
    }
    nan = published_of(
        _config('parameters: { key: "stb.slo_p99_ms" value: { string_value: "nan" } }')
    )
    assert nan.slo_p99_ms is None and "must be > 0 ms" in nan.errors["slo_p99_ms"]


@pytest.mark.parametrize(
    ("groups", "instances", "gpus"),
    [
        ("instance_group [ { count: 2 kind: KIND_CPU } ]", 2, None),  # CPU: no GPU held
        ("instance_group [ { kind: KIND_CPU }, { count: 3 kind: KIND_MODEL } ]", 4, None),
        ("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] } ]", 4, 2),
        # two groups naming [0, 1] and [1, 2]: GPU 1 counted once
        (
            "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0, 1 ] },"
            " { count: 2 kind: KIND_GPU gpus: [ 1, 2 ] } ]",
            6,
            3,
        ),
        ("instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 5 ] } ]", 2, 1),
        ("instance_group [ { count: 2 kind: KIND_AUTO gpus: [ 0, 3 ] } ]", 4, 2),
        ("instance_group [ { count: 2 kind: KIND_GPU } ]", None, None),  # on every GPU
        (
            "instance_group [ { kind: KIND_GPU gpus: [ 0 ] }, { kind: KIND_GPU } ]",
            None,
            None,  # one group on every GPU: the named ones do not bound the replica
        ),
        ("", None, None),  # Triton's default: one per GPU
    ],
)
def test_instances_and_their_gpus_come_from_the_instance_group(
    groups: str, instances: int | None, gpus: int | None
) -> None:
    assert instance_group_of(_config(groups)) == (instances, gpus)
    pub = published_of(_config(groups))
    assert (pub.instances, pub.instance_gpus) == (instances, gpus)


def test_published_models_parse_a_config_again_only_when_it_changed(tmp_path: Path) -> None:
    repo = PublishedModels(tmp_path)
    _write_model(tmp_path, "busy", {"stb.team": "t", "stb.slo_p99_ms": "100"}, count=2)
    (tmp_path / "half-written").mkdir()  # no config.pbtxt: not a model
    (tmp_path / ".hidden").mkdir()
    first = repo.read()
    assert first is not None and list(first) == ["busy"] and repo.parsed == 1
    assert (first["busy"].slo_p99_ms, first["busy"].instances) == (100.0, 2)
    again = repo.read()
    assert again is not None and again["busy"] is first["busy"] and repo.parsed == 1
    config = tmp_path / "busy" / "config.pbtxt"
    config.write_text(config.read_text().replace('"100"', '"80"'))
    os.utime(config, ns=(1, 1))  # a new mtime even on a coarse clock
    changed = repo.read()
    assert changed is not None and changed["busy"].slo_p99_ms == 80.0 and repo.parsed == 2
    assert PublishedModels(tmp_path / "missing").read() is None


def test_an_unreadable_config_or_a_bad_name_is_the_models_problem(tmp_path: Path) -> None:
    _write_model(tmp_path, "broken", {})
    (tmp_path / "broken" / "config.pbtxt").write_text("input [ { name: \n")
    assert FILE in read_published(tmp_path / "broken").errors
    _write_model(tmp_path, "-dash", {})
    facts = merge_models(PublishedModels(tmp_path).read(), {})
    assert set(facts.facts) == {"broken", "-dash"} and facts.scaled == {}
    assert facts.served == ()  # Triton could not load either: no route for them
    assert any(p.startswith("model broken: ") and "ModelConfig" in p for p in facts.problems)
    assert any(p.startswith("model -dash: invalid model name") for p in facts.problems)


def test_the_catalog_logs_each_override_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write_model(tmp_path, "busy", {"stb.team": "t", "stb.slo_p99_ms": "100"})
    catalog = ModelCatalog(tmp_path, {"busy": ModelOverride(slo_p99_ms=80)})
    with caplog.at_level(logging.INFO, logger="bridge.triton.catalog"):
        for _ in range(3):
            assert catalog.facts().scaled["busy"].slo_p99_ms == 80
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "model busy: slo_p99_ms = 80 from the TOML [models.busy] overrides stb.slo_p99_ms in "
        "its config.pbtxt (100)"
    ]


# ---- a replica's GPUs -----------------------------------------------------------------

LLM = """name: "llm" backend: "vllm"
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0, 1 ] } ]
parameters: { key: "stb.team" value: { string_value: "team-nlp" } }
parameters: { key: "stb.slo_ttft_p99_ms" value: { string_value: "2000" } }
"""


def _llm(**sizes: str) -> model_config_pb2.ModelConfig:
    return _config(
        LLM
        + "".join(
            f'parameters: {{ key: "stb.{k}" value: {{ string_value: "{v}" }} }}\n'
            for k, v in sizes.items()
        )
    )


def test_a_replicas_gpus_come_from_its_config_pbtxt() -> None:
    pub = published_of(_llm(tensor_parallel_size="4", pipeline_parallel_size=" 2 "))
    assert (pub.instance_gpus, pub.tensor_parallel, pub.pipeline_parallel) == (2, 4, 2)
    assert pub.errors == {}
    fact = merge_models({"llm": pub}, {}).facts["llm"]
    m = fact.model
    assert m is not None and (m.instance_gpus, m.tensor_parallel, m.pipeline_parallel) == (2, 4, 2)
    assert {f: fact.sources[f] for f in REPLICA_GPUS} == dict.fromkeys(REPLICA_GPUS, "repository")
    # the policy's rule on the facts: the larger of the instance GPUs and tp x pp
    assert replica_gpus(fact) == (
        ", 8 GPUs per replica: instance GPUs 2 (repository), tensor parallel 4 "
        "(repository), pipeline parallel 2 (repository)"
    )
    # publishing takes them
    assert check_model(_llm(tensor_parallel_size="4"), "llm", "llm/config.pbtxt").team == "team-nlp"


def test_a_replica_with_no_gpu_facts_takes_whole_nodes() -> None:
    plain = merge_models({"busy": BUSY}, {}).facts["busy"]  # CPU instances, no sizes
    assert plain.model is not None and plain.model.instance_gpus is None
    assert "tensor_parallel" not in plain.sources and replica_gpus(plain) == ""
    # instance GPUs alone, the larger of them and a smaller parallel world, one GPU
    alone = merge_models({"llm": published_of(_llm())}, {}).facts["llm"]
    assert replica_gpus(alone) == ", 2 GPUs per replica: instance GPUs 2 (repository)"
    wide = merge_models({"llm": published_of(_llm(pipeline_parallel_size="3"))}, {})
    assert replica_gpus(wide.facts["llm"]).startswith(", 3 GPUs per replica: instance GPUs 2")
    one = merge_models({"m": Published("t", 100.0, tensor_parallel=1)}, {}).facts["m"]
    assert replica_gpus(one) == ", 1 GPU per replica: tensor parallel 1 (repository)"


def test_the_toml_overrides_a_replicas_gpus_field_by_field_and_says_so() -> None:
    pub = published_of(_llm(tensor_parallel_size="4"))
    over = ModelOverride(tensor_parallel=8, pipeline_parallel=2, instance_gpus=1)
    fact = merge_models({"llm": pub}, {"llm": over}).facts["llm"]
    m = fact.model
    assert m is not None and (m.instance_gpus, m.tensor_parallel, m.pipeline_parallel) == (1, 8, 2)
    assert fact.sources["tensor_parallel"] == "toml" and fact.sources["instance_gpus"] == "toml"
    assert fact.overrides == (
        "model llm: instance_gpus = 1 from the TOML [models.llm] overrides instance_group's "
        "gpus in its config.pbtxt (2)",
        "model llm: tensor_parallel = 8 from the TOML [models.llm] overrides "
        "stb.tensor_parallel_size in its config.pbtxt (4)",
    )
    assert (
        gpus_per_replica(
            instance_gpus=m.instance_gpus,
            tensor_parallel=m.tensor_parallel,
            pipeline_parallel=m.pipeline_parallel,
        )
        == 16
    )
    assert replica_gpus(fact) == (
        ", 16 GPUs per replica: instance GPUs 1 (toml), tensor parallel 8 (toml), "
        "pipeline parallel 2 (toml)"
    )


@pytest.mark.parametrize("parameter", ["tensor_parallel_size", "pipeline_parallel_size"])
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "stb.{p} must be >= 1, got 0"),
        ("-2", "stb.{p} must be >= 1, got -2"),
        ("2.5", "parameter stb.{p} must be a number (a whole one), got '2.5'"),
        ("four", "parameter stb.{p} must be a number (a whole one), got 'four'"),
    ],
)
def test_a_bad_parallel_size_is_refused_naming_the_model_the_parameter_and_the_value(
    parameter: str, value: str, said: str
) -> None:
    field = parameter.removesuffix("_size")
    pub = published_of(_llm(**{parameter: value}))
    assert getattr(pub, field) is None
    fact = merge_models({"llm": pub}, {}).facts["llm"]
    assert fact.model is None
    assert fact.problems == (f"model llm: {field}: {said.format(p=parameter)}",)
    with pytest.raises(ModelConfigError, match=rf"llm/config.pbtxt: .*stb\.{parameter}"):
        check_model(_llm(**{parameter: value}), "llm", "llm/config.pbtxt")
    # the TOML's value stands in for the refused one, which is still said
    over = merge_models({"llm": pub}, {"llm": ModelOverride(**{field: 2})})
    assert over.problems == [] and getattr(over.scaled["llm"], field) == 2
    assert any(said.format(p=parameter) in w for w in over.facts["llm"].warnings)


def test_the_toml_refuses_a_replica_size_below_one(tmp_path: Path) -> None:
    for field in REPLICA_GPUS:
        with pytest.raises(ValidationError, match=field):
            ModelOverride(**{field: 0})
        with pytest.raises(ValidationError, match=field):
            ModelConfig(slo_p99_ms=100, **{field: -1})
    path = tmp_path / "bridge.toml"
    path.write_text("[models.llm]\ntensor_parallel = 0\npipeline_parallel = 1.5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    fields = [f for f, _ in err.value.problems]
    assert fields == ["models.llm.tensor_parallel", "models.llm.pipeline_parallel"]


# ---- the daemon's view and the commands ----------------------------------------------


def test_a_model_published_between_two_ticks_is_in_the_next_ones_policy_view(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    _write_model(repo, "busy", {"stb.team": "t", "stb.slo_p99_ms": "100"})
    config = BridgeConfig(triton=TritonJobConfig(model_repository=repo))
    triton = FakeTriton()
    triton.server(address_of(N1), models={"busy": "READY"})
    observer = Observer(FakeSlurm([N1, N3], [BASELINE_JOB]), config, triton)
    first = observer.observe(1000.0)
    assert list(first.models.scaled) == ["busy"] and "fresh" not in first.history
    _write_model(repo, "fresh", {"stb.team": "t", "stb.slo_p99_ms": "250"})  # no TOML entry
    second = observer.observe(1005.0)
    assert second.models.scaled["fresh"] == ModelConfig(slo_p99_ms=250, instances=1)
    assert len(second.history["fresh"]) == 1  # its history starts with this tick
    assert snapshot(second, config, [], {}).models["fresh"].slo_p99_ms == 250


def test_config_check_shows_each_effective_value_and_its_source(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _write_model(repo, "busy", {"stb.team": "t", "stb.slo_p99_ms": "100", "stb.max_replicas": "3"})
    _write_model(repo, "plain", {"stb.team": "t"})
    _write_model(
        repo, "big", {"stb.team": "t", "stb.slo_p99_ms": "900", "stb.tensor_parallel_size": "2"}
    )
    path = tmp_path / "bridge.toml"
    path.write_text(
        "[models.busy]\nslo_p99_ms = 80\n[models.big]\npipeline_parallel = 2\n"
        f'[triton]\nmodel_repository = "{repo}"\n'
    )
    res = CliRunner().invoke(app, ["config", "check", str(path)], env={"COLUMNS": "300"})
    out = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert (
        "busy: SLO p99 80 ms (toml), replicas 1 (default) to 3 (repository), instances 1 "
        "(repository)" in out
    )
    assert "plain: served, not scaled: no stb.slo_p99_ms" in out
    assert "override: model busy: slo_p99_ms = 80 from the TOML" in out
    assert (
        "big: SLO p99 900 ms (repository), replicas 1 (default) to 4 (default), instances 1 "
        "(repository), 4 GPUs per replica: tensor parallel 2 (repository), pipeline parallel 2 "
        "(toml)" in out
    )
    (busy_line,) = [line for line in res.output.splitlines() if line.strip().startswith("busy:")]
    assert "GPU" not in busy_line  # none of its GPUs said: whole nodes, nothing shown
    # bad metadata: the command names the model and the field, and fails
    _write_model(repo, "plain", {"stb.team": "t", "stb.max_replicas": "many"})
    _write_model(repo, "wide", {"stb.team": "t", "stb.pipeline_parallel_size": "0"})
    bad = CliRunner().invoke(app, ["config", "check", str(path)], env={"COLUMNS": "300"})
    assert bad.exit_code == 1
    said = " ".join(bad.output.split())
    assert "model plain: max_replicas: parameter stb.max_replicas must be a number" in said
    assert "model wide: pipeline_parallel: stb.pipeline_parallel_size must be >= 1, got 0" in said


def test_status_shows_each_effective_value_and_where_it_came_from(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _write_model(repo, "busy", {"stb.team": "t", "stb.slo_p99_ms": "100"})
    _write_model(repo, "plain", {"stb.team": "t"})
    cfg = BridgeConfig(
        database_url=f"sqlite:///{tmp_path / 'bridge.db'}",
        models={"busy": ModelOverride(max_replicas=2)},
        triton=TritonJobConfig(model_repository=repo),
        daemon=DaemonConfig(exporter_listen="127.0.0.1:9"),
    )
    assert site_models(cfg).scaled["busy"].max_replicas == 2
    models = collect(cfg, datetime(2027, 3, 1, tzinfo=UTC))["models"]
    assert models["busy"]["scaled"] and models["busy"]["slo_p99_ms"] == 100
    assert models["busy"]["replicas"] == [1, 2]
    assert models["busy"]["sources"] == {
        "slo_p99_ms": "repository",
        "min_replicas": "default",
        "max_replicas": "toml",
        "instances": "repository",
    }
    assert not models["plain"]["scaled"] and "not scaled" in models["plain"]["why"]


def test_a_replicas_gpu_type_comes_from_its_config_pbtxt_and_a_bad_one_is_refused() -> None:
    pub = published_of(_llm(gpu_type=" h100_1g.10gb "))
    assert pub.gpu_type == "h100_1g.10gb" and pub.errors == {}
    fact = merge_models({"llm": pub}, {}).facts["llm"]
    assert fact.model is not None and fact.model.gpu_type == "h100_1g.10gb"
    assert replica_gpus(fact).endswith(", type h100_1g.10gb (repository)")
    # a type alone: one GPU of it
    one = merge_models({"m": Published("t", 100.0, gpu_type="h100_2g.20gb")}, {}).facts["m"]
    assert replica_gpus(one) == ", 1 GPU per replica: type h100_2g.20gb (repository)"
    bad = published_of(_llm(gpu_type="h100:1g"))
    assert (
        bad.gpu_type is None and "stb.gpu_type must be a GRES type name" in bad.errors["gpu_type"]
    )
    refused = merge_models({"llm": bad}, {}).facts["llm"]
    assert refused.model is None and any("gpu_type" in p for p in refused.problems)
