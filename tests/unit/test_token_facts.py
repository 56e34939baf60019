"""An LLM's token SLOs as model facts (bridge.modelfacts, bridge.triton.repository,
bridge.config): read from config.pbtxt's `stb.slo_ttft_p99_ms` / `stb.slo_tpot_p99_ms` /
`stb.slo_e2e_p99_ms`, overridden by the TOML's `[models.NAME]`, validated with errors
naming the model and the field; a model with token SLOs and no request SLO is scaled;
`stb config check` shows them."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2

from bridge.config import ModelConfig, ModelOverride
from bridge.config_cli import token_slos
from bridge.modelfacts import merge_models, shown_slo
from bridge.paths import project_root
from bridge.triton.repository import (
    ModelConfigError,
    check_model,
    parse_config,
    published_of,
    read_published,
)

HEAD = """name: "llm" backend: "python"
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
parameters: { key: "stb.team" value: { string_value: "team-nlp" } }
"""


def config(**params: str) -> model_config_pb2.ModelConfig:
    text = HEAD + "".join(
        f'parameters: {{ key: "stb.{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in params.items()
    )
    return parse_config(text, "llm/config.pbtxt")


def test_the_labs_llm_is_scaled_by_its_token_slos_alone() -> None:
    pub = read_published(project_root() / "triton_repo" / "smol")
    assert (pub.slo_p99_ms, pub.slo_ttft_p99_ms, pub.slo_tpot_p99_ms) == (None, 2000.0, 150.0)
    fact = merge_models({"smol": pub}, {}).facts["smol"]
    assert fact.model is not None and fact.problems == ()
    assert fact.model.has_token_slo and not fact.model.has_request_slo
    assert math.isinf(fact.model.slo_p99_ms) and shown_slo(fact.model.slo_p99_ms) == "-"
    assert fact.sources["slo_ttft_p99_ms"] == "repository" and "slo_p99_ms" not in fact.sources
    assert token_slos(fact) == ", TTFT p99 2000 ms (repository), TPOT p99 150 ms (repository)"


def test_the_toml_overrides_a_token_slo_field_by_field_and_says_so() -> None:
    pub = published_of(config(slo_ttft_p99_ms="2000", slo_tpot_p99_ms="150"))
    over = {"llm": ModelOverride(slo_tpot_p99_ms=100, slo_e2e_p99_ms=30000)}
    fact = merge_models({"llm": pub}, over).facts["llm"]
    assert fact.model is not None
    assert (fact.model.slo_ttft_p99_ms, fact.model.slo_tpot_p99_ms) == (2000.0, 100.0)
    assert fact.model.slo_e2e_p99_ms == 30000.0
    assert fact.sources["slo_tpot_p99_ms"] == "toml" and fact.sources["slo_e2e_p99_ms"] == "toml"
    assert fact.overrides == (
        "model llm: slo_tpot_p99_ms = 100 from the TOML [models.llm] overrides "
        "stb.slo_tpot_p99_ms in its config.pbtxt (150)",
    )
    # a TOML token SLO alone makes a repository model without one scaled
    plain = merge_models(
        {"llm": published_of(config())}, {"llm": ModelOverride(slo_ttft_p99_ms=500)}
    )
    assert plain.facts["llm"].model is not None


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("fast", "parameter stb.slo_ttft_p99_ms must be a number, got 'fast'"),
        ("-5", "stb.slo_ttft_p99_ms must be > 0 ms, got -5"),
        ("0", "stb.slo_ttft_p99_ms must be > 0 ms, got 0"),
        ("inf", "stb.slo_ttft_p99_ms must be > 0 ms, got inf"),
    ],
)
def test_a_bad_token_slo_is_refused_naming_the_model_and_the_field(value: str, said: str) -> None:
    pub = published_of(config(slo_ttft_p99_ms=value, slo_tpot_p99_ms="150"))
    fact = merge_models({"llm": pub}, {}).facts["llm"]
    assert fact.model is None
    assert fact.problems == (f"model llm: slo_ttft_p99_ms: {said}",)
    with pytest.raises(ModelConfigError, match=r"stb\.slo_ttft_p99_ms"):
        check_model(config(slo_ttft_p99_ms=value), "llm", "llm/config.pbtxt")


def test_publishing_takes_a_token_slo_for_the_request_slo() -> None:
    meta = check_model(config(slo_tpot_p99_ms="150"), "llm", "llm/config.pbtxt")
    assert math.isinf(meta.slo_p99_ms)
    with pytest.raises(ModelConfigError, match=r"stb.slo_p99_ms is missing \(or, for an LLM"):
        check_model(config(slo_e2e_p99_ms="9000"), "llm", "llm/config.pbtxt")
    # no SLO of either kind: served, not scaled, and said why
    fact = merge_models({"llm": published_of(config())}, {}).facts["llm"]
    assert fact.model is None and "stb.slo_ttft_p99_ms" in fact.why


def test_the_toml_refuses_a_token_slo_that_is_not_positive() -> None:
    with pytest.raises(ValidationError, match="slo_tpot_p99_ms"):
        ModelOverride(slo_tpot_p99_ms=0)
    with pytest.raises(ValidationError, match="slo_ttft_p99_ms"):
        ModelConfig(slo_p99_ms=100, slo_ttft_p99_ms=-1)
    assert ModelConfig(slo_p99_ms=100).has_request_slo
    assert not ModelConfig(slo_p99_ms=100).has_token_slo
