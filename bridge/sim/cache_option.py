"""`--cache`: the node-local weight caches a run is given (`bridge.sim.weights`), as
`stb simulate` and `bench/elasticity.py` take them, in one place: `parse_cache` reads the
option's value into a `CacheOption`, `with_cache` puts it into a `Timing`. Pure. Called
by `bridge.sim.inputs.loads` (the CLI's timing) and the bench.

The values:

- `off`: no cache; every load is from the shared repository (`Timing.model_load_s`);
- `N:S`: each node keeps the weights of the N models it served last and loads them from
  its cache in S seconds (`Timing.cache_models`, `Timing.local_load_s`);
- `stage:N:S`: the same cache, N models' weights a node (`model_bytes` each), with the
  bridge staging weights ahead of the forecast's lends at `stage_bytes_s` a node
  (`Timing.weights`, a `WeightCache` with staging);
- `N`, `stage:N` (where the caller allows it: `stb simulate --timing leases`): the same
  caches, each model's S read from the loads the daemon measured from a node's cache.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from bridge.sim.setup import Timing
from bridge.sim.weights import DEFAULT_MODEL_BYTES, DEFAULT_STAGE_BYTES_S, WeightCache

#: what the option takes, as its error says it
FORMS = "off, N:S or stage:N:S (N models a node keeps, S seconds a load from its cache takes)"
#: the same where S may come from the lease history
FORMS_HISTORY = (
    "off, N:S, stage:N:S (N models a node keeps, S seconds a load from its cache takes), "
    "or N, stage:N (S from the lease history: --timing leases)"
)


@dataclass(frozen=True)
class CacheOption:
    """`--cache`'s value (the module docstring)."""

    #: models whose weights a node keeps (0: no cache)
    models: int = 0
    #: seconds a load from a node's cache takes, every model; None: each model's own,
    #: from the lease history
    local_s: float | None = None
    #: the bridge stages weights ahead of need
    staging: bool = False

    @property
    def on(self) -> bool:
        return self.models > 0

    def __str__(self) -> str:
        if not self.on:
            return "off"
        seconds = "" if self.local_s is None else f":{self.local_s:g}"
        return f"{'stage:' if self.staging else ''}{self.models}{seconds}"


OFF = CacheOption()


def parse_cache(text: str, option: str = "--cache", *, history: bool = False) -> CacheOption:
    """`off`, `N:S` or `stage:N:S` (with `history`, also `N` and `stage:N`: S from the
    lease history): ValueError naming `option` and the value."""
    raw = text.strip()
    if raw == "off":
        return OFF
    forms = FORMS_HISTORY if history else FORMS
    staging = raw.startswith("stage:")
    parts = raw.removeprefix("stage:").split(":")
    if len(parts) not in ((1, 2) if history else (2,)):
        raise ValueError(f"{option} {text!r}: give {forms}")
    try:
        models = int(parts[0])
        seconds = float(parts[1]) if len(parts) == 2 else None
    except ValueError:
        raise ValueError(f"{option} {text!r}: give {forms}") from None
    if models < 1:
        raise ValueError(f"{option} {text!r}: N, the models a node keeps, must be at least 1")
    if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(
            f"{option} {text!r}: S, the seconds a load from the cache takes, must be a number >= 0"
        )
    return CacheOption(models, seconds, staging)


def with_cache(
    timing: Timing,
    cache: CacheOption,
    local_load_s: Mapping[str, float],
    *,
    model_bytes: float = DEFAULT_MODEL_BYTES,
    stage_bytes_s: float = DEFAULT_STAGE_BYTES_S,
) -> Timing:
    """`timing` with `cache`'s caches and each model's load from a node's cache
    (`local_load_s`; a model not in it loads from the cache at its `model_load_s`).
    Staging sizes every model at `model_bytes` (a node's budget: `cache.models` of them)
    copied at `stage_bytes_s` a node. `off`: `timing` without a cache."""
    if not cache.on:
        return replace(timing, cache_models=0, local_load_s={}, weights=None)
    if cache.staging:
        weights = WeightCache(
            default_bytes=model_bytes,
            budget_bytes=cache.models * model_bytes,
            stage_bytes_s=stage_bytes_s,
        )
        return replace(timing, cache_models=0, local_load_s=dict(local_load_s), weights=weights)
    return replace(timing, cache_models=cache.models, local_load_s=dict(local_load_s), weights=None)


__all__ = ["FORMS", "FORMS_HISTORY", "OFF", "CacheOption", "parse_cache", "with_cache"]
