"""The simulator's token workloads (bridge.sim.tokens): the trace's token columns, the
context clip, TTFT/TPOT shares from the token capacity model, and a short comparison that
reports TTFT and TPOT attainment per set-up. The simulated bridge sees an LLM as the
daemon does (token SLOs, profiles, each tick's TTFT/TPOT p99s and token rates in its
samples), and the quiet proof leaves the ticks its token rules act on to `assess`
(mutants of the proof each skip one)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from bridge.config import PolicyConfig
from bridge.policy import ModelSample
from bridge.policy.capacity import Group
from bridge.policy.tokens import SMOL_LAB, predict
from bridge.sim.build import build_scenario
from bridge.sim.engine import Engine
from bridge.sim.latency import LEAST_CONN_CA2
from bridge.sim.policies import Scenario, compare, setup_for, size
from bridge.sim.quiet import QuietProof
from bridge.sim.tokens import TokenModel, fit_context, mixture_quantile, read_token_lengths
from bridge.sim.workload import ArrivalSeries

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


# -- the token signal of the simulated bridge (issue 30: decide's token rules act) ---------


@pytest.mark.parametrize(
    "state",
    [
        (0.0, 0.0, 0.0, 0.0, float("inf")),  # idle: the prefills alone
        (0.6, 0.0, 0.0, 0.004, 1.5),  # little waits (wait_p under 1 - q)
        (1.6, 0.0, 0.0, 0.5, 0.2),  # busy: the mixture of one and two sequences
        (2.0, 5.0, 10.0, 0.3, 0.4),  # a backlog
    ],
)
def test_the_ticks_p99s_are_the_quantiles_of_its_shares(
    state: tuple[float, float, float, float, float],
) -> None:
    _, _, ttft_p99, tpot_p99 = MODEL.tick(*state)
    at = dataclasses.replace(MODEL, slo_ttft_s=ttft_p99, slo_tpot_s=tpot_p99)
    below = dataclasses.replace(MODEL, slo_ttft_s=ttft_p99 - 1e-3, slo_tpot_s=tpot_p99 - 1e-6)
    assert at.shares(*state)[0] >= 0.99 - 1e-9 and below.shares(*state)[0] < 0.99
    assert at.shares(*state)[1] >= 0.99 - 1e-9 and below.shares(*state)[1] < 0.99
    assert MODEL.tick(*state)[:2] == MODEL.shares(*state)


def _exceed(mix: list[tuple[float, list[float]]], wait_p: float, tail: float, t: float) -> float:
    """The chance that wait + prefill exceeds t, summed exactly."""
    return math.fsum(
        w / len(xs) * (1.0 if t < x else wait_p * math.exp(-tail * (t - x)))
        for w, xs in mix
        for x in xs
    )


def test_the_mixture_quantile_is_exact() -> None:
    rng = random.Random(7)
    for _ in range(300):
        base = sorted(rng.uniform(0.05, 5.0) for _ in range(rng.choice((1, 5, 101))))
        weights = [rng.random() ** 3 + 1e-9 for _ in range(rng.choice((1, 2, 3)))]
        mix = [(w / sum(weights), [x * (1 + 0.4 * j) for x in base]) for j, w in enumerate(weights)]
        wait_p = rng.choice((0.0, rng.random(), 0.01 * rng.random()))
        tail = rng.choice((rng.uniform(0.05, 5.0), 50.0, 500.0))
        q = mixture_quantile(mix, wait_p, tail)
        assert _exceed(mix, wait_p, tail, q) <= 0.01 + 1e-12  # (not lower than exact)
        assert _exceed(mix, wait_p, tail, q - 1e-7 * max(1.0, q)) > 0.01 - 1e-12
    with pytest.raises(ValueError, match="at least one prefill"):
        mixture_quantile([(0.0, [1.0])], 0.5, 1.0)


def _scenario(
    minutes: list[float], tpot_s: float = 0.030, headroom: float = 1.2, ca2: float = LEAST_CONN_CA2
) -> Scenario:
    """One LLM (the lab's profile, every prompt 400 tokens and answer 150) on 40 nodes,
    its rate per minute as given, the policy's lend headroom `headroom`; `ca2`: the
    arrivals' SCV at a replica (default least_conn's)."""
    model = TokenModel(SMOL_LAB, 6.0, tpot_s, (400.0,), (150.0,))
    policy = PolicyConfig(capacity_headroom=headroom, return_headroom=max(1.5, headroom + 0.2))
    return Scenario(
        nodes=40, gpus_per_node=8, arrivals=ArrivalSeries(60.0, {"llm": np.array(minutes)}),
        jobs=[], models={"llm": (model.slo_e2e_ms, model.service_s() * 1000.0)},
        horizon_s=len(minutes) * 60.0, policy=policy, tokens={"llm": model},
        replica_servers=2, service_cv2=model.service_cv2(),
        routing_ca2=ca2,
    )  # fmt: skip


def test_the_bridge_sees_an_llm_as_the_daemon_does() -> None:
    scenario = _scenario([1.0] * 10)
    setup = setup_for("bridge", scenario, size(scenario))
    engine = Engine(setup)
    result = engine.run()
    spec = engine.specs["llm"]
    assert not spec.has_request_slo and spec.has_token_slo
    assert (spec.slo_ttft_p99_ms, spec.slo_tpot_p99_ms) == (6000.0, 30.0)
    assert engine.snapshot().token_profiles == {"llm": SMOL_LAB}
    # the request column keeps its objective: the end-to-end bound
    tm = scenario.tokens["llm"]
    assert result.models["llm"].slo_p99_ms == pytest.approx(tm.slo_e2e_ms)
    sample = engine.history["llm"][-1]
    assert sample.request_rate == pytest.approx(1.0)
    assert sample.prompt_tps == pytest.approx(400.0)
    assert sample.output_tps == pytest.approx(150.0)
    (group,) = engine.serving.groups.values()
    assert group.state is not None
    _, _, ttft_s, tpot_s = tm.tick(group.load, *group.state)
    assert sample.ttft_p99_ms == pytest.approx(ttft_s * 1000.0)
    assert sample.tpot_p99_ms == pytest.approx(tpot_s * 1000.0)
    assert sample.running == pytest.approx(min(tm.service_s(), 2.0 * group.nodes))


def test_a_model_without_tokens_keeps_its_samples() -> None:
    scenario = dataclasses.replace(_scenario([1.0] * 5), tokens={})
    engine = Engine(setup_for("bridge", scenario, size(scenario)))
    engine.run()
    assert engine.specs["llm"].has_request_slo and engine.snapshot().token_profiles == {}
    sample = engine.history["llm"][-1]
    assert sample.ttft_p99_ms is None and sample.prompt_tps is None and sample.p99_ms


#: a rise from 1 to 3 req/s over 20 minutes, held 5, then 1 req/s
RISE = [1.0] * 15 + list(np.linspace(1.0, 3.0, 20)) + [3.0] * 5


def _no_token_lend_check(
    self: QuietProof,
    groups: Sequence[Group],
    rates: Sequence[float],
    models: Sequence[str] | None = None,
    shorter: bool = False,
) -> bool:
    return shorter is False or ORIGINAL_CARRIED(self, groups, rates, models, shorter)


def _no_token_breach(self: QuietProof, samples: Sequence[ModelSample]) -> None:
    ORIGINAL_OBSERVE(self, samples)
    self.token_breach = [0] * len(self.token_breach)


def _return_claimed(
    self: QuietProof,
    groups: Sequence[Group],
    rates: Sequence[float],
    models: Sequence[str] | None = None,
    shorter: bool = False,
) -> bool:
    return shorter is False and ORIGINAL_CARRIED(self, groups, rates, models, shorter)


ORIGINAL_CARRIED = QuietProof._tokens_carried
ORIGINAL_OBSERVE = QuietProof.observe_all


@pytest.mark.parametrize(
    ("mutant", "scenario"),
    [
        # the token rule lends ahead of a breach (a lend headroom of 1.6): a proof that
        # does not hold its lend skips those ticks
        (("_tokens_carried", _no_token_lend_check), _scenario(RISE, headroom=1.6)),
        # the TTFT breaches first (lend headroom 1.2; Poisson arrivals at each replica,
        # where its p99 is over the 6 s objective from the start): a proof that does not
        # count token breaches skips the backstop's lend
        (("observe_all", _no_token_breach), _scenario(RISE, ca2=1.0)),
        # the rate falls back and the LLM calms (TPOT 22 ms under 0.5 x 50 ms): a proof
        # that takes every return as refused by the tokens skips the returns
        (("_tokens_carried", _return_claimed), _scenario(RISE + [1.0] * 45, tpot_s=0.050)),
    ],
    ids=["token-lend", "token-breach", "token-return"],
)
def test_the_quiet_proof_leaves_the_token_rules_ticks_to_assess(
    mutant: tuple[str, object], scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = setup_for("bridge", scenario, size(scenario))
    setup.check_quiet = True  # assess on every proven tick: it must not act
    engine = Engine(setup)
    result = engine.run()
    assert engine.proven > 100 and result.lends > 0
    monkeypatch.setattr(QuietProof, *mutant)
    setup = setup_for("bridge", scenario, size(scenario))
    setup.check_quiet = True
    with pytest.raises(AssertionError, match="proven quiet, but assess acts"):
        Engine(setup).run()
