"""Arrivals as they happened: per model, samples of its request rate (a Prometheus
answer's series, a CSV's rows) resampled to the simulator's step (`resample`: no
synthetic envelope; gaps held briefly, else zero and said). The CSV reader is here;
the Prometheus one is `bridge.sim.inputs.prometheus`. Called by `stb simulate`."""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bridge.sim.inputs.common import InputError, aware, iso, parse_time, positive, read_text
from bridge.sim.workload import ArrivalSeries

FloatArray = npt.NDArray[np.float64]


#: a missing stretch up to this long holds the sample before it (a missed scrape, or a
#: query step coarser than the simulator's); a longer one is a gap: no data, rate 0, said
MAX_GAP_S = 60.0
#: gap spans listed per model in `about` (the rest are counted)
GAPS_LISTED = 10


@dataclass(frozen=True)
class Samples:
    """One series of rate samples (requests per second at each time, epoch seconds),
    strictly increasing in time; `name` says which (its labels, or the file's model)."""

    model: str
    name: str
    times: FloatArray
    values: FloatArray


def resample(
    samples: Sequence[Samples],
    *,
    start: datetime | None,
    end: datetime | None,
    step_s: float,
    scale: float = 1.0,
    max_gap_s: float = MAX_GAP_S,
    where: str,
) -> ArrivalSeries:
    """Per model, the sum of its series as a rate per step of `step_s` from `start`
    (default: the first sample) to `end` (default: the last sample's step). A step with
    samples takes their mean; a step without takes the latest sample before it if that is
    at most `max_gap_s` older than the step (held), else it is a gap: rate 0 for that
    series. The series' `about` says per model how many series it sums and how many
    samples it used, and lists the gaps where none of its series had data. Times `scale`
    (more or less load than the site had). `origin` is `start`'s time."""
    positive("step_s", step_s)
    positive("scale", scale)
    if not (math.isfinite(max_gap_s) and max_gap_s >= 0):
        raise InputError(f"max_gap_s must be a number >= 0, got {max_gap_s!r}")
    if not samples:
        raise InputError(f"{where}: no series")
    t0 = (
        aware(start, "start").timestamp()
        if start is not None
        else min(float(s.times[0]) for s in samples)
    )
    t1 = (
        aware(end, "end").timestamp()
        if end is not None
        else max(float(s.times[-1]) for s in samples) + step_s
    )
    steps = math.ceil((t1 - t0) / step_s - 1e-9)
    if steps < 1:
        raise InputError(f"{where}: the window {iso(t0)} to {iso(t1)} holds no step")
    starts = t0 + np.arange(steps) * step_s
    rates: dict[str, FloatArray] = {}
    no_data: dict[str, npt.NDArray[np.bool_]] = {}
    used: Counter[str] = Counter()
    series: Counter[str] = Counter()
    held: Counter[str] = Counter()
    for s in samples:
        idx = np.floor((s.times - t0) / step_s).astype(np.int64)
        inside = (idx >= 0) & (idx < steps)
        counts = np.bincount(idx[inside], minlength=steps)
        sums = np.bincount(idx[inside], weights=s.values[inside], minlength=steps)
        have = counts > 0
        out = np.zeros(steps)
        out[have] = sums[have] / counts[have]
        before = np.searchsorted(s.times, starts, side="left") - 1
        age = starts - s.times[np.maximum(before, 0)]
        hold = ~have & (before >= 0) & (age <= max_gap_s)
        out[hold] = s.values[before[hold]]
        gap = ~have & ~hold
        rates[s.model] = rates.get(s.model, 0.0) + out * scale
        no_data[s.model] = no_data[s.model] & gap if s.model in no_data else gap
        used[s.model] += int(inside.sum())
        series[s.model] += 1
        held[s.model] += int(hold.sum())
    if all(mask.all() for mask in no_data.values()):
        raise InputError(f"{where}: no sample inside the window {iso(t0)} to {iso(t1)}")
    gaps: dict[str, object] = {}
    for model, mask in sorted(no_data.items()):
        spans = _spans(mask, t0, step_s)
        if spans:
            gaps[model] = {
                "seconds": float(mask.sum()) * step_s,
                "spans": [[iso(a), iso(b)] for a, b in spans[:GAPS_LISTED]],
                "more_spans": max(0, len(spans) - GAPS_LISTED),
            }
    about: dict[str, object] = {
        "window": [iso(t0), iso(t0 + steps * step_s)],
        "step_s": step_s,
        "scale": scale,
        "max_gap_s": max_gap_s,
        "series": dict(sorted(series.items())),
        "samples": dict(sorted(used.items())),
        "held_steps": dict(sorted(held.items())),
        "gaps": gaps,
        "mean_rps": {m: round(float(r.mean()), 3) for m, r in sorted(rates.items())},
    }
    origin = datetime.fromtimestamp(t0, tz=UTC)
    return ArrivalSeries(step_s, dict(sorted(rates.items())), about=about, origin=origin)


def _spans(mask: npt.NDArray[np.bool_], t0: float, step_s: float) -> list[tuple[float, float]]:
    """The runs of True in `mask` as (from, to) times."""
    if not mask.any():
        return []
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    begins, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(t0 + a * step_s, t0 + b * step_s) for a, b in zip(begins, ends, strict=True)]


def checked(model: str, name: str, times: list[float], values: list[float], where: str) -> Samples:
    """The series as arrays, refusing what no rate can be (naming the series and the
    sample): a time that is not finite, out of order or repeated; a value NaN, infinite
    or negative."""
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if not len(t):
        raise InputError(f"{where}: series {name} has no sample")
    bad_t = np.flatnonzero(~np.isfinite(t))
    if len(bad_t):
        raise InputError(f"{where}: series {name}: sample {bad_t[0]}: time {t[bad_t[0]]!r}")
    back = np.flatnonzero(np.diff(t) <= 0)
    if len(back):
        k = int(back[0]) + 1
        raise InputError(
            f"{where}: series {name}: samples not in time order: sample {k} at "
            f"{iso(t[k])} is not after sample {k - 1} at {iso(t[k - 1])}"
        )
    bad_v = np.flatnonzero(~np.isfinite(v) | (v < 0))
    if len(bad_v):
        k = int(bad_v[0])
        raise InputError(
            f"{where}: series {name}: sample {k} at {iso(t[k])}: value {v[k]!r} is not a "
            "rate (a finite number >= 0)"
        )
    return Samples(model, name, t, v)


CSV_COLUMNS = ("time", "model", "rate")


def arrivals_from_csv(
    path: Path,
    *,
    step_s: float,
    scale: float = 1.0,
    start: datetime | None = None,
    end: datetime | None = None,
    max_gap_s: float = MAX_GAP_S,
) -> tuple[ArrivalSeries, datetime]:
    """Per model, its request rate from a CSV with a header naming `time`, `model` and
    `rate` (other columns ignored): each row a sample of the model's requests per second
    at `time` (ISO 8601 with a zone, or epoch seconds), resampled as a Prometheus answer
    is (`resample`). Returns the series and its start (`start`, else the first sample's
    time). Refuses, naming the line: a missing column, a bad time or rate, a model's rows
    out of time order or repeated, no row at all."""
    text = read_text(path, "arrivals file")
    rows = csv.reader(text.splitlines())
    header = next((r for r in rows if any(c.strip() for c in r)), None)
    if header is None:
        raise InputError(f"arrivals file {path}: empty (no header)")
    names = [c.strip().lower() for c in header]
    missing = [c for c in CSV_COLUMNS if c not in names]
    if missing:
        raise InputError(
            f"arrivals file {path}: no column {', '.join(missing)} in its header {header}"
        )
    cols = [names.index(c) for c in CSV_COLUMNS]
    times: dict[str, list[float]] = defaultdict(list)
    rates: dict[str, list[float]] = defaultdict(list)
    lines: dict[str, int] = {}
    for row in rows:
        if not any(c.strip() for c in row):
            continue
        line = rows.line_num
        where = f"arrivals file {path}: line {line}"
        if len(row) < len(names):
            raise InputError(f"{where}: {len(row)} fields, the header has {len(names)}")
        raw_t, model, raw_r = (row[i].strip() for i in cols)
        t = parse_time(raw_t, f"{where}: time").timestamp()
        if not model:
            raise InputError(f"{where}: empty model")
        try:
            rate = float(raw_r)
        except ValueError:
            rate = math.nan
        if not (math.isfinite(rate) and rate >= 0):
            raise InputError(f"{where}: rate {raw_r!r} is not a number >= 0")
        if times[model] and t <= times[model][-1]:
            raise InputError(
                f"{where}: model {model!r} at {iso(t)} is not after its line "
                f"{lines[model]} ({iso(times[model][-1])}): a model's rows go in time order"
            )
        times[model].append(t)
        rates[model].append(rate)
        lines[model] = line
    if not times:
        raise InputError(f"arrivals file {path}: no rows under the header")
    samples = [
        checked(m, repr(m), times[m], rates[m], f"arrivals file {path}") for m in sorted(times)
    ]
    first = start or datetime.fromtimestamp(min(s.times[0] for s in samples), tz=UTC)
    where = f"arrivals file {path}"
    series = resample(
        samples, start=first, end=end, step_s=step_s, scale=scale, max_gap_s=max_gap_s, where=where
    )
    return replace(series, about={"source": "csv", "file": path.name, **series.about}), first
