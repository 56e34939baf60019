"""The lease transition table: every legal edge accepted, every other pair refused."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from bridge.leases.errors import IllegalTransition
from bridge.leases.states import (
    OPEN_STATES,
    TRANSITIONS,
    LeaseState,
    check_transition,
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
    check_transition(old, new)


@pytest.mark.parametrize(("old", "new"), [p for p in ALL_PAIRS if p not in LEGAL])
def test_illegal_pair_refused_naming_both_states(old: LeaseState, new: LeaseState) -> None:
    with pytest.raises(IllegalTransition) as err:
        check_transition(old, new, lease_id=7)
    assert (err.value.old, err.value.new, err.value.lease_id) == (old.value, new.value, 7)
    assert f"{old.value} -> {new.value}" in str(err.value)
    assert "lease 7" in str(err.value)


def test_only_returned_is_final_and_it_is_frozen() -> None:
    assert [s for s in LeaseState if is_final(s)] == [S.RETURNED]
    assert set(LeaseState) - {S.RETURNED} == OPEN_STATES
    for new in LeaseState:
        with pytest.raises(IllegalTransition):
            check_transition(S.RETURNED, new)


def test_every_open_state_can_fail_and_every_state_reaches_returned() -> None:
    for state in OPEN_STATES - {S.FAILED}:
        check_transition(state, S.FAILED)
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


def test_states_module_imports_no_sql() -> None:
    code = (
        "import sys, bridge.leases.states; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'sqlmodel')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
