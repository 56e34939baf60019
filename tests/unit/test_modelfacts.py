"""One place for each model fact: the merge of the model repository's metadata with the
TOML's overrides (`bridge.modelfacts.merge_models`) on literal inputs, the repository's
reading (`published_of`, `PublishedModels`: parsed again only when a config changed), the
catalog that logs each override once, the observer that reads the repository each tick
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
from tritonclient.grpc import model_config_pb2
from typer.testing import CliRunner

from bridge.cli import app
from bridge.config import BridgeConfig, DaemonConfig, ModelConfig, ModelOverride, TritonJobConfig
from bridge.daemon.observation import snapshot
from bridge.daemon.observe import Observer
from bridge.modelfacts import FILE, ModelFactsError, Published, merge_models, toml_models
from bridge.ops.cli import collect
from bridge.policy import Lend, ModelSample, NodeView, ReplicaView, Snapshot, decide
from bridge.triton.catalog import ModelCatalog, site_models
from bridge.triton.repository import PublishedModels, instances_of, published_of, read_published

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
    ("groups", "instances"),
    [
        ("instance_group [ { count: 2 kind: KIND_CPU } ]", 2),
        ("instance_group [ { kind: KIND_CPU }, { count: 3 kind: KIND_MODEL } ]", 4),
        ("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] } ]", 4),
        ("instance_group [ { count: 2 kind: KIND_GPU } ]", None),  # on every GPU of its node
        ("", None),  # Triton's default: one per GPU
    ],
)
def test_instances_come_from_the_instance_group(groups: str, instances: int | None) -> None:
    assert instances_of(_config(groups)) == instances


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
    path = tmp_path / "bridge.toml"
    path.write_text(f'[models.busy]\nslo_p99_ms = 80\n[triton]\nmodel_repository = "{repo}"\n')
    res = CliRunner().invoke(app, ["config", "check", str(path)], env={"COLUMNS": "300"})
    out = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert (
        "busy: SLO p99 80 ms (toml), replicas 1 (default) to 3 (repository), instances 1 "
        "(repository)" in out
    )
    assert "plain: served, not scaled: no stb.slo_p99_ms" in out
    assert "override: model busy: slo_p99_ms = 80 from the TOML" in out
    # bad metadata: the command names the model and the field, and fails
    _write_model(repo, "plain", {"stb.team": "t", "stb.max_replicas": "many"})
    bad = CliRunner().invoke(app, ["config", "check", str(path)], env={"COLUMNS": "300"})
    assert bad.exit_code == 1
    assert "model plain: max_replicas: parameter stb.max_replicas must be a number" in " ".join(
        bad.output.split()
    )


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
