"""Test-suite wiring: the lab cluster as a session fixture, and `last` ordering.

The `lab` fixture brings the one-host lab up once per session (or reuses one that is
already up) and takes it down at the end if it started it. `STB_LAB_KEEP=1` keeps it up
for the next run. Tests marked `last` run after all others (the lab-down test).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bridge.lab import lab as lab_mod
from bridge.lab.spec import LabSpec
from bridge.paths import default_lab_dir, project_root

# The public traces of the workspace (development material beside the checkout, see
# shared/traces/SOURCES.md): the product finds traces only through $STB_TRACES_DIR, so the
# tests point it there when it exists; tests that need a trace skip without it.
_SHARED_TRACES = project_root().parent / "shared" / "traces"
if _SHARED_TRACES.is_dir():
    os.environ.setdefault("STB_TRACES_DIR", str(_SHARED_TRACES))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)


def _spec() -> LabSpec:
    lab_dir = default_lab_dir().resolve()
    return LabSpec.load(lab_dir) or LabSpec(lab_dir=lab_dir)


@pytest.fixture(scope="session")
def lab() -> Iterator[LabSpec]:
    spec = _spec()
    started = False
    if not (spec.lab_dir.joinpath("lab.json").exists() and lab_mod.is_up(spec)):
        lab_mod.up(spec, say=lambda m: print(f"lab: {m}"))
        started = True
    yield spec
    if started and os.environ.get("STB_LAB_KEEP") != "1":
        lab_mod.down(spec, say=lambda m: print(f"lab: {m}"))
