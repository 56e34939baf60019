"""The simulator's actuation times (`bridge.sim.engine.Timing`) from the bridge's own
lease history where it has run: medians of the time its leases spent in each state,
with the count they come from (`timing_from_leases`); read from its database by
`read_lease_timelines`. Called by `stb simulate --timing leases`."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime

from bridge.config import BridgeConfig
from bridge.ledger.lending import LeaseTimeline, read_timelines
from bridge.lifecycle import LeaseState
from bridge.sim.engine import Timing
from bridge.sim.inputs.common import positive, read_database

_S = LeaseState


def _entered(lease: LeaseTimeline) -> dict[LeaseState, datetime]:
    """When the lease first entered each state it reached."""
    out: dict[LeaseState, datetime] = {}
    for at, state in lease.changes:
        out.setdefault(state, at)
    return out


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def timing_from_leases(
    leases: Iterable[LeaseTimeline],
    *,
    lend_mode_of_pool: Mapping[str, str],
    tick_s: float,
    base: Timing | None = None,
) -> tuple[Timing, dict[str, object]]:
    """The simulator's actuation times from the bridge's own lease history: per step,
    the median over the leases that took it (with their count), else `base`'s (the
    bench's defaults). The daemon sees a change at its next tick, so a step that began
    at a tick (a lend, a cancel) and ended anywhere in the tick after is seen half a tick
    late on average: half a tick comes off those, as `labcheck.replayed_timing` does.

    - `preempt_start_s`: requested -> starting of leases from preempt pools (the lend to
      the Triton job running, its victims requeued first);
    - `triton_ready_s`: starting -> serving (Triton up with its models, both seen at ticks);
    - `cancel_s`: releasing -> returned (the job cancelled to the node back).

    `slurm_start_s` (a free node) stays `base`'s: a drain lease's requested -> starting
    also holds its wait for the node's jobs, which the simulator plays from its own jobs,
    and the history does not say which preempt lends found their node free. Leases that
    failed count for the steps they completed before."""
    positive("tick_s", tick_s)
    base = base or Timing()
    half = tick_s / 2.0
    samples: dict[str, list[float]] = defaultdict(list)
    other: dict[str, list[float]] = defaultdict(list)
    count = 0
    for lease in leases:
        count += 1
        seen = _entered(lease)
        mode = lend_mode_of_pool.get(lease.pool)
        if _S.REQUESTED in seen and _S.STARTING in seen:
            took = _seconds(seen[_S.REQUESTED], seen[_S.STARTING])
            if mode == "preempt":
                samples["preempt_start_s"].append(max(0.0, took - half))
            elif mode == "drain":
                other["drain lend: requested -> starting (holds the wait for jobs)"].append(took)
        if _S.STARTING in seen and _S.SERVING in seen:
            samples["triton_ready_s"].append(
                max(0.0, _seconds(seen[_S.STARTING], seen[_S.SERVING]))
            )
        if _S.DRAINING in seen and _S.RELEASING in seen:
            other["draining -> releasing (requests in flight)"].append(
                _seconds(seen[_S.DRAINING], seen[_S.RELEASING])
            )
        if _S.RELEASING in seen and _S.RETURNED in seen and _S.FAILED not in seen:
            took = _seconds(seen[_S.RELEASING], seen[_S.RETURNED])
            samples["cancel_s"].append(max(0.0, took - half))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    timing = replace(
        base,
        preempt_start_s=medians.get("preempt_start_s", base.preempt_start_s),
        triton_ready_s=medians.get("triton_ready_s", base.triton_ready_s),
        cancel_s=medians.get("cancel_s", base.cancel_s),
    )
    fields: dict[str, object] = {}
    for name in ("slurm_start_s", "preempt_start_s", "triton_ready_s", "cancel_s"):
        value = getattr(timing, name)
        got = samples.get(name, [])
        fields[name] = {
            "value": round(value, 3),
            "leases": len(got),
            "from": "lease history (median)" if got else "default (no lease took this step)",
        }
    about: dict[str, object] = {
        "source": "lease history",
        "leases": count,
        "tick_s": tick_s,
        "fields": fields,
        "other_steps": {
            k: {"median_s": round(statistics.median(v), 3), "leases": len(v)}
            for k, v in sorted(other.items())
        },
    }
    return timing, about


def read_lease_timelines(url: str, start: datetime, end: datetime) -> list[LeaseTimeline]:
    """The leases of the bridge's database at `url` alive in [start, end), with their
    history (`bridge.ledger.lending.read_timelines`: one query for the leases, one per
    500 for their events)."""
    return read_database(
        url, "lease database", "the lease history", lambda e: read_timelines(e, start, end)
    )


def lend_modes(config: BridgeConfig) -> dict[str, str]:
    """Pool name -> lend mode, for `timing_from_leases`."""
    return {name: pool.lend_mode for name, pool in config.pools.items()}
