"""The rollout's pure policy (`bridge.policy.rollout`): step plans are parsed or refused
by name, and the verdict holds on too little evidence, rolls back a version that fails
more, breaks the SLO or is slower than the old one, and advances only after the hold."""

from __future__ import annotations

import pytest

from bridge.policy.rollout import (
    PlanError,
    Step,
    VersionFigures,
    judge,
    parse_plan,
)

OLD = VersionFigures(requests=2_000, failures=0, p99_ms=40.0)
STEP = Step(10.0, 300.0)


def test_plans() -> None:
    assert parse_plan("10%", 300) == (Step(10, 300), Step(100, 0))
    assert parse_plan("10%:5m, 50%:30s,100%", 60) == (Step(10, 300), Step(50, 30), Step(100, 60))
    assert parse_plan("2.5%:1h", 0) == (Step(2.5, 3600), Step(100, 0))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty step plan"),
        ("10", r"step 1 '10': not a share"),
        ("10%,5%", r"step 2 '5%': shares must rise"),
        ("0%", "over 0% and at most 100%"),
        ("150%", "over 0% and at most 100%"),
        ("100%,100%", "shares must rise"),
        ("10%:5d", "not a share"),
    ],
)
def test_bad_plans_say_which_step(text: str, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        parse_plan(text, 60)


def test_too_few_requests_hold() -> None:
    v = judge(VersionFigures(150, 100, 900.0), OLD, 100, held_s=999, step=STEP)
    assert v.verdict == "hold" and "150 of 200 requests" in v.why


def test_a_version_that_fails_more_is_rolled_back() -> None:
    v = judge(VersionFigures(300, 6, 40.0), OLD, 100, held_s=0, step=STEP)
    assert v.verdict == "rollback" and "fails 2.00% of 300" in v.why
    # one failure in 300 against none in 2,000 is within chance: not a rollback
    assert judge(VersionFigures(300, 1, 40.0), OLD, 100, 999, STEP).verdict == "advance"
    # the same rate as the old version's is no worse
    old = VersionFigures(2_000, 40, 40.0)
    assert judge(VersionFigures(300, 6, 40.0), old, 100, 999, STEP).verdict == "advance"


def test_a_version_over_the_slo_or_slower_is_rolled_back() -> None:
    v = judge(VersionFigures(300, 0, 140.0), OLD, 100, 0, STEP)
    assert v.verdict == "rollback" and "p99 140 ms over the SLO 100 ms" in v.why
    v = judge(VersionFigures(300, 0, 60.0), OLD, 100, 0, STEP)
    assert v.verdict == "rollback" and "more than 25% slower" in v.why
    # within the margin (or the absolute floor for fast models): not slower
    assert judge(VersionFigures(300, 0, 48.0), OLD, 100, 999, STEP).verdict == "advance"
    fast = VersionFigures(2_000, 0, 4.0)
    assert judge(VersionFigures(300, 0, 8.0), fast, 100, 999, STEP).verdict == "advance"
    # over the SLO when the old version is over it too: judged by the comparison alone
    slow_old = VersionFigures(2_000, 0, 130.0)
    assert judge(VersionFigures(300, 0, 135.0), slow_old, 100, 999, STEP).verdict == "advance"


def test_a_good_version_advances_after_the_hold() -> None:
    good = VersionFigures(300, 0, 41.0)
    v = judge(good, OLD, 100, held_s=120, step=STEP)
    assert v.verdict == "hold" and "120 of 300 s at 10%" in v.why
    v = judge(good, OLD, 100, held_s=300, step=STEP)
    assert v.verdict == "advance" and "300 requests at 10%" in v.why
