"""The argument checks the simulator's workload generators share (`bridge.sim.workload`):
each raises ValueError naming the argument and the value it got."""

from __future__ import annotations

import math
from collections.abc import Mapping


def positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def at_least(name: str, value: float, low: float) -> None:
    if not (math.isfinite(value) and value >= low):
        raise ValueError(f"{name} must be a finite number >= {low:g}, got {value!r}")


def share(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")


def check_models(models: Mapping[str, float]) -> None:
    for name, rate in models.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"models: a model name must be a non-empty string, got {name!r}")
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"models[{name!r}]: rate must be a finite number >= 0, got {rate!r}")


def check_series(
    models: Mapping[str, float], horizon_s: float, step_s: float, diurnal: float, weekly: float
) -> int:
    """Checks the arguments every series shares; returns its number of steps."""
    check_models(models)
    positive("horizon_s", horizon_s)
    positive("step_s", step_s)
    share("diurnal_amplitude", diurnal)
    share("weekly_amplitude", weekly)
    # ceil, forgiving float noise such as 1.1 / 0.1 = 11.000000000000002
    return max(1, math.ceil(horizon_s / step_s - 1e-9))


def check_load(horizon_s: float, capacity_gpus: int, target_load: float, gpn: int) -> float:
    """Checks the arguments every job list shares; returns the target GPU-seconds."""
    positive("horizon_s", horizon_s)
    positive("capacity_gpus", capacity_gpus)
    positive("target_load", target_load)
    positive("gpus_per_node", gpn)
    return target_load * capacity_gpus * horizon_s
