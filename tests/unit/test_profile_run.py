"""The pure parts of `stb models profile`'s run (bridge/models/profile_run.py): the plan of
concurrencies and prompt lengths, turning stream records into profile points, and one
replica's capacity at the SLOs."""

from __future__ import annotations

from collections import Counter

import pytest

from bridge.load.streams import StreamRecord
from bridge.models.profile_run import (
    MAX_REQUESTS,
    ProfileRunError,
    capacity,
    endpoint,
    make_plan,
    points_of,
)
from bridge.policy.tokens import SMOL_LAB, TokenDemand, predict


def _record(
    index: int,
    *,
    sent: float = 0.0,
    first: float | None = 0.3,
    last: float | None = 0.3 + 0.02 * 15,
    tokens: int = 16,
    prompt: int = 40,
    counted: int | None = None,
    outcome: str = "ok",
    error: str | None = None,
    status: int | None = 200,
) -> StreamRecord:
    return StreamRecord(
        index=index, endpoint="127.0.0.1:8000", scheduled_s=sent, sent_s=sent, first_s=first,
        last_s=last, done_s=last, tokens=tokens, prompt_target=prompt, output_target=16,
        outcome=outcome, error=error, status=status, prompt_counted=counted,
    )  # fmt: skip


def test_plan_levels_cover_every_prompt_length_and_never_exceed_the_slots() -> None:
    plan = make_plan(2, requests=12, prompt_tokens=(40, 120, 240), output_tokens=32)
    assert {b.concurrency for b in plan.batches} == {1, 2}
    assert all(len(b.lengths) == b.concurrency for b in plan.batches)
    per_level = Counter()
    lengths_at: dict[int, set[int]] = {}
    for b in plan.batches:
        per_level[b.concurrency] += len(b.lengths)
        lengths_at.setdefault(b.concurrency, set()).update(p for p, _ in b.lengths)
        assert all(o == 32 for _, o in b.lengths)
    assert per_level == {1: 6, 2: 6}
    assert lengths_at == {1: {40, 120, 240}, 2: {40, 120, 240}}
    assert plan.streams == 12
    # concurrency 1 first: its TTFTs set the prefill before the shared levels
    assert plan.batches[0].concurrency == 1


def test_plan_rounds_a_level_up_to_whole_batches() -> None:
    plan = make_plan(3, requests=9, prompt_tokens=(40, 120, 240))
    sizes = Counter(b.concurrency for b in plan.batches)
    assert sizes == {1: 3, 2: 2, 3: 1}  # 3 streams each level, level 2 rounded up to 4
    assert plan.streams == 3 + 4 + 3


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"sequences": 0}, "sequences"),
        ({"sequences": 2, "requests": 5}, "--requests must be in 6..200"),
        ({"sequences": 2, "requests": MAX_REQUESTS + 1}, "--requests"),
        ({"sequences": 1, "prompt_tokens": (40,)}, "prompt lengths"),
        ({"sequences": 1, "prompt_tokens": (40, 40, 40)}, "prompt lengths"),
        ({"sequences": 1, "prompt_tokens": (0, 40, 80)}, "prompt lengths"),
        ({"sequences": 1, "output_tokens": 1}, "output tokens"),
    ],
)
def test_plan_refuses_what_cannot_be_fitted(kwargs: dict, words: str) -> None:
    with pytest.raises(ProfileRunError, match=words):
        make_plan(**kwargs)


def test_points_take_ttft_from_the_send_and_the_mean_token_gap() -> None:
    recs = [
        _record(0, sent=1.0, first=1.25, last=1.25 + 0.02 * 15, prompt=40),
        _record(1, sent=1.25, first=2.0, last=2.0 + 0.03 * 15, prompt=120, counted=118),
        _record(2, first=0.2, last=0.2, tokens=1),  # ended after one token: no TPOT
    ]
    pts = points_of(recs, 2)
    assert [p.concurrency for p in pts] == [2, 2]
    assert pts[0].ttft_s == pytest.approx(0.25)
    assert pts[0].tpot_s == pytest.approx(0.02)
    assert pts[0].prompt_tokens == 40
    assert pts[1].ttft_s == pytest.approx(0.75)
    assert pts[1].tpot_s == pytest.approx(0.03)
    assert pts[1].prompt_tokens == 118  # the server's own count wins over the target


def test_a_stream_that_did_not_end_well_fails_the_batch() -> None:
    recs = [_record(0), _record(1, outcome="failed", error="http_503", status=503, first=None)]
    with pytest.raises(ProfileRunError, match=r"stream 1 .* failed: http_503 \(HTTP 503\)"):
        points_of(recs, 2)
    with pytest.raises(ProfileRunError, match="broken: cut"):
        points_of([_record(0, outcome="broken", error="cut")], 1)


def test_capacity_is_the_highest_rate_within_both_slos() -> None:
    prompts, outputs = [40.0, 120.0], [32.0, 32.0]
    cap = capacity(SMOL_LAB, prompts, outputs, 2.0, 0.15)
    assert cap.reason is None and cap.rate > 0
    assert cap.output_tps == pytest.approx(cap.rate * 32)
    demand = TokenDemand.of(1.0, prompts, outputs)
    assert predict(SMOL_LAB, demand.scaled(cap.rate), 1).within(2.0, 0.15)
    assert not predict(SMOL_LAB, demand.scaled(cap.rate * 1.01), 1).within(2.0, 0.15)
    # a looser TTFT SLO carries more; a TPOT SLO alone still binds near saturation
    assert capacity(SMOL_LAB, prompts, outputs, 4.0, 0.15).rate > cap.rate
    assert capacity(SMOL_LAB, prompts, outputs, None, 0.15).rate > 0


def test_capacity_says_why_no_load_meets_the_slos() -> None:
    cap = capacity(SMOL_LAB, [600.0], [32.0], 2.0, 0.15)  # 0.11 + 2.52 s prefill alone
    assert cap.rate == 0 and cap.reason is not None and "prefill alone" in cap.reason
    cap = capacity(SMOL_LAB, [40.0], [32.0], 2.0, 0.010)
    assert cap.rate == 0 and cap.reason is not None and "TPOT SLO" in cap.reason


def test_endpoint_is_loopback_only() -> None:
    assert str(endpoint("127.0.1.4:8000")) == "127.0.1.4:8000"
    with pytest.raises(ProfileRunError, match="not a loopback address"):
        endpoint("10.1.2.3:8000")
