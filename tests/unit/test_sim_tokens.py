"""The simulator's token workloads (bridge.sim.tokens): the trace's token columns, the
context clip, TTFT/TPOT shares from the token capacity model, and a short comparison that
reports TTFT and TPOT attainment per set-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridge.policy.tokens import SMOL_LAB, predict
from bridge.sim.build import build_scenario
from bridge.sim.policies import compare
from bridge.sim.tokens import TokenModel, fit_context, read_token_lengths

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _write(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


def test_reads_the_token_columns(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.csv",
        [HEADER, "2023-11-16 18:15:46.6805900,374,44", "", "2023-11-16 18:15:50.9951690,396,109"],
    )
    assert read_token_lengths(path) == ([374.0, 396.0], [44.0, 109.0])


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        (["TIMESTAMP,ContextTokens", "x,1"], "no column GeneratedTokens"),
        ([HEADER, "x,12,-3"], r"line 2: GeneratedTokens '-3' is not a whole number"),
        ([HEADER, "x,,3"], "line 2: ContextTokens '' is not"),
        ([HEADER], "no request rows"),
    ],
)
def test_a_bad_trace_names_the_problem(tmp_path: Path, rows: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        read_token_lengths(_write(tmp_path / "bad.csv", rows))


def test_lengths_fit_the_context() -> None:
    prompts, outputs = fit_context([100, 3000, 5000], [50, 1500, 10], 2048)
    assert outputs == [50, 1024, 10]
    assert prompts == [100, 1024, 2038]
    with pytest.raises(ValueError, match="context must be at least 2"):
        fit_context([1], [1], 1)


MODEL = TokenModel(SMOL_LAB, 6.0, 0.030, (50.0, 200.0, 500.0, 900.0), (50.0, 150.0, 300.0))


def test_shares_follow_the_load() -> None:
    idle = MODEL.shares(0.0, 0.0, 0.0, 0.0, float("inf"))
    busy = MODEL.shares(1.6, 0.0, 0.0, 0.5, 0.2)
    backlog = MODEL.shares(2.0, 5.0, 10.0, 0.0, float("inf"))
    assert idle == (1.0, 1.0)  # every prefill alone is within 6 s, 16 ms within 30 ms
    assert busy[0] < idle[0] and backlog[0] < busy[0]
    assert backlog[1] == 1.0  # 22 ms at two sequences: within 30 ms even when full
    tight = dataclasses.replace(MODEL, slo_tpot_s=0.020)
    assert tight.shares(1.0, 0.0, 0.0, 0.1, 1.0)[1] < 1.0
    assert tight.shares(2.0, 1.0, 2.0, 0.0, float("inf"))[1] == 0.0
    with pytest.raises(ValueError, match="slo_ttft_s must be a positive"):
        TokenModel(SMOL_LAB, 0.0, 0.03, (1.0,), (1.0,))


def test_sizing_is_the_token_model() -> None:
    n = MODEL.replicas(1.0)
    ttft, tpot = MODEL.predicted(1.0, n)
    assert ttft <= MODEL.slo_ttft_s and tpot <= MODEL.slo_tpot_s
    assert not predict(SMOL_LAB, MODEL.demand(1.0), n - 1).within(6.0, 0.030)


def test_a_comparison_reports_ttft_and_tpot_attainment() -> None:
    tokens = {"llm": MODEL}
    policies = ["separate-peak", "separate-mean"]
    scenario = build_scenario(
        days=0.05, nodes=40, gpus_per_node=8, rates={"llm": 1.0},
        slo_ms=MODEL.slo_e2e_ms, service_ms=MODEL.service_s() * 1000.0,
        arrivals="synthetic", arrivals_trace=None, jobs="synthetic", jobs_trace=None,
        load=0.5, policies=policies, tokens=tokens, replica_servers=2,
    )  # fmt: skip
    peak, mean = compare(scenario, policies).results
    # separate-peak is sized by the token model for its peak minute
    rates = {"llm": 1.0}
    assert peak.pools["inference"] >= MODEL.replicas(rates["llm"])
    assert peak.ttft_share is not None and mean.ttft_share is not None
    assert peak.ttft_share > 0.99 and peak.tpot_share == 1.0
    assert mean.ttft_share <= peak.ttft_share
    out = peak.as_dict()
    assert out["ttft_share"] == peak.ttft_share
    assert out["models"]["llm"]["tpot_share"] == peak.tpot_share
