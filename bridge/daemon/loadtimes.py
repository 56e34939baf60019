"""The models' load times, measured on every start and kept: the per-model part of the
lend's lead time (`bridge.policy.timing`). The reconciler holds one `LoadTimes`:

- a placement's load on a lent server is timed from its ask to its end (`placed`, source
  `placement`): Triton's explicit model control answers once the model is loaded, on the
  placer's own thread while the passes go on (`bridge.daemon.placer`); when that answer
  does not come (the client's timeout), to the pass that sees the model READY;
- a lend's Triton start, its lease's `starting -> serving` seconds from the lease's
  history, is each of its models' upper bound (`started`, source `lend`: Triton loads a
  lend's models at its start; the figure holds Triton's own start too), source `local`
  for a model the move to serving says was read from the node's weight cache (its own
  estimate, `local_load_s`: `bridge.policy.timing` reads the two apart);
- each measure is written to the lease database (`bridge.leases.loads.LoadStore`) and
  read back when the daemon starts (`recall`), so the lead time survives a restart.

`load_s` and `local_load_s` are what the snapshot carries: per model,
`bridge.leases.loads.estimate` of its measures from the shared repository and from the
node-local cache. A failed write is logged and the measure kept in memory (a pass never fails
for it; a deposed instance's write is refused by the fence and dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from bridge.daemon.planner import LeaseRecord
from bridge.leases.errors import LeaseError
from bridge.leases.leader import Fenced
from bridge.leases.loads import KEEP, LOCAL, LoadStore, estimate
from bridge.leases.store import LeaseStore
from bridge.lifecycle import LeaseState
from bridge.weights import overlay

log = logging.getLogger(__name__)


class LoadTimes:
    def __init__(self, store: LoadStore | None = None) -> None:
        self.store = store
        #: per model, its estimated load time in seconds from the shared repository (the
        #: snapshot's `load_s`) and from a node's local weight cache (`local_load_s`)
        self.load_s: dict[str, float] = {}
        self.local_load_s: dict[str, float] = {}
        self._measures: dict[str, list[tuple[str, float]]] = {}
        #: leases whose start was timed (or found untimeable); None until the first pass,
        #: which takes the leases serving then as timed (by the process before a restart)
        self._timed: set[int] | None = None

    def recall(self) -> None:
        """The measures stored before this process started."""
        if self.store is None:
            return
        try:
            stored = self.store.measures()
        except SQLAlchemyError as exc:
            log.warning("model load times not read back: %s", exc)
            return
        for model, measures in stored.items():
            self._measures[model] = list(measures)
            self._estimate(model)

    def record(
        self, model: str, seconds: float, at: datetime, source: str, version: str = ""
    ) -> None:
        """One measured load of `model` (kept, and stored)."""
        kept = self._measures.setdefault(model, [])
        kept.append((source, max(0.0, seconds)))
        del kept[: -4 * KEEP]
        self._estimate(model)
        if self.store is None:
            return
        try:
            self.store.record(model, seconds, at, source, version)
        except (SQLAlchemyError, Fenced) as exc:
            log.warning("model load time of %s not stored: %s", model, exc)

    def placed(self, model: str, seconds: float, at: datetime, version: str = "") -> None:
        """A placement's load of `model` took `seconds`, from its ask to its end."""
        self.record(model, seconds, at, "placement", version)

    def started(self, leases: Sequence[LeaseRecord], store: LeaseStore, at: datetime) -> None:
        """Each lease newly serving: its `starting -> serving` seconds (its history's
        events) recorded for each of its models. A lease that skipped `starting` (never
        seen running) or whose history cannot be read is left out."""
        if self._timed is None:
            self._timed = {lease.id for lease in leases if lease.state == LeaseState.SERVING}
            return
        timed = self._timed
        timed &= {lease.id for lease in leases}
        for lease in leases:
            if lease.state != LeaseState.SERVING or lease.id in timed:
                continue
            timed.add(lease.id)
            try:
                events = store.history(lease.id)
            except (LeaseError, SQLAlchemyError) as exc:
                log.warning("start of lease %s not timed: %s", lease.id, exc)
                continue
            began = next((e.at for e in events if e.to_state == LeaseState.STARTING), None)
            served = next((e for e in events if e.to_state == LeaseState.SERVING), None)
            if began is None or served is None or served.at < began:
                continue
            seconds = (served.at - began).total_seconds()
            # where each model's weights were read from, as the move to serving says
            local = overlay.from_reason(served.reason)
            for model in dict.fromkeys(lease.models):
                self.record(model, seconds, at, LOCAL if local.get(model) == "local" else "lend")

    def _estimate(self, model: str) -> None:
        measures = self._measures.get(model, ())
        for local, kept in ((False, self.load_s), (True, self.local_load_s)):
            value = estimate(measures, local=local)
            if value is None:
                kept.pop(model, None)
            else:
                kept[model] = value


__all__ = ["LoadTimes"]
