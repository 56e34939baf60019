"""Typed Triton errors, classified for the control loop.

Raised by `bridge.triton.client`; caught by the daemon's observe and act steps, which
retry `TritonUnreachable` on a later tick (transient: not counted as a failure) and stop
the lease and alert on `TritonRejected` (permanent: retrying the same call gets the same no).
"""

from __future__ import annotations


class TritonError(Exception):
    """Base of the adapter's errors; `address` is the instance (host:port) it concerns.
    `transient` says whether the same call may succeed later (the control loop reads it)."""

    transient = False

    def __init__(self, address: str, operation: str, message: str) -> None:
        self.address = address
        self.operation = operation
        self.message = message
        super().__init__(f"{operation} on Triton {address}: {message}")


class TritonUnreachable(TritonError):
    """Transient: no answer (connection refused or reset, timeout, 502/503/504).

    The server may be starting, restarting or draining; try again later.
    """

    transient = True


class TritonRejected(TritonError):
    """Permanent: the server answered and said no. `message` quotes Triton's own words.

    `status` is the HTTP status Triton sent (403 for a missing or wrong API key, 400 for an
    unknown model, 500 for a model that failed to load).
    """

    def __init__(self, address: str, operation: str, message: str, status: int | None) -> None:
        self.status = status
        super().__init__(address, operation, f"{message!r} (HTTP {status})")
        self.message = message
