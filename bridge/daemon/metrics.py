"""The metrics the daemon keeps about itself (`BridgeMetrics`): every tick metric from the
pass's `TickReport`, the leader's epoch, and the health verdict `/healthz` answers.

Called by the reconciler and the advisory pass (they record each pass's report) and by
the daemon's service, which hands it to the HTTP surface (`bridge.http.app`: `/metrics`
from its registry, `/healthz` from `health`). One registry per instance, so tests and
several daemons in one process never collide.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bridge.daemon.report import Outcome, TickReport
from bridge.lifecycle import LeaseState


class BridgeMetrics:
    """The metrics the daemon keeps about itself."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        instance: str = "",
        advisory: bool = False,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        self.instance = instance
        #: an advisory daemon (`stb daemon --advise`): it never acts, whatever the election
        self.advisory = advisory
        r = self.registry
        self.active = Gauge(
            "stb_active",
            "1 on the instance that acts (the leader, or the only daemon), 0 on a standby.",
            ["instance"],
            registry=r,
        )
        self.leader_epoch = Gauge(
            "stb_leader_epoch",
            "The leader row's epoch this instance holds (0: standing by or not PostgreSQL).",
            registry=r,
        )
        #: whether this instance acts, read when scraped (the leader election's answer
        #: as of now, not as of its last beat)
        self.is_active: Callable[[], bool] = lambda: True
        self.active.labels(instance).set_function(
            lambda: 0.0 if self.advisory else float(self.is_active())
        )
        self.shadow_leases = Gauge(
            "stb_shadow_leases",
            "An advisory daemon's shadow leases (the lends it would have made), by state.",
            ["state"],
            registry=r,
        )
        self.leases = Gauge("stb_leases", "Leases by state.", ["state"], registry=r)
        self.lends = Counter("stb_lends", "Nodes lent, by pool.", ["pool"], registry=r)
        self.returns = Counter(
            "stb_returns", "Leases returned, by outcome.", ["outcome"], registry=r
        )
        self.lend_seconds = Histogram(
            "stb_lend_duration_seconds",
            "From lend decision to serving.",
            ["pool"],
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.return_seconds = Histogram(
            "stb_lease_lifetime_seconds",
            "From lend request to returned (whole lease).",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )
        self.decisions = Counter(
            "stb_decisions", "Policy actions, by kind and reason.", ["action", "reason"], registry=r
        )
        self.model_p99 = Gauge(
            "stb_model_p99_ms", "Per-model p99 the bridge saw (ms).", ["model"], registry=r
        )
        self.model_slo = Gauge(
            "stb_model_slo_p99_ms", "Per-model p99 objective (ms).", ["model"], registry=r
        )
        self.batch_gate = Gauge(
            "stb_batch_gate_open",
            "The batch route's gate: 1 open, 0 closed or [batch] off.",
            registry=r,
        )
        self.batch_rate = Gauge(
            "stb_batch_request_rate",
            "Per-model batch route requests/s nginx passed over the last pass's window "
            "(its batch access log), taken off the model's rate for the policy.",
            ["model"],
            registry=r,
        )
        self.last_good_tick = Gauge(
            "stb_last_good_tick_timestamp_seconds",
            "Unix time of the last tick that completed with no error.",
            registry=r,
        )
        self.tick_seconds = Histogram(
            "stb_tick_duration_seconds",
            "One control pass.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.ticks = Counter(
            "stb_ticks",
            "Control passes by outcome: ok (no error), errors (completed, some step "
            "reported an error), failed (could not complete).",
            ["outcome"],
            registry=r,
        )
        self.step_errors = Counter(
            "stb_step_errors",
            "Adapter errors by step and kind (transient: retried; permanent: lease failed).",
            ["step", "kind"],
            registry=r,
        )
        self.tick_exceptions = Counter(
            "stb_tick_exceptions",
            "Passes that raised an unexpected exception (a bug: the log has the traceback), "
            "by error class.",
            ["kind"],
            registry=r,
        )
        self.lease_retries = Gauge(
            "stb_lease_retries",
            "Transient errors of an open lease's step since its last good step.",
            ["lease"],
            registry=r,
        )
        self.leases_stuck = Gauge(
            "stb_leases_stuck",
            "Open leases past their state's deadline (a failed lease whose cleanup does not "
            "finish needs a person).",
            registry=r,
        )
        self.ledger_ingests = Counter(
            "stb_ledger_ingests", "Scheduled ledger ingests, by outcome.", ["outcome"], registry=r
        )
        for state in LeaseState:
            self.leases.labels(state.value).set(0)
        for outcome in Outcome:
            self.ticks.labels(outcome.value)
        self._last_good: float | None = None
        self._last_outcome: str | None = None
        self._last_errors: list[str] = []

    def record(self, report: TickReport, slo_ms: Mapping[str, float] | None = None) -> None:
        """Every tick metric, from the pass's report."""
        outcome = report.outcome
        self.ticks.labels(outcome.value).inc()
        self.tick_seconds.observe(report.seconds)
        self._last_outcome = outcome.value
        self._last_errors = [e.line() for e in report.errors][:10]
        for err in report.errors:
            self.step_errors.labels(err.step, err.kind).inc()
        if report.lease_states is not None:
            for state in LeaseState:
                self.leases.labels(state.value).set(report.lease_states.get(state.value, 0))
        for action in report.actions:
            self.decisions.labels(
                type(action).__name__.lower(), action.reason.split(":")[0][:40]
            ).inc()
        for pool in report.lent:
            self.lends.labels(pool).inc()
        for pool, seconds in report.served:
            self.lend_seconds.labels(pool).observe(seconds)
        for _pool, how, seconds in report.returned:
            self.returns.labels(how).inc()
            self.return_seconds.observe(seconds)
        if not report.failed:
            self.lease_retries.clear()
            for lease_id, n in report.retries.items():
                self.lease_retries.labels(str(lease_id)).set(n)
            self.leases_stuck.set(len(report.stuck))
        if report.shadow_states is not None:
            for state in LeaseState:
                self.shadow_leases.labels(state.value).set(report.shadow_states.get(state.value, 0))
        for model, p99 in report.p99_ms.items():
            self.model_p99.labels(model).set(float("nan") if p99 is None else p99)
        for model, slo in (slo_ms or {}).items():
            self.model_slo.labels(model).set(slo)
        if report.batch_open is not None:
            self.batch_gate.set(float(report.batch_open))
        for model, rate in report.batch_rates.items():
            self.batch_rate.labels(model).set(rate)
        if outcome == Outcome.OK:
            self._last_good = self._clock()
            self.last_good_tick.set(self._last_good)

    @property
    def role(self) -> str:
        if self.advisory:
            return "advisory"
        return "active" if self.is_active() else "standby"

    def record_epoch(self, epoch: int | None) -> None:
        """The leader row's epoch this instance holds (None: standing by)."""
        self.leader_epoch.set(epoch or 0)

    def record_exception(self, exc: BaseException) -> None:
        """A pass that raised (a bug in the bridge, not an adapter error)."""
        self.ticks.labels(Outcome.FAILED.value).inc()
        self.tick_exceptions.labels(type(exc).__name__).inc()
        self._last_outcome = Outcome.FAILED.value
        self._last_errors = [f"{type(exc).__name__}: {exc}"]

    def health(self, tick_s: float) -> tuple[bool, dict[str, object]]:
        """Healthy while the last good tick (no error) is younger than three tick intervals;
        the body names the last pass's outcome and errors."""
        now = self._clock()
        if self._last_good is None:
            return False, {
                "healthy": False,
                "reason": "no tick has completed yet",
                "role": self.role,
                "instance": self.instance,
            }
        age = now - self._last_good
        ok = age <= 3 * tick_s
        body: dict[str, object] = {
            "healthy": ok,
            "last_good_tick_age_s": round(age, 3),
            "role": self.role,
            "instance": self.instance,
        }
        if not ok:
            body["reason"] = f"last good tick {age:.0f}s ago (limit {3 * tick_s:g}s)"
        body["last_outcome"] = self._last_outcome
        if self._last_errors:
            body["last_errors"] = self._last_errors
        return ok, body


__all__ = ["BridgeMetrics"]
