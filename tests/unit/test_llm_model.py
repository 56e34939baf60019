"""The lab's LLM (triton_repo/smol), its pure parts outside Triton: the metric families are
the vLLM backend's, the prompt is SmolLM2's chat template, requests shaped as the vLLM
backend's clients send them parse the same, and a request's tokens and times add up.
Neither Triton nor llama-cpp-python is needed (tests/lab/test_llm_lab.py runs the model)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bridge.paths import project_root
from bridge.triton.repository import parse_config

MODEL_DIR = project_root() / "triton_repo" / "smol"


@pytest.fixture(scope="module")
def smol() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stb_smol_model", MODEL_DIR / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


#: triton-inference-server/vllm_backend src/utils/metrics.py (TritonMetrics) at
#: 8de0c148bda1da25de1e05ffaaf67116dacc7264: every family it reports through Triton
VLLM_BACKEND_FAMILIES = [
    ("vllm:prompt_tokens_total", "counter"),
    ("vllm:generation_tokens_total", "counter"),
    ("vllm:time_to_first_token_seconds", "histogram"),
    ("vllm:time_per_output_token_seconds", "histogram"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:request_prompt_tokens", "histogram"),
    ("vllm:request_generation_tokens", "histogram"),
    ("vllm:request_params_n", "histogram"),
]


def test_the_metric_families_are_the_vllm_backends(smol: ModuleType) -> None:
    specs = smol.metric_specs(2048)
    assert [(s.name, s.kind) for s in specs] == VLLM_BACKEND_FAMILIES
    by_name = {s.name: s for s in specs}
    ttft = by_name["vllm:time_to_first_token_seconds"].buckets
    assert ttft[0] == 0.001 and ttft[-1] == 10.0 and len(ttft) == 16
    assert by_name["vllm:time_per_output_token_seconds"].buckets[-1] == 2.5
    assert by_name["vllm:e2e_request_latency_seconds"].buckets[-1] == 60.0
    assert by_name["vllm:request_prompt_tokens"].buckets[-1] == 2000  # up to the context
    assert all(s.buckets == tuple(sorted(s.buckets)) for s in specs if s.buckets)
    assert smol.build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)  # vLLM's example


def test_the_prompt_is_smollm2s_chat_template(smol: ModuleType) -> None:
    # the GGUF's tokenizer.chat_template for one user message, generation prompt added
    assert smol.format_prompt("Hi?", "chatml") == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert smol.format_prompt("Once upon", "raw") == "Once upon"
    with pytest.raises(ValueError, match="prompt_format"):
        smol.format_prompt("x", "llama3")


def test_requests_parse_as_the_vllm_backend_reads_them(smol: ModuleType) -> None:
    # its README's /generate request: sampling in the request's parameters, no stream
    req = smol.parse_request(
        {"text_input": b"What is Triton?"}, '{"stream": false, "temperature": 0}'
    )
    assert (req.text, req.stream, req.prepend_input) == ("What is Triton?", False, True)
    assert req.sampling.temperature == 0 and req.sampling.max_tokens == 16
    # its gRPC sample client: stream input, sampling_parameters as a JSON string of strings
    req = smol.parse_request(
        {
            "text_input": "Hello",
            "stream": True,
            "sampling_parameters": '{"temperature": "0.1", "top_p": "0.95", "max_tokens": "100"}',
            "return_num_output_tokens": True,
        },
        '{"max_tokens": 5}',
    )
    assert req.stream and not req.prepend_input
    assert (req.sampling.max_tokens, req.sampling.top_p) == (100, 0.95)
    assert req.returns == {"num_output_tokens"}
    # a top-level "max_tokens" of /generate (the INT32 input) wins; stream as a parameter
    req = smol.parse_request({"text_input": "x", "max_tokens": 3}, '{"stream": true}')
    assert req.stream and req.sampling.max_tokens == 3
    assert not smol.parse_request(
        {"text_input": "x", "exclude_input_in_output": True}, None
    ).prepend_input


@pytest.mark.parametrize(
    ("inputs", "parameters", "why"),
    [
        ({}, None, "text_input is missing"),
        ({"text_input": "x", "stream": True, "exclude_input_in_output": False}, None,
         "When streaming"),
        ({"text_input": "x", "max_tokens": 0}, None, "max_tokens must be at least 1"),
        ({"text_input": "x"}, '{"temperature": "hot"}', "not a number"),
        ({"text_input": "x", "sampling_parameters": "[1]"}, None, "not a JSON object"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_saying_why(
    smol: ModuleType, inputs: dict[str, object], parameters: str | None, why: str
) -> None:
    with pytest.raises(smol.RequestError, match=why):
        smol.parse_request(inputs, parameters)


def test_a_requests_tokens_and_times_add_up(smol: ModuleType) -> None:
    tally = smol.Tally(arrived=10.0, prompt_tokens=37)
    for at in (10.25, 10.27, 10.30, 10.31):
        tally.token(at)
    tally.finish(10.32)
    assert tally.generation_tokens == 4
    assert tally.ttft_s == pytest.approx(0.25)
    assert tally.gaps_s() == pytest.approx([0.02, 0.03, 0.01])  # one per token after the first
    assert tally.e2e_s == pytest.approx(0.32)


def test_a_character_split_across_tokens_waits_for_its_last_byte(smol: ModuleType) -> None:
    text = smol.Utf8Stream()
    e_acute = "É".encode()
    assert [text.push(b"L'"), text.push(e_acute[:1]), text.push(e_acute[1:] + b"t")] == [
        "L'",
        "",
        "Ét",
    ]
    assert text.flush() == ""


def test_the_gguf_is_looked_for_in_the_environment(
    smol: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("STB_MODELS_DIR", raising=False)
    assert smol.gguf_path("m.gguf") == Path(sys.prefix) / "share" / "stb-models" / "m.gguf"
    assert smol.gguf_path("/srv/m.gguf") == Path("/srv/m.gguf")
    monkeypatch.setenv("STB_MODELS_DIR", str(tmp_path))
    assert smol.gguf_path("m.gguf") == tmp_path / "m.gguf"


def test_the_config_is_a_decoupled_model_with_the_vllm_backends_inputs() -> None:
    cfg = parse_config((MODEL_DIR / "config.pbtxt").read_text(), "smol")
    assert cfg.name == "smol" and cfg.backend == "python"
    assert cfg.model_transaction_policy.decoupled
    inputs = {i.name: i for i in cfg.input}
    assert not inputs["text_input"].optional
    assert {"stream", "max_tokens", "sampling_parameters", "exclude_input_in_output"} <= {
        name for name, i in inputs.items() if i.optional
    }
    assert cfg.output[0].name == "text_output"
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert cfg.instance_group[0].count >= 1  # the sequences one replica runs at once
