"""The batch route as the daemon's pass keeps it (issue 33's batch inference, `[batch]`):
nginx's batch access log read once a pass, the batch rates taken off the models' history
so the policy sizes for online load alone (`bridge.policy.batch.online_history`), and
the route's gate decided after the policy (`bridge.policy.batch.decide_gate`) and handed
to the actuator's routing. The reconciler holds one where `[batch]` is on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from bridge.config import BridgeConfig
from bridge.daemon.observation import Observation
from bridge.daemon.report import TickReport
from bridge.policy.batch import CLOSED, GateState, decide_gate, online_history
from bridge.policy.snapshot import Snapshot
from bridge.routing.batchlog import BatchLog
from bridge.routing.table import BatchGate


class Routed(Protocol):
    """Where the gate goes: the actuator, which publishes it with the routing table."""

    batch: BatchGate | None


class BatchRoute:
    def __init__(self, access_log: Path) -> None:
        self.log = BatchLog(access_log)
        #: the gate as the last pass decided it
        self.gate: GateState = CLOSED
        #: per sample time of the history, the batch route's rate of each model then
        self._rates: dict[float, Mapping[str, float]] = {}

    def online(self, obs: Observation, t: float, report: TickReport) -> Observation:
        """`obs` as the policy reads it: each sample's rate less the batch route's over
        its window (the log read once a pass), so the policy never lends for batch work."""
        rates = self.log.read(t).rates()
        if rates is not None:
            self._rates[t] = report.batch_rates = rates
        times = {sample.at for h in obs.history.values() for sample in h}
        self._rates = {at: r for at, r in self._rates.items() if at in times}
        return replace(obs, history=online_history(obs.history, self._rates))

    def decide(
        self, snap: Snapshot, config: BridgeConfig, t: float, report: TickReport, to: Routed
    ) -> bool:
        """This pass's gate, given to `to`; a change said in the report. True when the
        gate closed now: the caller publishes it before the pass acts."""
        gate = decide_gate(self.gate, snap, config, t, report.actions)
        self.gate = gate.state
        to.batch = BatchGate(gate.state.open, config.batch.retry_after_s)
        report.batch_open = gate.state.open
        if not gate.changed:
            return False
        if gate.state.open:
            report.events.append("batch route opened (calm)")
            return False
        report.events.append(f"batch route closed: {gate.reason}")
        return True
