"""What one control pass did, as data: `TickReport` and its `StepError`s.

Built by the reconciler and the actuator during a pass; read by the daemon (log lines),
the exporter (`BridgeMetrics.record`: every tick metric comes from here, none from inside
a state change) and tests. An adapter error never unwinds the pass: it becomes a
`StepError` with its kind, from the error type's `transient` flag (the Slurm, Triton and
routing errors each declare it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from bridge.policy import Action


class Outcome(StrEnum):
    OK = "ok"  # every step succeeded
    ERRORS = "errors"  # the pass completed; some steps reported errors (retried or failed)
    FAILED = "failed"  # the pass could not complete (no fresh view, no lease database)


@dataclass(frozen=True)
class StepError:
    """One failed adapter call. `step` names what was tried (observe, submit, fence, cancel,
    unload, unfence, route, adopt, baseline, store, lend, return, operator, place, load);
    `kind` is "transient" (retried on a later tick) or "permanent" (the lease, if any, is
    failed)."""

    step: str
    kind: str
    message: str
    lease_id: int | None = None

    def line(self) -> str:
        where = f"lease {self.lease_id} " if self.lease_id is not None else ""
        return f"{where}{self.step} ({self.kind}): {self.message}"


def kind_of(exc: BaseException) -> str:
    """ "transient" or "permanent", from the error type's own `transient` flag."""
    return "transient" if getattr(exc, "transient", False) else "permanent"


@dataclass
class TickReport:
    at: datetime
    actions: list[Action] = field(default_factory=list)
    #: "lease 3 n3: starting -> serving (Triton ready)" lines, in order
    events: list[str] = field(default_factory=list)
    errors: list[StepError] = field(default_factory=list)
    seconds: float = 0.0
    #: set when the pass could not complete
    failed: bool = False
    #: open leases by state after the pass (None when the pass could not read them)
    lease_states: Mapping[str, int] | None = None
    #: per model, the latest p99 seen (None: no data)
    p99_ms: Mapping[str, float | None] = field(default_factory=dict)
    #: per open lease, transient errors since its last successful step
    retries: Mapping[int, int] = field(default_factory=dict)
    #: open leases past their state's deadline, with the reason they are in that state
    stuck: Mapping[int, str] = field(default_factory=dict)
    #: leases that moved to `returned` this pass: (pool, outcome, lifetime s)
    returned: list[tuple[str, str, float]] = field(default_factory=list)
    #: leases that began serving this pass: (pool, seconds from lend to serving)
    served: list[tuple[str, float]] = field(default_factory=list)
    #: lends recorded this pass, by pool
    lent: list[str] = field(default_factory=list)
    #: False on a standby's pass (it observed and routed, and did nothing else) and on an
    #: advisory pass (it observed and decided, and acted on nothing)
    active: bool = True
    #: an advisory pass's shadow leases by state (`bridge.advise.shadow`; None: not one)
    shadow_states: Mapping[str, int] | None = None
    #: the batch route's gate after the pass (None: `[batch]` off, or not decided)
    batch_open: bool | None = None
    #: per model, the batch route's requests/s over the pass's window (nginx's log)
    batch_rates: Mapping[str, float] = field(default_factory=dict)

    @property
    def outcome(self) -> Outcome:
        if self.failed:
            return Outcome.FAILED
        return Outcome.ERRORS if self.errors else Outcome.OK

    def error(self, step: str, exc: BaseException, lease_id: int | None = None) -> StepError:
        err = StepError(step, kind_of(exc), str(exc), lease_id)
        self.errors.append(err)
        return err

    def lines(self) -> list[str]:
        return [*self.events, *(f"error: {e.line()}" for e in self.errors)]
