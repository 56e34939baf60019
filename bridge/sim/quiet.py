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
  `L` is refused too; the demand to keep is bounded from below, model by model. With
  `[policy] return_slack` (a model already past its objective may be left a little
  further past it) the refusal is also bounded from above: made with the largest
  allowance of the span's highest demand `H` (`capacity.allowance`), it holds between
  `L` and `H`, and not while a model's return dwell is longer than `return_dwell_s`;
- with room to lend, or a serving lease past its cooldown that model placement could
  give other models (`bridge.policy.placement`, which acts only on models `capacity.over`
  finds late), a certificate `U` that `capacity.over` found carried: any demand at most
  `U` is carried too; the demand to lend for is bounded from above.

The bounds need the policy's rate forecast (a least-squares line over its window) of
every model on every tick: computed once for the whole run with numpy from the arrival
rates the samples will carry, with a tolerance (1e-8 of the series' largest rate) far
above its rounding, so the bound holds whatever order the policy's own sum takes. As the
bounds of every tick are known ahead, a certificate is made on the coming ticks' bounds:
the highest (lend) or lowest (return) of each model over the next `AHEAD` ticks, or over
fewer when the capacity model does not agree there, down to the tick's own (one capacity
prediction each). It is kept while the replicas and the leases stay as they were (the
engine's `structure` key; the replica count and the models' service times are read once
per structure), and it is checked ahead at the lend lead time, so a tick inside the span
it holds costs no look at the bounds. Nothing here decides: `Setup.check_quiet` runs
`assess` on every proven tick as well, and the tests use it.

An LLM sized by its tokens (`bridge.policy.llm`: the snapshot's `token_profiles`): its
TTFT and TPOT breach and calm runs are counted too (a tick with a breach sustained is not
quiet; a lease of it is a return candidate only when its tokens are calm), and a
lend certificate also holds its token rule: at the certificate's rates the replicas hold
what its tokens need (`llm.need`, monotone in the rate and the lengths), and a return
certificate may be a refusal by its tokens (the replicas less one short of the need at
the rates). The token rule sizes an LLM only from a sample with requests (its lengths
are the token rates over the request rate): a return candidate that carries an LLM whose
newest sample has none is left to `assess`. tests/unit/test_sim_tokens.py runs mutants
without these guards: each skips a tick the token rules act on.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bridge.config import BridgeConfig, ModelConfig
from bridge.lifecycle import LeaseState
from bridge.modelfacts import toml_models
from bridge.policy import ModelSample, Snapshot, capacity, llm
from bridge.policy.demand import capacity_inputs, dwells, model_set_of
from bridge.policy.demand import groups as capacity_groups
from bridge.policy.forecast import FULL_SLOPE_SAMPLES, shrink
from bridge.policy.hysteresis import calm_ratio, token_ratio
from bridge.policy.timing import lead_time, slowest_load
from bridge.sim.tokens import TokenModel

#: relative margin on a certificate (far above the capacity model's rounding)
MARGIN = 1e-9
#: ticks ahead whose bounds a certificate is tried on, most first: one made on the next
#: 24 ticks' highest bounds holds for those ticks at least, one on tick k's alone at k (the
#: arrival series swing from tick to tick: a longer span is seldom carried near the limit)
AHEAD = (24, 4, 1)
#: ticks a held certificate is checked ahead at once
SCAN = 64
#: ticks whose bounds are computed at once (for one lead time)
BLOCK = 1024

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
    #: per key of a return candidate: the rates at which its return was refused, scaled
    #: down, and with `[policy] return_slack` the highest its refusal holds up to, scaled
    #: up (None: no bound above)
    lower: dict[Key, tuple[list[float], list[float] | None]] = field(default_factory=dict)
    #: models of serving leases -> (the earliest serving start, their replica key)
    serving: dict[tuple[str, ...], tuple[float, Key]] = field(default_factory=dict)
    #: creation of the oldest drain lend still waiting for its node (inf: none)
    oldest_waiting: float = math.inf
    #: max_lent_nodes less the open leases
    slots: int = 0
    #: the replica count and each model's demand (`QuietProof._inputs`; None: not read)
    inputs: tuple[Count, list[capacity.Demand]] | None = None
    #: the capacity groups of the replicas, and per key those less one of its replicas
    lend_groups: list[capacity.Group] | None = None
    return_groups: dict[Key, list[capacity.Group]] = field(default_factory=dict)
    #: (the lend lead time, the first tick not proven) of the lend certificate, and per
    #: key of a return candidate the same of its return certificate
    lend_until: tuple[float, int] = (math.nan, 0)
    return_until: dict[Key, tuple[float, int]] = field(default_factory=dict)


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
        specs: Mapping[str, ModelConfig] | None = None,
        load_s: Mapping[str, float] | None = None,
        llms: Mapping[str, TokenModel] | None = None,
    ) -> None:
        """`specs`: the models' effective SLO and bounds, as the policy reads them (the
        engine's); None: the TOML's `[models]` alone. `load_s`: the models' load times
        (the snapshots' `load_s`, fixed for a run). `llms`: the models the policy's token
        rules size (the snapshots' `token_profiles`), with their token workloads."""
        self.config = config
        specs = toml_models(config) if specs is None else specs
        llms = llms or {}
        #: the LLMs: index (model order), name, its model, profile and mean lengths
        self.llms = [
            (i, m, specs[m], llms[m].profile, llms[m].demand(1.0))
            for i, m in enumerate(models)
            if m in llms and specs[m].has_token_slo
        ]
        #: the LLMs whose newest sample has no requests; per LLM, its samples in a row
        #: with a token p99 over high_watermark x its objective (a token breach's run)
        self.llm_idle: set[str] = set()
        self.token_breach = [0] * len(self.llms)
        #: per LLM (by name), its samples in a row calm by its tokens (`_token_status`:
        #: with requests, no token p99 at or over low_watermark x its objective)
        self.token_calm = {m: 0 for _, m, _, _, _ in self.llms}
        #: the slowest load of the models the policy scales (`bridge.policy.timing`)
        self.slowest = slowest_load(load_s or {}, specs)
        #: GPUs of every replica (the engine's): a serving lease's replica key has them
        self.replica_gpus = replica_gpus
        self.models = list(models)
        policy = config.policy
        self.runs = {m: _Runs() for m in self.models}
        self.high = {m: policy.high_watermark * specs[m].slo_p99_ms for m in models}
        self.low = {m: policy.low_watermark * specs[m].slo_p99_ms for m in models}
        self.kb = policy.breach_evaluations
        self.kc = max(1, math.ceil(policy.return_dwell_s / config.tick_s))
        self.depth = depth
        self.cert = _Certificates()
        #: `_block`s by (lending, first tick), for the lead time `_blocks_at`
        self._blocks: dict[tuple[bool, int], FloatArray] = {}
        self._blocks_at = math.nan
        #: `lead_s` of the last (`lend_s`, `lend_load_s`, `by_pool`) seen
        self._lead_of: tuple[dict[str, float], dict[str, float], dict[str, float]] | None = None
        self._lead = math.nan
        self.runs_in_order = [self.runs[m] for m in self.models]
        self.high_in_order = [self.high[m] for m in self.models]
        self.low_in_order = [self.low[m] for m in self.models]
        self.need = 0
        #: ticks the arrays below cover; per (tick, model): the arrival rate, the
        #: forecast's level and slope, the dwell's highest rate; per model: the tolerance
        self.ticks = 0
        self.rates_at: FloatArray = np.zeros((0, 0))
        self.level_at: FloatArray = np.zeros((0, 0))
        self.slope_at: FloatArray = np.zeros((0, 0))
        self.dwell_at: FloatArray = np.zeros((0, 0))
        self.tol_at: FloatArray = np.zeros(0)
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
            # a rising slope of few samples as far as they show it: the policy's own
            # `shrink` on each (once a run, and only for a window of so few samples)
            if self.window < FULL_SLOPE_SAMPLES:
                yden = self.window * (windows * windows).sum(axis=1) - sy * sy
                for i in np.flatnonzero(slope > 0.0):
                    slope[i] *= shrink(self.window, float(slope[i]), den, float(yden[i]))
            self.slope[m] = slope
            self.level[m] = (sy - slope * sx) / self.window
            padc = np.concatenate((np.full(self.kc - 1, -np.inf), r))
            self.dwell_max[m] = np.lib.stride_tricks.sliding_window_view(padc, self.kc).max(axis=1)
            self.tol[m] = 1e-8 * (float(np.abs(r).max(initial=0.0)) + 1.0)
        # the same as (tick, model) arrays in model order, for `_rows`
        n = min(len(rates[m]) for m in self.models)
        self.ticks = n
        self.rates_at = np.column_stack([np.asarray(rates[m], dtype=float)[:n] for m in models])
        self.level_at = np.column_stack([self.level[m][:n] for m in self.models])
        self.slope_at = np.column_stack([self.slope[m][:n] for m in self.models])
        self.dwell_at = np.column_stack([self.dwell_max[m][:n] for m in self.models])
        self.tol_at = np.array([self.tol[m] for m in self.models])

    # ---- samples -----------------------------------------------------------------------

    def observe_all(self, samples: Sequence[ModelSample]) -> None:
        """`observe` each model's new sample, given in model order (one call a tick)."""
        for runs, high, low, s in zip(
            self.runs_in_order, self.high_in_order, self.low_in_order, samples, strict=True
        ):
            _count(runs, high, low, s)
        if self.llms:
            high = self.config.policy.high_watermark
            low = self.config.policy.low_watermark
            idle, calm = self.llm_idle, self.token_calm
            for j, (i, m, model, profile, _) in enumerate(self.llms):
                s = samples[i]
                if (s.request_rate or 0.0) > 0 and (s.output_tps or 0.0) > 0:
                    idle.discard(m)
                else:
                    idle.add(m)
                ratio = token_ratio(s, model)
                self.token_breach[j] = self.token_breach[j] + 1 if (ratio or 0.0) > high else 0
                # calm by the part of its p99s over their no-load floors (`_token_status`'s)
                ratio = calm_ratio(s, model, llm.floors_ms(profile, s))
                quiet = s.request_rate is not None and (ratio is None or ratio < low)
                calm[m] = calm[m] + 1 if quiet else 0

    def observe(self, m: str, s: ModelSample) -> None:
        """Count model m's new sample into its runs (`evaluate_model`'s tests)."""
        _count(self.runs[m], self.high[m], self.low[m], s)

    # ---- the proof ---------------------------------------------------------------------

    def lead_s(
        self,
        lend_s: Mapping[str, float],
        lend_load_s: Mapping[str, float] | None = None,
        by_pool: Mapping[str, float] | None = None,
    ) -> float:
        """`bridge.policy.timing.lead_s` of a snapshot with these `lend_s`, `lend_load_s`
        and the run's load times (`by_pool`: each pool's slowest load on the node it
        would lend, where the nodes' weight caches make it differ: `pool_slowest`)."""
        return lead_time(self.config, lend_s, lend_load_s or {}, self.slowest, by_pool)

    def holds(
        self,
        k: int,
        now: float,
        structure: object,
        leases: Callable[[], Sequence[LeaseFacts]],
        lend_s: Mapping[str, float],
        snapshot: Callable[[], Snapshot],
        lend_load_s: Mapping[str, float] | None = None,
        by_pool: Mapping[str, float] | None = None,
    ) -> bool:
        """Whether tick k (ending at `now`) is proven quiet. `structure`: a key that changes
        whenever the replicas, the leases or anything else `assess` reads besides the
        samples and the clock may have; `leases`: the open leases' facts, read when it
        changed; `snapshot`: the snapshot assess would read (nodes-free unless the lead
        reads them: `by_pool`, as `lead_s`), made only when a certificate is."""
        if not self.enabled or k >= self.ticks:
            return False
        policy = self.config.policy
        need, kb, depth = self.need, self.kb, self.depth
        for runs in self.runs_in_order:
            if runs.breach >= kb or runs.rated < need or runs.since_compute >= depth:
                return False
        if self.llms and max(self.token_breach) >= kb:
            return False  # an LLM's TTFT or TPOT in breach: the backstop may lend
        cert = self.cert
        if structure != cert.structure:
            cert = self.cert = self._index(structure, leases())
        if now - cert.oldest_waiting > policy.drain_wait_s:
            return False  # a drain lend may be abandoned
        keys: list[Key] = []
        runs_of, kc, token_calm = self.runs, self.kc, self.token_calm
        # a serving lease past its cooldown may be placed (when models are late)
        placeable = False
        for models, (since, key) in cert.serving.items():
            if now - since >= policy.scale_in_cooldown_s:
                placeable = True
                if all(
                    m in runs_of and runs_of[m].calm >= kc and token_calm.get(m, kc) >= kc
                    for m in models
                ):
                    keys.append(key)
        placeable = placeable and policy.placement
        slots = cert.slots
        if not keys and slots <= 0 and not placeable:
            return True
        if self.llm_idle and any(m in self.llm_idle for key in keys for m in key[0]):
            return False  # a return certificate's token part needs the LLM's lengths
        pools = (lend_s, lend_load_s or {}, by_pool or {})
        if pools != self._lead_of:  # (the lend lead times change at a lend, or a cache's)
            self._lead_of = (dict(pools[0]), dict(pools[1]), dict(pools[2]))
            self._lead = self.lead_s(*pools)
        horizon = self._lead
        # each certificate is checked ahead (`_held`): until the tick it first fails, at
        # this lead time, it holds without a look
        lend_held = cert.lend_until[0] == horizon and k < cert.lend_until[1]
        lending = slots > 0 or placeable
        if lending and not lend_held and not self._cover_lend(snapshot, now, k, horizon):
            return False
        for key in dict.fromkeys(keys):
            until = cert.return_until.get(key)
            held = until is not None and until[0] == horizon and k < until[1]
            if not held and not self._cover_return(snapshot, now, k, horizon, key):
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
                cert.serving[models] = (since, (model_set_of(models), self.replica_gpus))
        cert.slots = self.config.policy.max_lent_nodes - len(leases)
        return cert

    # ---- certificates ------------------------------------------------------------------

    def _inputs(
        self, snapshot: Callable[[], Snapshot], now: float
    ) -> tuple[Count, list[capacity.Demand]] | None:
        """The replica count and each model's demand (its service time, objective and
        instances; its rate is the certificate's) as `capacity_inputs` gives them, read
        once per structure: within one, the replicas do not change and neither does a
        model's service time (the engine's compute time is the model's own)."""
        cert = self.cert
        if cert.inputs is None:
            count, keep, lend = capacity_inputs(snapshot(), self.config, now)
            if list(keep) != self.models or list(lend) != self.models:
                return None  # a model the policy cannot size yet: no proof
            cert.inputs = (count, [lend[m] for m in self.models])
        return cert.inputs

    def _demand(
        self, demands: Sequence[capacity.Demand], rates: Sequence[float]
    ) -> dict[str, capacity.Demand]:
        return {
            m: capacity.Demand(r, d.service_s, d.slo_s, d.instances)
            for m, r, d in zip(self.models, rates, demands, strict=True)
        }

    def _rows(self, lend: bool, horizon: float, k0: int, k1: int) -> FloatArray:
        """The bounds of ticks k0 to k1 (rows; a column per model) on the demand the policy
        would size: lending, headroom x max(rate, forecast); returning, return_headroom x
        max(the dwell's highest, forecast). The forecast `horizon` seconds ahead is taken
        up by the tolerance (lending) or down (returning)."""
        policy = self.config.policy
        fc = self.level_at[k0:k1] + self.slope_at[k0:k1] * horizon
        slack = self.tol_at * (1.0 + abs(horizon))
        if lend:
            rows = np.maximum(self.rates_at[k0:k1], np.maximum(0.0, fc + slack))
            return rows * policy.capacity_headroom
        rows = np.maximum(self.dwell_at[k0:k1], np.maximum(0.0, fc - slack))
        return rows * policy.return_headroom

    def _block(self, lend: bool, horizon: float, k: int) -> tuple[int, FloatArray]:
        """The `_rows` of the `BLOCK` ticks around k, and the first's index (kept for the
        lead time `horizon`)."""
        b0 = k - k % BLOCK
        key = (lend, b0)
        if self._blocks_at != horizon:
            self._blocks.clear()
            self._blocks_at = horizon
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = self._rows(lend, horizon, b0, b0 + BLOCK)
        return b0, block

    def _held(
        self,
        lend: bool,
        horizon: float,
        k: int,
        cert: Sequence[float],
        upper: Sequence[float] | None = None,
    ) -> int:
        """The first tick from k whose bound the certificate `cert` does not hold (looking
        `SCAN` ticks ahead at most, within one block: then the tick after them); a return
        certificate with an `upper` bound holds only up to it too."""
        b0, block = self._block(lend, horizon, k)
        rows = block[k - b0 : k - b0 + SCAN]
        broken = (rows > cert) if lend else (rows < cert)
        if upper is not None:
            broken |= rows > upper
        failed = broken.any(axis=1)
        return k + int(failed.argmax()) if failed.any() else k + len(rows)

    def _cover_lend(
        self, snapshot: Callable[[], Snapshot], now: float, k: int, horizon: float
    ) -> bool:
        """Whether a lend certificate holds tick k: the one held, else a fresh one (see
        `_certify_lend`); records until when it holds."""
        cert = self.cert
        if cert.upper is None or (until := self._held(True, horizon, k, cert.upper)) <= k:
            if self._certify_lend(snapshot, now, k, horizon) is None:
                return False
            assert cert.upper is not None
            until = self._held(True, horizon, k, cert.upper)
            if until <= k:
                return False
        cert.lend_until = (horizon, until)
        return True

    def _cover_return(
        self, snapshot: Callable[[], Snapshot], now: float, k: int, horizon: float, key: Key
    ) -> bool:
        """The same for the return of a replica of `key` (see `_certify_return`)."""
        cert = self.cert
        bounds = cert.lower.get(key)
        if bounds is None or (until := self._held(False, horizon, k, *bounds)) <= k:
            bounds = self._certify_return(snapshot, now, k, horizon, key)
            if bounds is None:
                return False
            until = self._held(False, horizon, k, *bounds)
            if until <= k:
                return False
        cert.return_until[key] = (horizon, until)
        return True

    def _certify_lend(
        self, snapshot: Callable[[], Snapshot], now: float, k: int, horizon: float
    ) -> list[float] | None:
        """A demand that `over` finds carried by the replicas (with the margin taken off):
        the highest bound of each model over the next `AHEAD` ticks, or over fewer when that
        is not carried, down to tick k's alone; None when that is not carried either (then
        `assess` decides)."""
        inputs = self._inputs(snapshot, now)
        if inputs is None:
            return None
        count, demands = inputs
        cert = self.cert
        if cert.lend_groups is None:
            cert.lend_groups = capacity_groups(count)
        cv2 = self.config.policy.service_cv2
        b0, block = self._block(True, horizon, k)
        for ahead in AHEAD:
            rows = block[k - b0 : k - b0 + ahead]  # (not past the block's end)
            target = [float(x) * (1.0 + 2 * MARGIN) for x in rows.max(axis=0)]
            if not capacity.over(
                cert.lend_groups, self._demand(demands, target), cv2
            ) and self._tokens_carried(cert.lend_groups, target):
                cert.upper = [t * (1.0 - MARGIN) for t in target]
                return cert.upper
        return None

    def _tokens_carried(
        self,
        groups: Sequence[capacity.Group],
        rates: Sequence[float],
        models: Sequence[str] | None = None,
        shorter: bool = False,
    ) -> bool:
        """Whether the groups hold the replicas each LLM (of `models`; None: all) needs
        by its tokens at these rates (`bridge.policy.llm.need`: the token rule's lend, and
        its return's refusal), its lengths taken a hair longer (`shorter`: shorter) than
        its samples' (their token rates / request rate, to the last bit). The need grows
        with the rate and the lengths: any demand at most a carried one is carried too,
        any at least a refused one refused (while the LLM has requests: `llm_idle`)."""
        if not self.llms:
            return True
        have = capacity.replicas_of(groups)
        hair = 1.0 - 1e-6 if shorter else 1.0 + 1e-6
        for i, m, model, profile, mean in self.llms:
            if models is not None and m not in models:
                continue
            sample = ModelSample(
                0.0,
                None,
                1.0,
                prompt_tps=mean.mean_prompt * hair,
                output_tps=mean.mean_output * hair,
                prompt_lengths=tuple(x * hair for x in mean.prompt_tokens),
                output_lengths=tuple(x * hair for x in mean.output_tokens),
            )
            need = llm.need(model, profile, sample, rates[i])
            if need is not None and need > have.get(m, 0):
                return False
        return True

    def _certify_return(
        self, snapshot: Callable[[], Snapshot], now: float, k: int, horizon: float, key: Key
    ) -> tuple[list[float], list[float] | None] | None:
        """A demand that the replicas refuse without one replica of `key` (with the margin
        added): the lowest bound of each model over the next `AHEAD` ticks, or over fewer,
        down to tick k's alone; None when that is carried (then `assess` decides).

        With `[policy] return_slack` the refusal is made with the largest allowance the
        span may give (`capacity.allowance` at its highest bounds: a p99 grows with the
        rates; a model saturated there may be allowed any finite p99), so it holds for
        the rates between the two (and the calm the allowance also asks is not needed:
        without it the allowance is smaller)."""
        inputs = self._inputs(snapshot, now)
        if inputs is None:
            return None
        count, demands = inputs
        cert = self.cert
        groups = cert.return_groups.get(key)
        if groups is None:
            reduced = Counter(count)
            reduced[key] -= 1
            groups = cert.return_groups[key] = capacity_groups(reduced)
        policy = self.config.policy
        cv2, slack = policy.service_cv2, policy.return_slack
        if slack and dwells(snapshot(), self.config, now):
            # a dwell past return_dwell_s reads peaks the rows do not bound from above
            # (within a structure it only shortens: a certificate made without one holds)
            return None
        b0, block = self._block(False, horizon, k)
        for ahead in AHEAD:
            rows = block[k - b0 : k - b0 + ahead]  # (not past the block's end)
            target = [float(x) * (1.0 - 2 * MARGIN) for x in rows.min(axis=0)]
            upper: list[float] | None = None
            allowed: dict[str, float] | None = None
            if slack:
                # the rows are the demand's lower bounds (the forecast taken down by the
                # tolerance): the demand itself is at most a row plus twice that
                highest = rows.max(axis=0)
                pad = 2 * self.tol_at * (1.0 + abs(horizon)) * policy.return_headroom
                top = [float(x) * (1.0 + 2 * MARGIN) for x in highest + pad]
                allowed = self._allowance(count, demands, top, slack)
                upper = [float(x) * (1.0 + MARGIN) for x in highest]
            if not capacity.carries(
                groups, self._demand(demands, target), cv2, allowed
            ) or not self._tokens_carried(groups, target, key[0], shorter=True):
                lower = [t * (1.0 + MARGIN) for t in target]
                cert.lower[key] = (lower, upper)
                return lower, upper
        return None

    def _allowance(
        self, count: Count, demands: Sequence[capacity.Demand], top: Sequence[float], slack: float
    ) -> dict[str, float]:
        """The largest `capacity.allowance` of any rates up to `top`: at `top` with every
        replica, and any finite p99 for a model saturated there."""
        cert = self.cert
        if cert.lend_groups is None:
            cert.lend_groups = capacity_groups(count)
        demand = self._demand(demands, top)
        before = capacity.predict(cert.lend_groups, demand, self.config.policy.service_cv2)
        allowed = capacity.allowance(before, demand, slack)
        for m, d in demand.items():
            if before[m] == math.inf and d.rate > 0 and d.service_s < d.slo_s:
                allowed[m] = sys.float_info.max
        return allowed


def _count(runs: _Runs, high: float, low: float, s: ModelSample) -> None:
    """Count one model's new sample into its runs (`evaluate_model`'s tests)."""
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
    compute = s.compute_ms
    if compute is not None and compute > 0:
        runs.since_compute = 0
    else:
        runs.since_compute += 1
