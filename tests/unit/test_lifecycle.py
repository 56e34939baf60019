"""The lease lifecycle (`bridge.lifecycle`): every legal edge accepted, every other pair
refused by `check` with an `IllegalMove` naming both states; the module imports nothing
from bridge and no SQL. The store's own refusal (`IllegalTransition`) is tested in
tests/db/test_lease_store.py."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from bridge.lifecycle import (
    IN_FLIGHT,
    OPEN_STATES,
    TRANSITIONS,
    IllegalMove,
    LeaseState,
    allowed,
    check,
    is_final,
)

S = LeaseState

# Written out here, not derived from TRANSITIONS, so a change to the table must be made twice.
LEGAL = {
    (S.REQUESTED, S.SUBMITTED),
    (S.REQUESTED, S.RETURNED),  # abandoned before submission
    (S.REQUESTED, S.FAILED),
    (S.SUBMITTED, S.STARTING),
    (S.SUBMITTED, S.RELEASING),  # abandoned while the job pends
    (S.SUBMITTED, S.FAILED),
    (S.STARTING, S.SERVING),
    (S.STARTING, S.RELEASING),  # given back before it ever served
    (S.STARTING, S.FAILED),
    (S.SERVING, S.DRAINING),
    (S.SERVING, S.FAILED),
    (S.DRAINING, S.RELEASING),
    (S.DRAINING, S.FAILED),
    (S.RELEASING, S.RETURNED),
    (S.RELEASING, S.FAILED),
    (S.FAILED, S.RETURNED),
}
ALL_PAIRS = list(itertools.product(LeaseState, repeat=2))


def test_table_is_exactly_the_documented_edges() -> None:
    assert {(old, new) for old, news in TRANSITIONS.items() for new in news} == LEGAL
    assert set(TRANSITIONS) == set(LeaseState)


@pytest.mark.parametrize(("old", "new"), sorted(LEGAL))
def test_legal_edge_accepted(old: LeaseState, new: LeaseState) -> None:
    assert allowed(old, new)
    check(old, new)
    check(old.value, new.value)  # type: ignore[arg-type]  # plain strings name states too


@pytest.mark.parametrize(("old", "new"), [p for p in ALL_PAIRS if p not in LEGAL])
def test_illegal_pair_refused_naming_both_states(old: LeaseState, new: LeaseState) -> None:
    assert not allowed(old, new)
    with pytest.raises(IllegalMove) as err:
        check(old, new, lease_id=7)
    assert (err.value.old, err.value.new, err.value.lease_id) == (old, new, 7)
    assert str(err.value) == f"lease 7: illegal lease move {old.value} -> {new.value}"


def test_illegal_move_is_a_value_error_and_names_no_lease_unless_given() -> None:
    with pytest.raises(ValueError, match=r"^illegal lease move serving -> starting$"):
        check(S.SERVING, S.STARTING)


def test_an_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="'serveing' is not a valid LeaseState"):
        allowed(S.STARTING, "serveing")  # type: ignore[arg-type]


def test_in_flight_is_on_its_way_to_serving() -> None:
    assert {S.REQUESTED, S.SUBMITTED, S.STARTING} == IN_FLIGHT
    assert IN_FLIGHT < OPEN_STATES
    # each reaches serving along the table without passing through another state
    reach = {S.SERVING}
    for state in (S.STARTING, S.SUBMITTED, S.REQUESTED):
        assert TRANSITIONS[state] & reach, state
        reach.add(state)
    # a StrEnum: the policy's callers may compare with plain strings
    assert "submitted" in IN_FLIGHT and "serving" not in IN_FLIGHT


def test_only_returned_is_final_and_it_is_frozen() -> None:
    assert [s for s in LeaseState if is_final(s)] == [S.RETURNED]
    assert set(LeaseState) - {S.RETURNED} == OPEN_STATES
    for new in LeaseState:
        with pytest.raises(IllegalMove):
            check(S.RETURNED, new)


def test_every_open_state_can_fail_and_every_state_reaches_returned() -> None:
    for state in OPEN_STATES - {S.FAILED}:
        check(state, S.FAILED)
    reachable = {S.RETURNED}
    changed = True
    while changed:
        before = len(reachable)
        reachable |= {s for s, news in TRANSITIONS.items() if news & reachable}
        changed = len(reachable) != before
    assert reachable == set(LeaseState)


def test_moves_only_forward_except_into_failed_and_out_of_it() -> None:
    order = [S.REQUESTED, S.SUBMITTED, S.STARTING, S.SERVING, S.DRAINING, S.RELEASING]
    order.append(S.RETURNED)
    for old, new in LEGAL:
        if S.FAILED not in (old, new):
            assert order.index(new) > order.index(old), (old, new)


def test_lifecycle_imports_nothing_from_bridge_and_no_sql() -> None:
    code = (
        "import sys, bridge.lifecycle; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('bridge', 'accounting', 'sqlalchemy', 'sqlmodel')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['bridge', 'bridge.lifecycle']"
