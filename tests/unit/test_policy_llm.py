"""The policy's token rules on literal snapshots: an LLM (token objectives, no request
objective) is lent for by the token capacity model and its profile, breaches and calms on
its measured TTFT and TPOT p99s, and a lent replica goes back only when the replicas left
carry the return's token demand."""

from __future__ import annotations

import dataclasses
import math

from bridge.config import BridgeConfig, ModelConfig, PolicyConfig
from bridge.policy import (
    LeaseView,
    Lend,
    ModelSample,
    ModelStatus,
    NodeView,
    ReplicaView,
    Return,
    Snapshot,
    evaluate_model,
    llm,
)
from bridge.policy import decide as policy_decide
from bridge.policy.tokens import SMOL_LAB

T0 = 1_800_000_000.0
TICK = 5.0
SMOL = ModelConfig(
    slo_p99_ms=math.inf, slo_ttft_p99_ms=2000, slo_tpot_p99_ms=150, min_replicas=1, max_replicas=4
)
CONFIG = BridgeConfig(
    models={},
    policy=PolicyConfig(
        breach_evaluations=3,
        scale_out_cooldown_s=60,
        scale_in_cooldown_s=120,
        max_lent_nodes=4,
        return_dwell_s=20,
        capacity_headroom=1.0,
        return_headroom=1.0,
    ),
)
RESERVED = NodeView("n4", "inference", True, 4, has_triton=True)
ELASTIC = (NodeView("n3", "elastic", True, 4), NodeView("n5", "elastic", True, 4))
BASELINE = ReplicaView("n4", ("smol",))
#: the lab LLM's lengths: 50 prompt and 24 output tokens a request
PROMPT, OUTPUT = 50.0, 24.0


def samples(
    rate: float, n: int = 6, ttft: float | None = 300.0, tpot: float | None = 25.0
) -> tuple[ModelSample, ...]:
    return tuple(
        ModelSample(
            T0 - (n - 1 - i) * TICK,
            None,
            rate,
            0.0,
            None,
            ttft_p99_ms=ttft,
            tpot_p99_ms=tpot,
            prompt_tps=PROMPT * rate,
            output_tps=OUTPUT * rate,
        )
        for i in range(n)
    )


def snap(
    history: tuple[ModelSample, ...],
    replicas: tuple[ReplicaView, ...] = (BASELINE,),
    leases: tuple[LeaseView, ...] = (),
    profiled: bool = True,
) -> Snapshot:
    return Snapshot(
        (RESERVED, *ELASTIC),
        replicas,
        {"smol": history},
        leases,
        models={"smol": SMOL},
        token_profiles={"smol": SMOL_LAB} if profiled else {},
    )


def lends(snapshot: Snapshot) -> list[Lend]:
    return [a for a in policy_decide(snapshot, CONFIG, T0) if isinstance(a, Lend)]


def test_an_llm_short_of_the_replicas_its_tokens_need_gets_a_node_for_each() -> None:
    rate = 3.0
    need = llm.need(SMOL, SMOL_LAB, samples(rate)[-1], rate)
    assert need is not None and need >= 3  # (a replica carries about one request a second)
    got = lends(snap(samples(rate)))
    assert len(got) == need - 1  # the baseline holds one
    assert all(a.models == ("smol",) and a.reason.startswith("capacity") for a in got)


def test_an_llm_within_its_need_lends_nothing_and_a_lend_in_flight_counts() -> None:
    assert lends(snap(samples(0.5))) == []
    rate = 3.0
    need = llm.need(SMOL, SMOL_LAB, samples(rate)[-1], rate)
    assert need is not None
    in_flight = LeaseView(1, "n3", "elastic", "preempt", "starting", ("smol",), T0 - 10, None)
    assert len(lends(snap(samples(rate), leases=(in_flight,)))) == need - 2


def test_without_a_profile_only_a_measured_breach_lends_through_the_backstop() -> None:
    assert lends(snap(samples(3.0), profiled=False)) == []  # no profile: no capacity lend
    (lend,) = lends(snap(samples(3.0, ttft=2600.0), profiled=False))
    assert lend.models == ("smol",)
    assert "TTFT p99 2600 ms" in lend.reason and "2000" in lend.reason


def test_an_llm_breaches_and_calms_on_its_token_p99s() -> None:
    assert evaluate_model(samples(1.0, ttft=2600.0), SMOL, CONFIG) == ModelStatus.BREACH
    assert evaluate_model(samples(1.0, tpot=200.0), SMOL, CONFIG) == ModelStatus.BREACH
    # one tick under the high watermark breaks the run
    run = (*samples(1.0, ttft=2600.0)[:-1], samples(1.0)[-1])
    assert evaluate_model(run, SMOL, CONFIG) != ModelStatus.BREACH
    assert evaluate_model(samples(1.0), SMOL, CONFIG) == ModelStatus.CALM
    # over the low watermark (default 0.5 x SLO) is not calm
    assert evaluate_model(samples(1.0, ttft=1500.0), SMOL, CONFIG) == ModelStatus.STEADY


def test_a_lent_llm_replica_goes_back_only_when_the_rest_carry_its_tokens() -> None:
    lent = LeaseView(7, "n3", "elastic", "preempt", "serving", ("smol",), T0 - 900, T0 - 800)
    replicas = (BASELINE, ReplicaView("n3", ("smol",), lease_id=7))
    rate = 1.5
    need = llm.need(SMOL, SMOL_LAB, samples(rate)[-1], rate)
    assert need == 2  # both replicas are needed: calm, yet not returned
    actions = policy_decide(snap(samples(rate), replicas, (lent,)), CONFIG, T0)
    assert not any(isinstance(a, Return) for a in actions)
    # the load fell: one replica carries it, the lent one goes back
    actions = policy_decide(snap(samples(0.3), replicas, (lent,)), CONFIG, T0)
    assert [a.lease_id for a in actions if isinstance(a, Return)] == [7]


def test_no_need_is_known_without_token_rates_or_for_an_unmeetable_slo() -> None:
    bare = ModelSample(T0, None, 2.0, 0.0, None)
    assert llm.need(SMOL, SMOL_LAB, bare, 2.0) is None
    tight = SMOL.model_copy(update={"slo_tpot_p99_ms": 10.0})  # under 16 ms a token alone
    assert llm.need(tight, SMOL_LAB, samples(2.0)[-1], 2.0) is None


#: a heavy tail: most prompts 50 tokens, the longest two about 400 (their prefill alone is
#: SMOL_LAB's 0.11 + 0.0042 x 400 = 1.79 s of the 2 s TTFT objective)
TAILED = (50.0,) * 99 + (400.0, 420.0)


def with_lengths(history: tuple[ModelSample, ...]) -> tuple[ModelSample, ...]:
    return tuple(
        dataclasses.replace(s, prompt_lengths=TAILED, output_lengths=(OUTPUT,)) for s in history
    )


def test_the_length_distribution_sizes_an_llm_where_the_sample_has_it() -> None:
    rate = 1.0
    plain = samples(rate)[-1]
    tailed = with_lengths(samples(rate))[-1]
    demand = llm.token_demand(tailed, 2 * rate)
    assert demand is not None and demand.prompt_tokens == TAILED and demand.rate == 2 * rate
    mean_only = llm.token_demand(plain, 2 * rate)
    assert mean_only is not None and mean_only.prompt_tokens == (PROMPT,)
    # the tail's prefill leaves little of the TTFT objective to wait in: more replicas
    need_tailed = llm.need(SMOL, SMOL_LAB, tailed, rate)
    need_plain = llm.need(SMOL, SMOL_LAB, plain, rate)
    assert need_tailed is not None and need_plain is not None and need_tailed > need_plain


def test_a_profiled_llm_is_calm_by_the_part_of_its_p99s_over_their_no_load_floors() -> None:
    ttft_floor, tpot_floor = llm.floors_ms(SMOL_LAB, with_lengths(samples(1.0))[-1])
    assert ttft_floor is not None and abs(ttft_floor - (0.11 + 0.0042 * 400) * 1000) < 1e-6
    assert tpot_floor == SMOL_LAB.tpot_s[0] * 1000
    near = with_lengths(samples(1.0, ttft=1850.0))  # 1850 / 2000 > low: not calm by the p99
    assert evaluate_model(near, SMOL, CONFIG) == ModelStatus.STEADY
    # over its floor by (1850 - 1790) / (2000 - 1790) = 0.29 of the room: calm
    assert evaluate_model(near, SMOL, CONFIG, SMOL_LAB) == ModelStatus.CALM
    # 0.76 of the room: load is using it, not calm
    busy = with_lengths(samples(1.0, ttft=1950.0))
    assert evaluate_model(busy, SMOL, CONFIG, SMOL_LAB) == ModelStatus.STEADY
    # the TPOT read the same way: 100 ms of a 150 ms objective, (100 - 16) / 134 = 0.63
    slow = with_lengths(samples(1.0, ttft=300.0, tpot=100.0))
    assert evaluate_model(slow, SMOL, CONFIG, SMOL_LAB) == ModelStatus.STEADY
    # a breach is still the p99 over the objective itself
    assert evaluate_model(with_lengths(samples(1.0, ttft=2100.0)), SMOL, CONFIG, SMOL_LAB) == (
        ModelStatus.BREACH
    )
