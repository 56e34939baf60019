"""The LLM's token signal reaches the daemon's observation from a real scrape: with the
lab's smol (triton_repo/smol, SmolLM2-135M on llama-cpp-python) served by a real Triton
job, the daemon's own observe step (`Observer`, real Slurm, the bridge's Triton client)
is taken once, a few requests are streamed, and the next observation's sample of smol
carries its TTFT p99, TPOT p99 and token rates, within what the client itself saw; and
its facts are the token SLOs of its config.pbtxt. About 15 s with the server's start."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import httpx
import pytest

from bridge.config import BridgeConfig
from bridge.daemon.observe import Observer
from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.slurm.cli import SlurmCLI
from bridge.triton.client import TritonHttpClient

from .helpers import triton_serving

pytestmark = pytest.mark.lab

MODEL = "smol"
MAX_TOKENS = 16
PROMPTS = ("Name three colours.", "What does a scheduler do?", "Name a planet.")


@pytest.fixture(scope="module")
def served(lab: LabSpec) -> Iterator[triton.TritonJob]:
    """A Triton job on the first inference node serving the LLM."""
    with triton_serving(lab, MODEL, "stb-triton-sig") as job:
        yield job


def stream(base: str, prompt: str) -> tuple[float, list[float]]:
    """One streamed request: the client's time to first event and its gaps, seconds."""
    body = {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": True,
            "parameters": {"temperature": 0}}  # fmt: skip
    sent, times = time.monotonic(), []
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{base}/v2/models/{MODEL}/generate_stream", json=body) as r,
    ):
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:"):
                times.append(time.monotonic())
    return times[0] - sent, [b - a for a, b in itertools.pairwise(times)]


def test_ttft_and_tpot_reach_the_observation(lab: LabSpec, served: triton.TritonJob) -> None:
    clients: dict[str, TritonHttpClient] = {}

    def triton_for(address: str) -> TritonHttpClient:
        if address not in clients:
            clients[address] = TritonHttpClient(address, api_key=triton.api_key(lab))
        return clients[address]

    config = BridgeConfig(triton=triton.job_config(lab))
    observer = Observer(SlurmCLI(env=lab.env()), config, triton_for)
    try:
        first = observer.observe(time.time())
        assert first.server_of(served.job_id) is not None
        before = first.history[MODEL][-1]
        # nothing measured yet: no data, never zero
        assert before.ttft_p99_ms is None and before.tpot_p99_ms is None
        seen = [stream(f"http://{served.http_url}", p) for p in PROMPTS]
        obs = observer.observe(time.time())
    finally:
        observer.close()
        for c in clients.values():
            c.close()
    sample = obs.history[MODEL][-1]
    ttfts = [t for t, _ in seen]
    gaps = sorted(g for _, gs in seen for g in gs)
    print(
        f"\nsmol observed: TTFT p99 {sample.ttft_p99_ms:.0f} ms (client max"
        f" {max(ttfts) * 1000:.0f} ms), TPOT p99 {sample.tpot_p99_ms:.0f} ms (client max gap"
        f" {gaps[-1] * 1000:.0f} ms), {sample.prompt_tps:.1f} prompt and"
        f" {sample.output_tps:.1f} output tokens/s, running {sample.running}"
    )
    assert sample.ttft_p99_ms is not None and sample.tpot_p99_ms is not None
    # the p99 lies in the bucket of the slowest first token: at most that bucket's upper
    # bound (the vLLM backend's TTFT buckets double at most 2.5x), and the server's clock
    # starts when an instance takes the request, after the client sent it
    assert 0 < sample.ttft_p99_ms <= 2.5 * max(ttfts) * 1000
    assert 0 < sample.tpot_p99_ms <= 2.5 * gaps[-1] * 1000
    assert sample.output_tps is not None and sample.output_tps > 0
    assert sample.prompt_tps is not None and sample.prompt_tps > 0
    assert sample.running == 0.0  # every stream finished before the scrape
    # the means the capacity model corrects its profile by: every stream timed once, its
    # TTFT on the server's clock no longer than the client's (which holds the send), a
    # mean token gap within the client's gaps
    assert sample.timed == len(PROMPTS)
    assert sample.ttft_mean_ms is not None and sample.tpot_mean_ms is not None
    assert 0 < sample.ttft_mean_ms <= sum(ttfts) / len(ttfts) * 1000
    assert gaps[0] * 1000 * 0.5 <= sample.tpot_mean_ms <= gaps[-1] * 1000
    facts = obs.models.facts[MODEL].model
    assert facts is not None and (facts.slo_ttft_p99_ms, facts.slo_tpot_p99_ms) == (2000, 150)
