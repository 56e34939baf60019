"""The lab's LLM (triton_repo/smol: SmolLM2-135M on llama-cpp-python, CPU) on the lab's real
Triton, as a Slurm job on an inference node: real tokens stream through
`/v2/models/smol/generate_stream` (one server-sent event per token, spread over time, not
delivered at once), through the bridge's nginx routing too, and over gRPC streaming;
`/generate` answers once, the prompt first as the vLLM backend does; the vLLM backend's
metric families are on Triton's metrics page, labelled model and version, and their counts
match what the client received (generated tokens == events, one time to first token per
request, one per-token gap per token after the first).

The server loads the lab's model repository with the LLM named (a server started for
every model leaves it out: its config.pbtxt sets stb.load_at_start false, which
tests/lab/test_observe.py checks). A few short prompts, 24 tokens each: the module
takes about 15 s with the servers' starts. Needs ./deploy/bootstrap.sh's llama-cpp-python
and GGUF; the server's load says what is missing otherwise.
"""

from __future__ import annotations

import json
import queue
import socket
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.routing import nginx
from bridge.routing.nginxctl import NginxProcess
from bridge.routing.publisher import RoutingPublisher
from bridge.routing.table import RoutingTable

from .helpers import triton_serving

pytestmark = pytest.mark.lab

MODEL = "smol"
MAX_TOKENS = 24
PROMPTS = (
    "Write one sentence about the sea.",
    "Name three colours.",
    "What does a scheduler do?",
)
#: what the metrics page must hold for the model, with their Prometheus types
FAMILIES = {
    "vllm:prompt_tokens": "counter",  # the parser strips a counter's _total
    "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
}


@pytest.fixture(scope="module")
def served(lab: LabSpec) -> Iterator[triton.TritonJob]:
    """A Triton job on the first inference node serving the LLM."""
    with triton_serving(lab, MODEL, "stb-triton-llm") as job:
        yield job


@dataclass
class Stream:
    """What a client saw of one streamed request: each event's text and arrival time."""

    sent: float
    texts: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        return self.times[0] - self.sent

    def gaps_s(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    @property
    def text(self) -> str:
        return "".join(self.texts)


def stream(base_url: str, prompt: str) -> Stream:
    """POST generate_stream as a vLLM-backend client does and read the events as they come."""
    body = {
        "text_input": prompt,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "parameters": {"temperature": 0},
    }
    seen = Stream(sent=time.monotonic())
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{base_url}/v2/models/{MODEL}/generate_stream", json=body) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data:"):
                seen.times.append(time.monotonic())
                event = json.loads(line[len("data:") :])
                assert "error" not in event, event
                assert event["model_name"] == MODEL
                seen.texts.append(event["text_output"])
    return seen


def vllm_page(metrics_url: str) -> dict[str, dict[str, float]]:
    """family -> sample name -> value, for the model's series; every family's type and
    labels checked on the way."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=5).text):
        if not family.name.startswith("vllm:"):
            continue
        assert FAMILIES.get(family.name) == family.type, (family.name, family.type)
        for s in family.samples:
            assert s.labels.get("model") == MODEL and s.labels.get("version") == "1", s
            if "le" not in s.labels:
                out.setdefault(family.name, {})[s.name] = s.value
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def test_tokens_stream_and_the_vllm_metrics_count_them(served: triton.TritonJob) -> None:
    base = f"http://{served.http_url}"
    before = vllm_page(served.metrics_url)
    assert set(before) == set(FAMILIES)  # all there from the load, before any request
    streams = [stream(base, p) for p in PROMPTS]
    for s in streams:
        assert 1 < len(s.texts) <= MAX_TOKENS and s.text.strip(), s.texts
        # one event per token as it is made: spread over the generation, not one burst
        assert statistics.median(s.gaps_s()) > 0.002, s.gaps_s()
    after = vllm_page(served.metrics_url)

    def delta(family: str, sample: str) -> float:
        return after[family][sample] - before[family].get(sample, 0.0)

    events = sum(len(s.texts) for s in streams)
    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == events
    assert delta("vllm:request_generation_tokens", "vllm:request_generation_tokens_sum") == events
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") >= len(PROMPTS) * 10
    n = len(PROMPTS)
    ttft = "vllm:time_to_first_token_seconds"
    assert delta(ttft, f"{ttft}_count") == n
    tpot = "vllm:time_per_output_token_seconds"
    assert delta(tpot, f"{tpot}_count") == events - n
    e2e = "vllm:e2e_request_latency_seconds"
    assert delta(e2e, f"{e2e}_count") == n
    # the server's own first-token clock starts when an instance takes the request: it
    # cannot exceed what the client waited
    assert delta(ttft, f"{ttft}_sum") <= sum(s.ttft_s for s in streams)

    gaps = sorted(g for s in streams for g in s.gaps_s())
    print(
        f"\nsmol on {served.node}, {n} streams of up to {MAX_TOKENS} tokens ({events} events):"
        f" client TTFT {', '.join(_ms(s.ttft_s) for s in streams)}; per-token gap p50"
        f" {_ms(gaps[len(gaps) // 2])}, p90 {_ms(gaps[int(len(gaps) * 0.9)])}; server TTFT"
        f" mean {_ms(delta(ttft, f'{ttft}_sum') / n)}, TPOT mean"
        f" {_ms(delta(tpot, f'{tpot}_sum') / (events - n))}"
    )


def test_generate_answers_once_with_the_prompt_first(served: triton.TritonJob) -> None:
    prompt = PROMPTS[0]
    r = httpx.post(
        f"http://{served.http_url}/v2/models/{MODEL}/generate",
        json={"text_input": prompt, "parameters": {"temperature": 0, "max_tokens": 8}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out = r.json()["text_output"]
    assert out.startswith(prompt) and out[len(prompt) :].strip()  # vLLM's default


def test_tokens_stream_through_the_bridges_nginx(served: triton.TritonJob, tmp_path: Path) -> None:
    """The model routed by the bridge's routing code (RoutingPublisher, nginx's rendered
    configuration) on a private nginx, as the daemon would route it: the events still
    come one by one."""
    proc = NginxProcess(tmp_path / "nginx")
    proc.start()
    try:
        port = _free_port()
        publisher = RoutingPublisher(
            proc.routing_conf,
            tmp_path / "sd.json",
            proc.control,
            settings=nginx.NginxSettings(listen=f"127.0.0.1:{port}"),
            bridge_metrics="127.0.0.1:9100",
        )
        publisher.publish(RoutingTable.build({MODEL: [served.http_url]}))
        direct = stream(f"http://{served.http_url}", PROMPTS[1])
        routed = stream(f"http://127.0.0.1:{port}", PROMPTS[1])
    finally:
        proc.stop()
    assert 1 < len(routed.texts) <= MAX_TOKENS and routed.text.strip()
    # nginx passes each event on as it comes (its proxy buffering does not hold a stream
    # back from a client that reads as fast as it is written)
    assert statistics.median(routed.gaps_s()) > 0.002, routed.gaps_s()
    spread = routed.times[-1] - routed.times[0]
    print(
        f"\nthrough nginx: {len(routed.texts)} events, TTFT {_ms(routed.ttft_s)}, first to"
        f" last event {_ms(spread)} (direct: TTFT {_ms(direct.ttft_s)}, first to last"
        f" {_ms(direct.times[-1] - direct.times[0])})"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_tokens_stream_over_grpc(served: triton.TritonJob) -> None:
    """gRPC's bidirectional stream, as the vLLM backend's sample client uses it."""
    client = grpcclient.InferenceServerClient(served.grpc_url)
    got: queue.Queue[tuple[object, object, float]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error, time.monotonic())))

    def tensor(name: str, value: np.ndarray, dtype: str) -> grpcclient.InferInput:
        t = grpcclient.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        return t

    inputs = [
        tensor("text_input", np.array([PROMPTS[2].encode()], dtype=np.object_), "BYTES"),
        tensor("stream", np.array([True]), "BOOL"),
        tensor("sampling_parameters", np.array([b'{"temperature": "0", "max_tokens": "12"}'],
                                                dtype=np.object_), "BYTES"),
        tensor("return_finish_reason", np.array([True]), "BOOL"),
    ]  # fmt: skip
    try:
        client.async_stream_infer(MODEL, inputs, enable_empty_final_response=True)
        texts, reasons = [], []
        while True:
            result, error, _ = got.get(timeout=60)
            assert error is None, error
            response = result.get_response()  # type: ignore[attr-defined]
            if response.outputs:
                texts.append(result.as_numpy("text_output")[0].decode())  # type: ignore[attr-defined]
                reasons.append(result.as_numpy("finish_reason")[0].decode())  # type: ignore[attr-defined]
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert 1 < len(texts) <= 12 and "".join(texts).strip()
    assert reasons[-1] in ("stop", "length") and set(reasons[:-1]) <= {"None"}
