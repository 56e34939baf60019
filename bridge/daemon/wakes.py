"""Requests for models at zero held at any daemon's activator, brought to the one policy
that lends for them. nginx may send a model at zero's requests to a standby's activator
(`bridge.http.activator`); only the leader's pass decides. So a standby, each pass while
its activator holds requests, writes one wake request a model into the operator queue
(`bridge.leases.requests.RequestQueue.request_wake`: never two pending), and the leader's
pass takes them with the other operator requests (`take`) and counts each as a request
waiting beside its own activator's (`waiting`: decide's rule 6). Used by
`bridge.daemon.reconciler`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from bridge.daemon.report import TickReport
from bridge.leases.requests import OperatorRequest, RequestQueue


class Wakes:
    def __init__(self, instance: str) -> None:
        #: who the wake requests this daemon writes say asked
        self.by = f"activator of {instance or 'a standby'}"
        #: per model, the wake requests the leader's pass took, until its snapshot
        self._taken: dict[str, int] = {}

    def send(
        self, held: Mapping[str, int], requests: RequestQueue, now: datetime, report: TickReport
    ) -> None:
        """A standby's pass: a wake request for each model its activator holds requests
        for (`held`); a database error is the pass's, the next pass asks again."""
        for model, n in sorted(held.items()):
            if n <= 0:
                continue
            try:
                req = requests.request_wake(model, now, self.by)
            except SQLAlchemyError as exc:
                report.error("wake", exc)
                continue
            report.events.append(f"wake request {req.id}: {model}, {n} request(s) held here")

    def take(self, req: OperatorRequest) -> str:
        """The leader's pass takes a wake request: counted at this pass; its outcome."""
        (model,) = req.models
        self._taken[model] = self._taken.get(model, 0) + 1
        return f"{model} waiting at {req.requested_by}: counted at this pass"

    def waiting(self, own: Callable[[], Mapping[str, int]] | None) -> dict[str, int] | None:
        """The requests waiting per model for the leader's snapshot: its own activator's
        (`own`) and the wakes taken at this pass, which are then spent; None with
        neither (no activator anywhere)."""
        if own is None and not self._taken:
            return None
        waiting = dict(own()) if own is not None else {}
        for model, n in self._taken.items():
            waiting[model] = waiting.get(model, 0) + n
        self._taken.clear()
        return waiting


__all__ = ["Wakes"]
