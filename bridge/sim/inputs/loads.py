"""The models' load times a run is given (`Timing.model_load_s`, `Timing.local_load_s`)
and its node-local weight caches (`--cache`): from `--load-s` and `--cache`, and with
`--timing leases` from the loads the site's daemon measured on every start and stored
beside its leases (`bridge.leases.loads.LoadStore`, read by `read_load_measures`).
`load_timing` is pure: measures in, `Timing` and the report's notes out. Called by
`bridge.sim.inputs.site` for `stb simulate`.

Per model, its figure from the stored measures is the daemon's own estimate
(`bridge.leases.loads.estimate`: the median of the newest of its best source), from the
shared repository and from a node's cache apart, as the policy reads them
(`Snapshot.load_s`, `Snapshot.local_load_s`). What the simulator adds to a lent
replica's start is the load past Triton's own start (`Timing.triton_ready_s`), so:

- a `placement` measure (a model loaded into a running Triton: its own load alone) is
  taken as it is;
- a `lend` or `local` measure (a lease's whole `starting -> serving`, Triton's own start
  included, `bridge.daemon.loadtimes`) less the run's `triton_ready_s` (the history's
  median of the same step, else the lab's figure), never below 0: a model whose lends
  serve no slower than the median lend adds nothing, and one whose lends take longer
  adds the difference, so its simulated lend takes about what its measured lends took.
  The policy reads such a bound the same way: the part of it a pool's measured lend time
  already holds is not counted twice (`bridge.policy.timing`'s lead rule).

A placement's measure is not reduced: the history's `triton_ready_s` holds the loads of
the models lent then, so a lend of such a model is played at most that much slower than
measured (as with `--load-s`). What the user gives wins for its part: `--load-s` for the
models it names (a bare number: every model), `--cache N:S` for every model's load from
a node's cache; `--cache N` (no S) takes each model's from the history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bridge.leases.loads import KEEP, LOCAL, SOURCES, LoadStore, estimate
from bridge.sim.cache_option import OFF, CacheOption, with_cache
from bridge.sim.inputs.common import InputError, read_database
from bridge.sim.setup import Timing

#: the source whose measure is a model's own load (the others hold Triton's start)
DIRECT = "placement"
#: one model's stored measures, oldest first: (source, seconds)
Measures = Sequence[tuple[str, float]]


@dataclass(frozen=True)
class LoadFigure:
    """One model's load time from its stored measures, from the shared repository or
    from a node's cache."""

    #: the source the estimate took (placement, lend, local)
    source: str
    #: the daemon's estimate (`bridge.leases.loads.estimate`), seconds
    measured_s: float
    #: how many measures its median is of (the newest `KEEP` at most)
    measures: int
    #: the seconds the simulator adds past `Timing.triton_ready_s` (the module docstring)
    seconds: float


def _best(measures: Measures, local: bool) -> tuple[str, int] | None:
    """The source `estimate` takes (its order: placement, lend, any other by name; with
    `local` the node-local cache's alone) and how many measures its median is of."""
    counts: dict[str, int] = {}
    for source, _ in measures:
        if (source == LOCAL) == local:
            counts[source] = counts.get(source, 0) + 1
    for source in (*SOURCES, *sorted(set(counts) - set(SOURCES))):
        if counts.get(source):
            return source, min(KEEP, counts[source])
    return None


def figures(
    measures: Mapping[str, Measures], triton_ready_s: float
) -> dict[str, dict[str, LoadFigure]]:
    """Per model, its figures by kind (`shared`: from the shared repository, `local`:
    from a node's cache; a kind without measures left out): the daemon's `estimate`, as
    it is where it took a `placement` measure (the model's own load), less
    `triton_ready_s` and never below 0 where it took a `lend` or `local` one (a lease's
    whole starting -> serving, Triton's own start in it, which the simulator plays as
    `triton_ready_s` already; the policy likewise counts no more of such a bound than a
    pool's measured lend time leaves: the module docstring)."""
    out: dict[str, dict[str, LoadFigure]] = {}
    for model, kept in sorted(measures.items()):
        for kind, local in (("shared", False), ("local", True)):
            best = _best(kept, local)
            value = estimate(kept, local=local)
            if best is None or value is None:
                continue
            source, count = best
            seconds = value if source == DIRECT else max(0.0, value - triton_ready_s)
            out.setdefault(model, {})[kind] = LoadFigure(source, value, count, seconds)
    return out


def check_cache(cache: CacheOption, *, history: bool) -> None:
    """`InputError` for a cache whose loads from a node's cache are to come from the
    lease history (`N`, `stage:N`) where none is read (`history`: `--timing leases`)."""
    if cache.on and cache.local_s is None and not history:
        raise InputError(
            f"--cache {cache} takes each model's load from a node's cache from the lease "
            f"history: give --timing leases, or --cache {cache}:S"
        )


def load_timing(
    timing: Timing,
    models: Sequence[str],
    *,
    load_s: tuple[float | None, Mapping[str, float]] = (None, {}),
    cache: CacheOption = OFF,
    history: Mapping[str, Measures] | None = None,
) -> tuple[Timing, dict[str, object]]:
    """`timing` with the load times of `models` and `cache`'s caches, and the notes the
    report's `timing_source` adds. `load_s`: `--load-s` as `per_model` reads it (the
    figure of every model, None if not given; per model); `history`: the stored measures
    per model (`--timing leases`; None: not read), whose figures (`figures`, less
    `timing.triton_ready_s`) give each model's load where `--load-s` does not, and its
    load from a node's cache where `--cache` gives no S. `InputError` for a cache that
    could do nothing: no model with a load from the shared repository to save, or no
    local load time to load at."""
    every, named = load_s
    from_history = figures(history, timing.triton_ready_s) if history is not None else {}
    loads: dict[str, float] = {}
    whence: set[str] = set()
    for m in models:
        fig = from_history.get(m, {}).get("shared")
        if m in named or every is not None:
            value, source = named.get(m, every or 0.0), "--load-s"
        elif fig is not None:
            value, source = fig.seconds, "lease history"
        else:
            continue
        if value:
            loads[m] = value
            whence.add(source)
    notes: dict[str, object] = {}
    if loads:
        timing = replace(timing, model_load_s=loads)
        notes["model_load_s_from"] = ", else ".join(sorted(whence))
    local: dict[str, float] = {}
    if cache.on:
        named_cache = f"--cache {cache}"
        check_cache(cache, history=history is not None)
        if not loads:
            where = "--load-s" if history is None else "--load-s, or the loads --timing leases read"
            raise InputError(
                f"{named_cache}: no simulated model has a load time from the shared "
                f"repository ({where}), so a cache has nothing to save: give --load-s"
            )
        if cache.local_s is not None:
            local = dict.fromkeys(models, cache.local_s)
        else:
            simulated = set(models)
            local = {
                m: kinds["local"].seconds
                for m, kinds in from_history.items()
                if m in simulated and "local" in kinds
            }
            if not local:
                raise InputError(
                    f"{named_cache}: the lease history holds no load from a node's cache "
                    f"(source {LOCAL}) of a simulated model ({', '.join(models)}): give "
                    f"--cache {cache}:S"
                )
        notes["cache"] = {
            "value": str(cache),
            "local_load_s_from": "--cache" if cache.local_s is not None else "lease history",
        }
    timing = with_cache(timing, cache, local)
    if history is not None:
        notes["load_history"] = {
            "source": "model load history (the daemon's stored measures)",
            "triton_ready_s_subtracted": round(timing.triton_ready_s, 3),
            **_history_notes(from_history, models, named, every, cache),
        }
    return timing, notes


def _history_notes(
    from_history: Mapping[str, Mapping[str, LoadFigure]],
    models: Sequence[str],
    named: Mapping[str, float],
    every: float | None,
    cache: CacheOption,
) -> dict[str, object]:
    """The figures the history gave, each with what the run made of it."""
    simulated = set(models)
    shown: dict[str, object] = {}
    for model, kinds in from_history.items():
        if model not in simulated:
            continue
        row: dict[str, object] = {}
        for kind, fig in kinds.items():
            if kind == "shared":
                given = model in named or every is not None
                use = "not used: --load-s gives it" if given else "model_load_s"
            elif not cache.on:
                use = "not used: --cache off"
            else:
                use = "not used: --cache gives S" if cache.local_s is not None else "local_load_s"
            row[kind] = {
                "source": fig.source,
                "measured_s": round(fig.measured_s, 3),
                "measures": fig.measures,
                "seconds": round(fig.seconds, 3),
                "use": use,
            }
        shown[model] = row
    return {
        "models": shown,
        "not_simulated": sorted(set(from_history) - simulated),
    }


def read_load_measures(url: str) -> dict[str, list[tuple[str, float]]]:
    """Per model, the load measures stored in the bridge's database at `url`
    (`LoadStore.measures`: the newest of each model, oldest first)."""
    return read_database(
        url, "lease database", "the model load times", lambda e: LoadStore(e).measures()
    )


__all__ = ["DIRECT", "LoadFigure", "check_cache", "figures", "load_timing", "read_load_measures"]
