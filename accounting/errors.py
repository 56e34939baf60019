"""The ledger's errors: each names what was wrong, so the operator can fix the input.

Raised before anything is written (or inside the write transaction, which then rolls
back): a failed ingest or rate change leaves the ledger as it was.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of the ledger's errors."""


class IngestError(LedgerError):
    """A source record cannot be booked; `key` names it."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"record {key}: {problem}")


class ClosedPeriodError(LedgerError):
    """An ingest would change a closed month without `restate`."""


class RateError(LedgerError):
    """A rate is invalid, overlaps another, or none applies where one is needed."""


class WindowError(LedgerError, ValueError):
    """A report window, key or step that cannot be read."""
