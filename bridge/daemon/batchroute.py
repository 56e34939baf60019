"""The batch route as the daemon's pass keeps it (issue 33's batch inference, `[batch]`):
nginx's batch access log read once a pass, the batch rates taken off the models' history
so the policy sizes for online load alone (`bridge.policy.batch.online_history`), and
the route's gate decided after the policy (`bridge.policy.batch.decide_gate`) and handed
to the actuator's routing. The reconciler holds one where `[batch]` is on.

Where the daemon feeds a ledger (`attach_ledger`, by the service), each pass also stores
the batch requests answered per hour, model and batch job, with the log's position, in
the ledger's database (`accounting.batchcounts.record_batch`, one transaction): the
ledger books batch work's share of serving time to the batch job's team with them
(`accounting.batchshare`). The first pass resumes from the stored position; a write that
fails is logged and its counts kept for the next pass's write."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from accounting.batchcounts import batch_cursor, record_batch
from bridge.config import BridgeConfig
from bridge.daemon.observation import Observation
from bridge.daemon.report import TickReport
from bridge.policy.batch import CLOSED, GateState, decide_gate, online_history
from bridge.policy.snapshot import Snapshot
from bridge.routing.batchlog import BatchLog
from bridge.routing.table import BatchGate

log = logging.getLogger(__name__)


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
        #: the ledger's database and cluster name the answered requests go to (None: none)
        self.ledger: tuple[Engine, str] | None = None
        self._resumed = False
        #: the log position last stored
        self._stored: tuple[int, int] | None = None

    def attach_ledger(self, engine: Engine, cluster: str) -> None:
        """Store the answered batch requests in this ledger from the next pass on."""
        self.ledger = (engine, cluster)
        self.log.tally = True

    def online(self, obs: Observation, t: float, report: TickReport) -> Observation:
        """`obs` as the policy reads it: each sample's rate less the batch route's over
        its window (the log read once a pass), so the policy never lends for batch work."""
        if self.ledger is not None and not self._resumed:
            self._resume(self.ledger[0])
        rates = self.log.read(t).rates()
        if self.ledger is not None:
            self._store(*self.ledger, t)
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

    def _resume(self, engine: Engine) -> None:
        """Read on from where the stored counts end (the log's end when none are)."""
        try:
            stored = batch_cursor(engine, str(self.log.path))
        except SQLAlchemyError as exc:
            log.warning("ledger: batch log position not read (counting from its end): %s", exc)
            stored = None
        if stored is not None:
            self.log.resume(*stored)
        self._stored = stored
        self._resumed = True

    def _store(self, engine: Engine, cluster: str, t: float) -> None:
        """The answered requests read since the last store, and the log's position, into
        the ledger; kept for the next pass when the write fails."""
        at = self.log.position()
        if at is None or (at == self._stored and not self.log.answered):
            return
        try:
            record_batch(
                engine, cluster, str(self.log.path), self.log.answered, at,
                datetime.fromtimestamp(t, UTC),
            )  # fmt: skip
        except SQLAlchemyError as exc:
            log.warning("ledger: batch requests not stored (kept for the next pass): %s", exc)
            return
        self.log.answered.clear()
        self._stored = at
