"""The token capacity model (bridge.policy.tokens) on literal profiles: monotone in rate,
more replicas never worse, the SLO boundary, infeasible SLOs, the fit, bad input."""

from __future__ import annotations

import itertools
import math

import pytest

from bridge.policy.tokenfit import ProfilePoint, calibrate, fit_profile
from bridge.policy.tokens import (
    SMOL_LAB,
    InfeasibleSLO,
    TokenDemand,
    TokenProfile,
    busy_cdf,
    infeasible,
    predict,
    replicas_needed,
    tpot_within,
    ttft_within,
)

#: 4 sequences at once, 1 ms per prompt token, 50 ms fixed, 10..16 ms per token
PROFILE = TokenProfile(
    sequences=4,
    prefill_s_per_token=0.001,
    prefill_overhead_s=0.05,
    tpot_s=(0.010, 0.012, 0.014, 0.016),
)
LENGTHS = dict(prompt_tokens=(100.0, 200.0, 400.0, 800.0), output_tokens=(50.0, 100.0, 200.0))


def demand(rate: float) -> TokenDemand:
    return TokenDemand(rate, **LENGTHS)  # type: ignore[arg-type]


def test_alone_the_prediction_is_the_profile() -> None:
    p = predict(PROFILE, demand(1e-6), 1)
    assert p.stable
    assert p.tpot_p99_s == pytest.approx(0.010)
    # the p99 prompt (800) at one sequence: 50 ms + 800 ms
    assert p.ttft_p99_s == pytest.approx(0.85, rel=1e-3)


def test_monotone_in_rate() -> None:
    last = None
    for rate in (0.5, 1, 2, 4, 6, 8, 9):
        p = predict(PROFILE, demand(rate), 3)
        if last is not None:
            assert p.ttft_p99_s >= last.ttft_p99_s
            assert p.tpot_p99_s >= last.tpot_p99_s
            assert p.utilisation > last.utilisation
        last = p
    assert last is not None and last.ttft_p99_s > 0.85


def test_more_replicas_never_worse() -> None:
    d = demand(8.0)
    preds = [predict(PROFILE, d, r) for r in range(1, 12)]
    assert not preds[0].stable and math.isinf(preds[0].ttft_p99_s)
    for a, b in itertools.pairwise(preds):
        assert b.ttft_p99_s <= a.ttft_p99_s
        assert b.tpot_p99_s <= a.tpot_p99_s
    assert preds[-1].stable


def test_replicas_needed_is_the_slo_boundary() -> None:
    d = demand(8.0)
    slo_ttft, slo_tpot = 1.5, 0.016
    n = replicas_needed(PROFILE, d, slo_ttft, slo_tpot)
    assert predict(PROFILE, d, n).within(slo_ttft, slo_tpot)
    assert not predict(PROFILE, d, n - 1).within(slo_ttft, slo_tpot)
    # headroom asks for at least as many, and the same count carries the scaled rate
    m = replicas_needed(PROFILE, d, slo_ttft, slo_tpot, headroom=1.5)
    assert m > n
    assert predict(PROFILE, d.scaled(1.5), m).within(slo_ttft, slo_tpot)


def test_a_tight_tpot_slo_needs_idle_replicas() -> None:
    # a TPOT SLO at two sequences' pace: the 99th request must run beside at most one other
    d = demand(2.0)
    loose = replicas_needed(PROFILE, d, 5.0, 0.016)
    tight = replicas_needed(PROFILE, d, 5.0, 0.012)
    assert tight > loose
    p = predict(PROFILE, d, tight)
    assert p.tpot_p99_s <= 0.012 and busy_cdf(4, p.utilisation * 4)[1] >= 0.99


def test_no_requests_need_no_replicas() -> None:
    assert replicas_needed(PROFILE, demand(0.0), 1.0, 0.02) == 0


def test_infeasible_slo_is_a_clear_answer() -> None:
    with pytest.raises(InfeasibleSLO, match=r"TPOT SLO 8\.0 ms .* 10\.0 ms per token"):
        replicas_needed(PROFILE, demand(1.0), 5.0, 0.008)
    with pytest.raises(InfeasibleSLO, match=r"TTFT SLO 500 ms .* p99 prefill alone"):
        replicas_needed(PROFILE, demand(1.0), 0.5, 0.02)
    assert infeasible(PROFILE, demand(1.0), 5.0, 0.02) is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(sequences=0), "sequences must be an integer >= 1"),
        (dict(tpot_s=(0.01,)), "tpot_s needs one entry per sequence"),
        (dict(tpot_s=(0.02, 0.01, 0.03, 0.04)), "non-decreasing"),
        (dict(prefill_s_per_token=-1.0), "prefill_s_per_token must be"),
        (dict(prefix_hit=1.0), "prefix_hit must be in"),
        (dict(tpot_s=(0.01, math.nan, 0.02, 0.03)), r"tpot_s\[1\] must be"),
    ],
)
def test_bad_profile_names_the_field(kwargs: dict[str, object], words: str) -> None:
    base: dict[str, object] = dict(
        sequences=4, prefill_s_per_token=0.001, prefill_overhead_s=0.05, tpot_s=PROFILE.tpot_s
    )
    base.update(kwargs)
    with pytest.raises(ValueError, match=words):
        TokenProfile(**base)  # type: ignore[arg-type]


def test_bad_demand_and_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="rate must be"):
        TokenDemand(-1.0, (1.0,), (1.0,))
    with pytest.raises(ValueError, match="prompt_tokens needs at least one length"):
        TokenDemand(1.0, (), (1.0,))
    with pytest.raises(ValueError, match="replicas must be an integer >= 0"):
        predict(PROFILE, demand(1.0), -1)
    with pytest.raises(ValueError, match="slo_tpot_s must be a positive"):
        replicas_needed(PROFILE, demand(1.0), 1.0, 0.0)
    with pytest.raises(ValueError, match="headroom must be a positive"):
        replicas_needed(PROFILE, demand(1.0), 1.0, 0.02, headroom=0)
    with pytest.raises(ValueError, match="needs at least one measured point"):
        fit_profile([])


def test_offered_load_in_tokens() -> None:
    d = TokenDemand.from_rates(4.0, prompt_tps=2000.0, output_tps=400.0)
    assert d.mean_prompt == 500.0 and d.mean_output == 100.0
    assert d.prompt_tps == 2000.0 and d.output_tps == 400.0
    sampled = TokenDemand.of(2.0, range(1000), [10] * 5, points=11)
    assert len(sampled.prompt_tokens) == 11 and sampled.prompt_tokens[-1] == 999.0


def test_prefix_cache_discounts_prefill() -> None:
    cached = TokenProfile(4, 0.001, 0.05, PROFILE.tpot_s, prefix_hit=0.5)
    assert cached.prefill(800) == pytest.approx(0.45)
    assert predict(cached, demand(4.0), 4).ttft_p99_s < predict(PROFILE, demand(4.0), 4).ttft_p99_s


def test_fit_recovers_a_profile() -> None:
    points = [
        ProfilePoint(n, prompt, (0.05 + 0.001 * prompt) * PROFILE.tpot_s[n - 1] / 0.010, tpot)
        for n, tpot in ((1, 0.010), (2, 0.012), (4, 0.016))
        for prompt in (100, 400, 900)
    ]
    fitted = fit_profile(points)
    assert fitted.sequences == 4
    assert fitted.tpot_s == pytest.approx((0.010, 0.012, 0.014, 0.016))
    assert fitted.prefill_s_per_token == pytest.approx(0.001)
    assert fitted.prefill_overhead_s == pytest.approx(0.05)


def test_shares_within_agree_with_the_p99s() -> None:
    d = demand(6.0)
    p = predict(PROFILE, d, 5)
    assert p.stable and p.tpot_p99_s > PROFILE.tpot_s[0]
    a = p.utilisation * PROFILE.sequences
    # at the predicted TPOT p99, at least 99% of requests are within; just under it, fewer
    assert tpot_within(PROFILE, a, p.tpot_p99_s) >= 0.99
    assert tpot_within(PROFILE, a, p.tpot_p99_s - 1e-6) < 0.99
    assert tpot_within(PROFILE, a, 0.05, backlog=True) == 1.0
    assert tpot_within(PROFILE, a, 0.011, backlog=True) == 0.0
    # no wait: the share of prefills within the budget
    assert ttft_within([0.1, 0.2, 0.3, 0.4], 0.0, math.inf, 0.25) == pytest.approx(0.5)
    # a backlog delay uniform on [0, 1] s with prefills of 0: the budget's share of it
    assert ttft_within([0.0], 0.0, math.inf, 0.25, 0.0, 1.0) == pytest.approx(0.25)


def test_the_lab_profile_says_its_figures() -> None:
    # ../shared/DESIGN.md: ~130 ms first token for a short prompt, ~2.2 s for ~500 tokens
    assert SMOL_LAB.prefill(5) == pytest.approx(0.13, abs=0.01)
    assert SMOL_LAB.prefill(500) == pytest.approx(2.2, abs=0.1)
    assert SMOL_LAB.tpot(1) == 0.016 and SMOL_LAB.tpot(2) == 0.022


def test_the_tpot_tail_of_the_profile_raises_the_predicted_tpot_p99_not_the_service() -> None:
    from bridge.policy.tokens import mean_service

    even = [ProfilePoint(n, 50.0, 0.3, 0.02 * n) for n in (1, 2) for _ in range(5)]
    # at two sequences one stream in five decodes beside a prefill: twice as slow
    spread = [*even[:5], *(ProfilePoint(2, 50.0, 0.3, 0.04) for _ in range(4))]
    spread.append(ProfilePoint(2, 50.0, 0.3, 0.08))
    flat, tailed = fit_profile(even), fit_profile(spread)
    assert flat.tpot_spread == pytest.approx(1.0)
    assert tailed.tpot_s == flat.tpot_s  # the table keeps the typical TPOT
    assert tailed.tpot_spread == pytest.approx(2.0, rel=0.05)
    demand = TokenDemand(1.0, (50.0,), (20.0,))
    a, b = predict(flat, demand, 1), predict(tailed, demand, 1)
    assert b.tpot_p99_s == pytest.approx(a.tpot_p99_s * tailed.tpot_spread)
    assert mean_service(tailed, demand, 1.5) == pytest.approx(mean_service(flat, demand, 1.5))
    with pytest.raises(ValueError, match="tpot_spread must be >= 1"):
        TokenProfile(1, 0.0, 0.1, (0.02,), 0.0, 0.5)


def test_the_ttft_quantile_with_a_rare_wait_is_the_mixture_s_own() -> None:
    from bridge.policy.tokens import _ttft_quantile

    # 101 prefills, a wait one time in 270: the p99 lies among the prefills' own tail
    prefills = [5.0 + 3.0 * k / 100 for k in range(101)]
    wait_p, tail = 0.0037, 0.5
    got = _ttft_quantile(prefills, wait_p, tail)

    def exceed(t: float) -> float:
        return sum(1.0 if t < p else wait_p * math.exp(-tail * (t - p)) for p in prefills) / 101

    assert exceed(got) <= 0.01 + 1e-9
    assert exceed(got - 0.01) > 0.01  # the smallest such time, not a bound above it


def test_a_prefill_line_below_the_origin_is_fitted_through_it() -> None:
    # TTFT = -0.05 + 0.002 x prompt: the least-squares intercept is negative
    points = [ProfilePoint(1, p, -0.05 + 0.002 * p, 0.010) for p in (100, 200, 400)]
    fitted = fit_profile(points)
    assert fitted.prefill_overhead_s == 0.0
    xs = [100.0, 200.0, 400.0]
    through = sum(x * (-0.05 + 0.002 * x) for x in xs) / sum(x * x for x in xs)
    assert fitted.prefill_s_per_token == pytest.approx(through)
    # the fit stays among the points, not above every one of them (cutting the intercept
    # at 0 and keeping the slope 0.002 would put each 0.05 s above its point)
    residuals = [fitted.prefill(x) - (-0.05 + 0.002 * x) for x in xs]
    assert min(residuals) < 0 < max(residuals)


def _measured_means(truth: TokenProfile, d: TokenDemand) -> tuple[float, float]:
    """The replica's own means had it run as `truth`: its TTFT clock (the prefill at the
    load's mean concurrency) and its token gap there."""
    from bridge.policy.tokens import concurrency

    n, _ = concurrency(truth, d.rate, d)
    pre = sum(truth.prefill(p) for p in d.prompt_tokens) / len(d.prompt_tokens)
    return truth.slowdown(n) * pre, truth.tpot(n)


def test_calibrate_recovers_a_replica_that_runs_slower_than_its_profile() -> None:
    truth = TokenProfile(
        sequences=4,
        prefill_s_per_token=0.0012,
        prefill_overhead_s=0.06,
        tpot_s=tuple(t * 1.15 for t in PROFILE.tpot_s),
    )
    d = demand(1.2)  # the truth's slots 3/4 busy
    ttft, tpot = _measured_means(truth, d)
    got = calibrate(PROFILE, d, ttft, tpot)
    assert got.tpot_s == pytest.approx(truth.tpot_s, rel=1e-3)
    assert got.prefill(300.0) == pytest.approx(truth.prefill(300.0), rel=1e-3)
    # and so its prediction is the truth's, where the profile's is not
    want = predict(truth, d, 1).ttft_p99_s
    assert predict(got, d, 1).ttft_p99_s == pytest.approx(want, rel=1e-3)
    assert predict(PROFILE, d, 1).ttft_p99_s < 0.9 * want


def test_calibrate_leaves_what_it_has_no_figure_for() -> None:
    d = demand(3.0)
    assert calibrate(PROFILE, d, None, None) == PROFILE
    assert calibrate(PROFILE, TokenDemand(0.0, **LENGTHS), 0.5, 0.05) == PROFILE  # type: ignore[arg-type]
    only_decode = calibrate(PROFILE, d, None, 2 * PROFILE.tpot_s[0])
    assert only_decode.prefill_s_per_token == PROFILE.prefill_s_per_token
    assert only_decode.tpot_s[0] > PROFILE.tpot_s[0]
    # a broken reading (a thousand times the profile) moves it only so far
    wild = calibrate(PROFILE, d, 1000.0, 1000.0)
    assert wild.tpot_s[0] == pytest.approx(3.0 * PROFILE.tpot_s[0])
    assert wild.prefill_overhead_s == pytest.approx(3.0 * PROFILE.prefill_overhead_s)
