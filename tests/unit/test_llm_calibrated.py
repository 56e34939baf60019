"""The policy sizes an LLM by its profile corrected by its replicas' own counters
(`bridge.policy.llm.calibrated`, `needs`): pure, on literal samples."""

from __future__ import annotations

from bridge.config import ModelConfig
from bridge.policy import llm
from bridge.policy.snapshot import ModelSample, ReplicaView, Snapshot
from bridge.policy.tokenfit import calibrate
from bridge.policy.tokens import SMOL_LAB, TokenDemand

PROMPTS = (40.0, 60.0, 80.0, 120.0)
OUTPUTS = (8.0, 12.0, 16.0)


def sample(
    at: float, rate: float, ttft_ms: float | None, tpot_ms: float | None, timed: float
) -> ModelSample:
    return ModelSample(
        at,
        None,
        rate,
        prompt_tps=rate * sum(PROMPTS) / len(PROMPTS),
        output_tps=rate * sum(OUTPUTS) / len(OUTPUTS),
        prompt_lengths=PROMPTS,
        output_lengths=OUTPUTS,
        ttft_mean_ms=ttft_ms,
        tpot_mean_ms=tpot_ms,
        timed=timed,
    )


def test_the_means_are_pooled_by_the_requests_each_sample_timed() -> None:
    history = (sample(0.0, 2.0, 400.0, 30.0, 10.0), sample(5.0, 4.0, 700.0, 45.0, 30.0))
    got = llm.calibrated(SMOL_LAB, history, replicas=2)
    rate = (2.0 * 10 + 4.0 * 30) / 40 / 2  # pooled, one replica's share
    want = calibrate(
        SMOL_LAB,
        TokenDemand(rate, PROMPTS, OUTPUTS),
        (400.0 * 10 + 700.0 * 30) / 40 / 1000.0,
        (30.0 * 10 + 45.0 * 30) / 40 / 1000.0,
    )
    assert got == want and got != SMOL_LAB
    assert got.tpot_s[0] > SMOL_LAB.tpot_s[0]


def test_too_few_timed_requests_or_no_replica_leave_the_profile() -> None:
    few = (sample(0.0, 2.0, 900.0, 60.0, llm.CALIBRATE_MIN_REQUESTS - 1),)
    assert llm.calibrated(SMOL_LAB, few, replicas=1) == SMOL_LAB
    many = (sample(0.0, 2.0, 900.0, 60.0, 50.0),)
    assert llm.calibrated(SMOL_LAB, many, replicas=0) == SMOL_LAB
    assert llm.calibrated(SMOL_LAB, (sample(0.0, 2.0, None, None, 50.0),), 1) == SMOL_LAB


def test_replicas_running_slower_than_their_profile_need_more_of_them() -> None:
    model = ModelConfig(slo_p99_ms=60_000, slo_ttft_p99_ms=2_000, slo_tpot_p99_ms=80)

    def need(ttft_ms: float | None, tpot_ms: float | None) -> int:
        history = (sample(0.0, 3.0, ttft_ms, tpot_ms, 200.0),)
        snap = Snapshot(
            nodes=(),
            replicas=(ReplicaView("n4", ("smol",)), ReplicaView("n3", ("smol",), lease_id=1)),
            history={"smol": history},
            leases=(),
            models={"smol": model},
            token_profiles={"smol": SMOL_LAB},
        )
        return llm.needs(snap, {"smol": 3.0})["smol"]

    as_profiled = need(None, None)
    # the replicas' own clocks say they run 60% slower than the profile
    slower = need(1.6 * 1000 * SMOL_LAB.prefill(70.0) * 1.2, 1.6 * 1000 * SMOL_LAB.tpot_s[1])
    assert slower > as_profiled
    # and faster: fewer
    faster = need(0.6 * 1000 * SMOL_LAB.prefill(70.0), 0.6 * 1000 * SMOL_LAB.tpot_s[0])
    assert faster <= as_profiled
