"""Proving a tick quiet without running `bridge.policy.assess`: the simulator's shortcut
for the ticks at which decide could only answer "nothing" (most of them).

`assess` reads each model's recent samples, the replicas and the leases. On a tick the
engine can prove quiet it is not called at all; on any other tick it is, so a proof that
fails costs nothing but the attempt. A tick is proven quiet when:

- no drain lend has waited past `drain_wait_s` and no model is in sustained breach (each
  model's breach and calm runs are counted as its samples are made, with
  `evaluate_model`'s own tests), so nothing is abandoned and the backstop has no model;
- every serving lease that is a return candidate (past its cooldown, its models calm)
  is held by a certificate: a demand `L` that `capacity.carries` refused without that
  lease's replica. The capacity model is monotone in the rates, so any demand at least
  `L` is refused too; the demand to keep is bounded from below, model by model;
- with room to lend, a certificate `U` that `capacity.over` found carried: any demand at
  most `U` is carried too; the demand to lend for is bounded from above.

The bounds need the policy's rate forecast (a least-squares line over its window) of
every model on every tick: computed once for the whole run with numpy from the arrival
rates the samples will carry, with a tolerance (1e-8 of the series' largest rate) far
above its rounding, so the bound holds whatever order the policy's own sum takes. A
certificate is made (by bisection, a dozen capacity predictions) when none holds, and is
kept while the replicas, the leases and the lend lead time stay as they were: the
engine's `structure` key. Nothing here decides: `Setup.check_quiet` runs `assess` on
every proven tick as well, and the tests use it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bridge.config import BridgeConfig
from bridge.lifecycle import LeaseState
from bridge.policy import ModelSample, Snapshot, capacity
from bridge.policy.decide import LENDABLE, capacity_groups, capacity_inputs, model_set

#: relative margin on a certificate (far above the capacity model's rounding)
MARGIN = 1e-9
#: bisection steps when a certificate is made
STEPS = 12

Count = Counter[tuple[tuple[str, ...], int]]
#: an open lease: (id, lend mode, state, models, created_at, updated_at)
LeaseFacts = tuple[int, str, LeaseState, tuple[str, ...], float, float]
Key = tuple[tuple[str, ...], int]
FloatArray = npt.NDArray[np.float64]


@dataclass
class _Runs:
    """One model's samples, as `evaluate_model` and `_demand` test them."""

    breach: int = 0
    calm: int = 0
    #: consecutive samples with a request rate
    rated: int = 0
    #: samples made since the last with a compute time (large: never)
    since_compute: int = 1 << 60


@dataclass
class _Certificates:
    structure: object = None
    #: the demand (rates, model order) a lend was found unneeded at, scaled up
    upper: list[float] | None = None
    #: per key of a return candidate: the rates at which its return was refused, scaled down
    lower: dict[Key, list[float]] = field(default_factory=dict)
    #: models of serving leases -> (the earliest serving start, their replica key)
    serving: dict[tuple[str, ...], tuple[float, Key]] = field(default_factory=dict)
    #: creation of the oldest drain lend still waiting for its node (inf: none)
    oldest_waiting: float = math.inf
    #: max_lent_nodes less the open leases
    slots: int = 0


class QuietProof:
    """Per engine: `observe` each tick's samples, then `holds` says whether the tick is
    proven quiet (see the module docstring)."""

    def __init__(
        self,
        config: BridgeConfig,
        models: Sequence[str],
        rates: Mapping[str, Sequence[float]],
        tick_s: float,
        depth: int,
        replica_gpus: int,
    ) -> None:
        self.config = config
        #: GPUs of every replica (the engine's): a serving lease's replica key has them
        self.replica_gpus = replica_gpus
        self.models = list(models)
        policy = config.policy
        self.runs = {m: _Runs() for m in self.models}
        self.high = {m: policy.high_watermark * config.models[m].slo_p99_ms for m in models}
        self.low = {m: policy.low_watermark * config.models[m].slo_p99_ms for m in models}
        self.kb = policy.breach_evaluations
        self.kc = max(1, math.ceil(policy.return_dwell_s / config.tick_s))
        self.depth = depth
        self.lendable = [n for n, pool in config.pools.items() if pool.lend_mode in LENDABLE]
        self.cert = _Certificates()
        self.runs_in_order = [self.runs[m] for m in self.models]
        self.need = 0
        self.rates_at: list[list[float]] = []
        self.level_at: list[list[float]] = []
        self.slope_at: list[list[float]] = []
        self.dwell_at: list[list[float]] = []
        self.tol_at: list[float] = []
        # The forecast window in samples: those with now - at <= window_s. Exact when
        # the tick is a whole number of seconds (the samples' times are then exact).
        window = 0
        while (window + 1) * tick_s <= policy.forecast_window_s:
            window += 1
        self.window = window + 1
        #: samples with a rate a model needs for a proof (the forecast's and the dwell's)
        self.need = max(self.window, self.kc)
        x = (np.arange(self.window, dtype=float) - (self.window - 1)) * tick_s
        sx, sxx = float(x.sum()), float((x * x).sum())
        den = self.window * sxx - sx * sx
        self.enabled = (
            float(tick_s).is_integer()
            and self.window >= 3
            and den > 1e-6
            and self.kb >= 1
            and depth >= max(self.window, self.kc)
        )
        self.level: dict[str, FloatArray] = {}
        self.slope: dict[str, FloatArray] = {}
        self.dwell_max: dict[str, FloatArray] = {}
        self.tol: dict[str, float] = {}
        if not self.enabled:
            return
        for m in self.models:
            r = np.asarray(rates[m], dtype=float)
            if len(r) < max(self.window, self.kc) or not np.all(np.isfinite(r)):
                self.enabled = False
                return
            # index i of these arrays: the tick whose sample is the newest of the window
            pad = np.concatenate((np.zeros(self.window - 1), r))
            windows = np.lib.stride_tricks.sliding_window_view(pad, self.window)
            sy = windows.sum(axis=1)
            sxy = windows @ x
            slope = (self.window * sxy - sx * sy) / den
            self.slope[m] = slope
            self.level[m] = (sy - slope * sx) / self.window
            padc = np.concatenate((np.full(self.kc - 1, -np.inf), r))
            self.dwell_max[m] = np.lib.stride_tricks.sliding_window_view(padc, self.kc).max(axis=1)
            self.tol[m] = 1e-8 * (float(np.abs(r).max(initial=0.0)) + 1.0)
        # the same as plain lists in model order (a list's floats are quicker to read)
        self.rates_at = [list(rates[m]) for m in self.models]
        self.level_at = [self.level[m].tolist() for m in self.models]
        self.slope_at = [self.slope[m].tolist() for m in self.models]
        self.dwell_at = [self.dwell_max[m].tolist() for m in self.models]
        self.tol_at = [self.tol[m] for m in self.models]

    # ---- samples -----------------------------------------------------------------------

    def observe(self, m: str, s: ModelSample) -> None:
        """Count model m's new sample into its runs (`evaluate_model`'s tests)."""
        runs = self.runs[m]
        high, low = self.high[m], self.low[m]
        p99, mean, rate = s.p99_ms, s.mean_ms, s.request_rate
        if p99 is not None and p99 > high and mean is not None and mean > low:
            runs.breach += 1
        else:
            runs.breach = 0
        if rate is not None and (p99 is None or p99 < low):
            runs.calm += 1
        else:
            runs.calm = 0
        runs.rated = runs.rated + 1 if rate is not None else 0
        if s.compute_ms is not None and s.compute_ms > 0:
            runs.since_compute = 0
        else:
            runs.since_compute += 1

    # ---- the proof ---------------------------------------------------------------------

    def lead_s(self, lend_s: Mapping[str, float]) -> float:
        """`bridge.policy.decide.lead_s` of a snapshot with these `lend_s`."""
        default = self.config.policy.lend_lead_s
        leads = [lend_s.get(name, default) for name in self.lendable]
        return min(leads) if leads else default

    def holds(
        self,
        k: int,
        now: float,
        structure: object,
        leases: Callable[[], Sequence[LeaseFacts]],
        lend_s: Mapping[str, float],
        snapshot: Callable[[], Snapshot],
    ) -> bool:
        """Whether tick k (ending at `now`) is proven quiet. `structure`: a key that changes
        whenever the replicas, the leases or anything else `assess` reads besides the
        samples and the clock may have; `leases`: the open leases' facts, read when it
        changed; `snapshot`: the nodes-free snapshot, made only when a certificate is."""
        if not self.enabled:
            return False
        policy = self.config.policy
        need, kb, depth = self.need, self.kb, self.depth
        for runs in self.runs_in_order:
            if runs.breach >= kb or runs.rated < need or runs.since_compute >= depth:
                return False
        cert = self.cert
        if structure != cert.structure:
            cert = self.cert = self._index(structure, leases())
        if now - cert.oldest_waiting > policy.drain_wait_s:
            return False  # a drain lend may be abandoned
        keys: list[Key] = []
        runs_of, kc = self.runs, self.kc
        for models, (since, key) in cert.serving.items():
            if now - since >= policy.scale_in_cooldown_s and all(
                m in runs_of and runs_of[m].calm >= kc for m in models
            ):
                keys.append(key)
        slots = cert.slots
        if not keys and slots <= 0:
            return True
        horizon = self.lead_s(lend_s)
        scale = 1.0 + abs(horizon)
        fc = [
            level[k] + slope[k] * horizon
            for level, slope in zip(self.level_at, self.slope_at, strict=True)
        ]
        if slots > 0:
            headroom = policy.capacity_headroom
            bound = [
                max(rates[k], max(0.0, f + tol * scale)) * headroom
                for rates, f, tol in zip(self.rates_at, fc, self.tol_at, strict=True)
            ]
            upper = cert.upper
            if upper is None or any(b > u for b, u in zip(bound, upper, strict=True)):
                upper = self._certify_lend(snapshot(), now)
                if upper is None or any(b > u for b, u in zip(bound, upper, strict=True)):
                    return False
        if keys:
            headroom = policy.return_headroom
            bound = [
                max(dwell[k], max(0.0, f - tol * scale)) * headroom
                for dwell, f, tol in zip(self.dwell_at, fc, self.tol_at, strict=True)
            ]
            snap: Snapshot | None = None
            for key in dict.fromkeys(keys):
                lower = cert.lower.get(key)
                if lower is None or any(b < low for b, low in zip(bound, lower, strict=True)):
                    snap = snap or snapshot()
                    lower = self._certify_return(snap, now, key)
                    if lower is None or any(b < low for b, low in zip(bound, lower, strict=True)):
                        return False
        return True

    def _index(self, structure: object, leases: Sequence[LeaseFacts]) -> _Certificates:
        """Fresh certificates for a new structure, with what the proof reads of its leases:
        per models of serving leases the earliest serving start and the replica key, the
        oldest drain lend still waiting, the room to lend."""
        cert = _Certificates(structure)
        waiting = [
            created_at
            for _, mode, state, _, created_at, _ in leases
            if mode == "drain" and state in (LeaseState.REQUESTED, LeaseState.SUBMITTED)
        ]
        cert.oldest_waiting = min(waiting, default=math.inf)
        for _, _, state, models, _, updated_at in leases:
            if state is LeaseState.SERVING and models:
                known = cert.serving.get(models)
                since = updated_at if known is None else min(known[0], updated_at)
                cert.serving[models] = (since, (model_set(models), self.replica_gpus))
        cert.slots = self.config.policy.max_lent_nodes - len(leases)
        return cert

    # ---- certificates ------------------------------------------------------------------

    def _scaled(
        self, demand: Mapping[str, capacity.Demand], beta: float
    ) -> dict[str, capacity.Demand]:
        return {
            m: capacity.Demand(beta * d.rate, d.service_s, d.slo_s, d.instances)
            for m, d in demand.items()
        }

    def _inputs(
        self, snap: Snapshot, now: float
    ) -> tuple[Count, dict[str, capacity.Demand], dict[str, capacity.Demand]] | None:
        count, keep, lend = capacity_inputs(snap, self.config, now)
        if list(keep) != self.models or list(lend) != self.models:
            return None  # a model the policy cannot size yet: no proof
        return count, keep, lend

    def _certify_lend(self, snap: Snapshot, now: float) -> list[float] | None:
        """The largest demand along today's (up to twice it) that `over` finds carried by
        the replicas (with the margin taken off), or None when today's is not."""
        inputs = self._inputs(snap, now)
        if inputs is None:
            return None
        count, _, lend = inputs
        groups = capacity_groups(count)
        cv2 = self.config.policy.service_cv2

        def carried(beta: float) -> bool:
            return not capacity.over(groups, self._scaled(lend, beta), cv2)

        if not carried(1.0):
            return None
        lo, hi = 1.0, 2.0
        if carried(hi):
            lo = hi
        else:
            for _ in range(STEPS):
                mid = (lo + hi) / 2.0
                lo, hi = (mid, hi) if carried(mid) else (lo, mid)
        self.cert.upper = [lo * lend[m].rate * (1.0 - MARGIN) for m in self.models]
        return self.cert.upper

    def _certify_return(self, snap: Snapshot, now: float, key: Key) -> list[float] | None:
        """The smallest demand along today's keep demand (down to half of it) that the
        replicas refuse without one replica of `key` (with the margin added), or None
        when today's is carried."""
        inputs = self._inputs(snap, now)
        if inputs is None:
            return None
        count, keep, _ = inputs
        reduced = Counter(count)
        reduced[key] -= 1
        groups = capacity_groups(reduced)
        cv2 = self.config.policy.service_cv2

        def refused(beta: float) -> bool:
            return not capacity.carries(groups, self._scaled(keep, beta), cv2)

        if not refused(1.0):
            return None
        lo, hi = 0.5, 1.0
        if refused(lo):
            hi = lo
        else:
            for _ in range(STEPS):
                mid = (lo + hi) / 2.0
                lo, hi = (lo, mid) if refused(mid) else (mid, hi)
        lower = [hi * keep[m].rate * (1.0 + MARGIN) for m in self.models]
        self.cert.lower[key] = lower
        return lower
