"""Typed lease errors, raised by `store.LeaseStore` (an illegal move against
`bridge.lifecycle.TRANSITIONS` is an `IllegalTransition`).

Every one is permanent for the call that raised it: retrying the same call gives the same
answer. Callers (the reconciler, the operator CLI) decide from the type, never from the text.
"""

from __future__ import annotations


class LeaseError(RuntimeError):
    """Base of every error the lease package raises."""


class IllegalTransition(LeaseError):
    """A status change the transition table does not allow; names both states."""

    def __init__(self, old: str, new: str, *, lease_id: int | None = None) -> None:
        where = f"lease {lease_id}: " if lease_id is not None else ""
        super().__init__(f"{where}illegal lease transition {old} -> {new}")
        self.old = old
        self.new = new
        self.lease_id = lease_id


class UnexpectedState(IllegalTransition):
    """The caller asked for `expected -> new` but another writer had already moved the
    lease to `found`: the caller's decision is stale, so nothing is written."""

    def __init__(self, lease_id: int, expected: str, found: str, new: str) -> None:
        LeaseError.__init__(
            self,
            f"lease {lease_id}: expected state {expected}, found {found}; "
            f"refusing {found} -> {new}",
        )
        self.old = found
        self.new = new
        self.lease_id = lease_id
        self.expected = expected


class LeaseNotFound(LeaseError):
    def __init__(self, lease_id: int) -> None:
        super().__init__(f"no lease with id {lease_id}")
        self.lease_id = lease_id


class NodeAlreadyLeased(LeaseError):
    """A second lend of a node that still has an open (not returned) lease."""

    def __init__(self, node: str, lease_id: int, state: str) -> None:
        super().__init__(
            f"node {node} already has open lease {lease_id} (state {state}); "
            "it must be returned before the node is lent again"
        )
        self.node = node
        self.lease_id = lease_id
        self.state = state


class RequestKeyConflict(LeaseError):
    """A request key reused for a different lend (another node, pool or mode): a caller
    bug, since the key names one intent."""

    def __init__(self, request_key: str, lease_id: int, what: str) -> None:
        super().__init__(f"request key {request_key!r} belongs to lease {lease_id} ({what})")
        self.request_key = request_key
        self.lease_id = lease_id
