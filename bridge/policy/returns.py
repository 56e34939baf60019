"""Returns that count the cost of coming back: how long a lease's models must have been
quiet before it goes back, learned from what the models' past returns cost. Pure rules
(`break_even_s`, `dwell_s`) over two small memories the deciding pass keeps and hands to
the policy in its snapshot: the models' recent returns (`ReturnLog`) and their request
rates' per-minute peaks (`PeakLog`). The daemon's `LendMemory`, the advisory pass and the
simulator's engine keep them alike, so all three decide the same way.

Why: a return gains the elastic pool the node for as long as it stays out; a lend of it
again costs the victims' work since their checkpoint, Slurm's requeue, the Triton start
and the models' load. On bursty traffic (minutes of near-silence between bursts) a fixed
dwell returns in every silence and lends again at the next burst: hundreds of lends a day,
each one throwing work away and each one late for its burst. This is a rent-or-buy choice
(ski rental): holding an unneeded node is the rent, a return the purchase.

- **The break-even** `B = lead + relend_work_s`: the lend's lead time (measured per pool:
  Slurm, Triton, the slowest model's load) and the elastic work a lend throws away
  (`relend_work_s`). A return pays only if its node stays out longer than `B`.
- **What each return cost**: a model's return followed by a lend of that model within `B`
  was a regret; one that stayed out at least `B` (closed, or still open) paid.
- **The dwell**: from the oldest remembered return to the newest, a regret raises a level
  and a payoff lowers it (never below 0). At level 0 the dwell is `return_dwell_s`; at
  level k it is max(`return_dwell_s`, `B`) x 2^(k-1), at most `return_dwell_max_s`. The
  first regret holds the node for the break-even, the deterministic ski-rental rule (at
  most twice the cost of the best choice made knowing the gap); each further one doubles.
- **The return's rate is the highest of the dwell**: the replicas left must carry the
  highest rate of the dwell, read from the samples for `return_dwell_s` and from the
  per-minute peaks beyond it, so a model whose bursts recur within its dwell keeps its
  nodes through the silences, and one whose bursts stop gives them back a dwell later.

Lends a day are bounded without a cap: each regret doubles the dwell, so after
log2(`return_dwell_max_s` / `B`) regrets in a row a model returns at most once per
`return_dwell_max_s`, and then only after a dwell without a burst.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bridge.config import PolicyConfig

#: returns remembered per model (the newest)
KEEP = 8
#: seconds of one bucket of the rate peaks
PEAK_BUCKET_S = 60.0


@dataclass(frozen=True)
class ReturnHistory:
    """One model's recent returns: the gaps (seconds from a return of it to the next lend
    of it, oldest first) and the last return not followed by a lend yet."""

    gaps: tuple[float, ...] = ()
    open_since: float | None = None


def break_even_s(lead_s: float, policy: PolicyConfig) -> float:
    """Seconds a returned node must stay out for its return to pay."""
    return lead_s + policy.relend_work_s


def dwell_s(
    history: ReturnHistory | None, now: float, break_even: float, policy: PolicyConfig
) -> float:
    """Seconds a model must have been quiet for a lease of it to go back (the module
    docstring's rule)."""
    base = policy.return_dwell_s
    if history is None:
        return base
    level = 0
    for gap in history.gaps:
        level = level + 1 if gap < break_even else max(0, level - 1)
    if history.open_since is not None and now - history.open_since >= break_even:
        level = max(0, level - 1)
    if level == 0:
        return base
    return min(policy.return_dwell_max_s, max(break_even, base) * 2.0 ** (level - 1))


class ReturnLog:
    """Per model, its returns and the lends after them (the memory `dwell_s` reads)."""

    def __init__(self) -> None:
        self._open: dict[str, float] = {}
        self._gaps: dict[str, tuple[float, ...]] = {}
        self._view: dict[str, ReturnHistory] | None = None

    def returned(self, models: Iterable[str], at: float) -> None:
        """A lease holding `models` was given back at `at`."""
        for m in models:
            self._open[m] = at
        self._view = None

    def lent(self, models: Iterable[str], at: float) -> None:
        """A lend carrying `models` was made at `at`: it closes each one's open return."""
        for m in models:
            since = self._open.pop(m, None)
            if since is not None:
                self._gaps[m] = (*self._gaps.get(m, ()), max(0.0, at - since))[-KEEP:]
                self._view = None

    def view(self) -> Mapping[str, ReturnHistory]:
        """The models' histories as the snapshot carries them (made again only after a
        change)."""
        if self._view is None:
            names = set(self._open) | set(self._gaps)
            self._view = {
                m: ReturnHistory(self._gaps.get(m, ()), self._open.get(m)) for m in sorted(names)
            }
        return self._view


@dataclass(frozen=True)
class RatePeaks:
    """One model's highest request rate per `PEAK_BUCKET_S` bucket: the closed buckets
    (start, highest), oldest first, and the bucket under way."""

    closed: tuple[tuple[float, float], ...] = ()
    start: float = -math.inf
    top: float = 0.0

    def highest_since(self, t: float) -> float:
        """The highest rate of the buckets that end after `t` (0 without any): a bucket
        only partly after `t` counts whole, so the span read is at most a bucket longer."""
        best = self.top if self.start + PEAK_BUCKET_S > t else 0.0
        for start, top in reversed(self.closed):
            if start + PEAK_BUCKET_S <= t:
                break
            best = max(best, top)
        return best


class PeakLog:
    """Per model, the `RatePeaks` of the last `keep_s` seconds, fed one sample at a time."""

    def __init__(self, keep_s: float) -> None:
        self.buckets = max(1, math.ceil(keep_s / PEAK_BUCKET_S)) + 1
        self._peaks: dict[str, RatePeaks] = {}

    def add(self, model: str, at: float, rate: float | None) -> None:
        if rate is None:
            return
        peaks = self._peaks.get(model)
        start = math.floor(at / PEAK_BUCKET_S) * PEAK_BUCKET_S
        if peaks is None:
            self._peaks[model] = RatePeaks((), start, rate)
        elif start == peaks.start:
            if rate > peaks.top:
                self._peaks[model] = RatePeaks(peaks.closed, start, rate)
        elif start > peaks.start:
            closed = peaks.closed
            if peaks.start > -math.inf:
                closed = (*closed, (peaks.start, peaks.top))[-self.buckets :]
            self._peaks[model] = RatePeaks(closed, start, rate)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the models not in `keep` (retired)."""
        names = set(keep)
        for m in [m for m in self._peaks if m not in names]:
            del self._peaks[m]

    def view(self) -> Mapping[str, RatePeaks]:
        """The models' peaks as the snapshot carries them (a copy: the log moves on)."""
        return dict(self._peaks)
