"""Test-suite wiring: the run's order and workers, and the lab cluster as a session fixture.

- Order: the tests that need the lab (under tests/lab and tests/faults, or marked `lab`) run
  after every other test, in collection order, and tests marked `last` (the MIG tests, which
  restart the lab with its node of MIG slices and back, then the lab-down test) at the very end.
- Workers: with pytest-xdist installed (the `dev` extra) a run is parallel by default, as if
  `-n 2 --dist loadgroup` were given, unless `-n` is (`-n 0`, or `-p no:xdist`, runs in one
  process: for debugging, `--pdb`, `--collect-only`). The lab's tests form one xdist_group
  that one worker runs whole, from the start, while the other workers run the unit and
  database tiers (`tests/serial_scheduling.py`), so the lab comes up once. A worker that
  runs a test outside the lab's folders lowers its CPU priority first (`UNIT_NICE`), so
  the lab's servers and load generator, whose latencies lab tests measure, come first.
- The `lab` fixture brings the one-host lab up once per session (or reuses one that is
  already up) and takes it down at the end if it started it. `STB_LAB_KEEP=1` keeps it up
  for the next run (and skips the lab-down test).

The quick loop, without the lab: `.venv/bin/python -m pytest -m "not lab"`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


#: workers of a run that does not say `-n` (the CI machines have 2 cores)
DEFAULT_WORKERS = 2
#: the scheduler's group of the tests that need the lab: one worker runs it whole, at once
LAB_GROUP = "lab"
#: the folders of the tests that need the lab (a test marked `lab` lives in one of them)
LAB_DIRS = tuple(Path(__file__).parent / name for name in ("lab", "faults"))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Parallel by default: `-n DEFAULT_WORKERS --dist loadgroup` unless `-n` is given,
    xdist is off (`-p no:xdist`), or this is an xdist worker, `--pdb` or `--collect-only`.
    Runs before xdist's own option handling (a conftest's tryfirst hook is called first)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    if hasattr(config, "workerinput"):
        return
    if config.option.numprocesses is None and not config.option.tx:
        if config.option.usepdb or config.option.collectonly:
            return
        config.option.numprocesses = DEFAULT_WORKERS
    if config.option.dist == "no" and config.option.numprocesses:
        config.option.dist = "loadgroup"  # never plain `load`: the lab's tests stay together


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` with the lab's group whole on one worker (tests/serial_scheduling.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.serial_scheduling import SerialFirstScheduling

    folders = tuple(f"{d.relative_to(config.rootpath).as_posix()}/" for d in LAB_DIRS)
    return SerialFirstScheduling(config, log, serial=LAB_GROUP, folders=folders)


def _in_lab_dirs(item: pytest.Item) -> bool:
    return any(item.path.is_relative_to(d) for d in LAB_DIRS)


#: how much a parallel worker lowers its CPU priority before its first test outside the
#: lab's folders (the lab runs beside it on another worker; see tests/serial_scheduling.py)
UNIT_NICE = 10
_reniced = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On an xdist worker, renice once before the first test outside the lab's folders (the
    processes it starts inherit it): the lab's tests, on the other worker, come first."""
    global _reniced
    if _reniced or _in_lab_dirs(item) or not hasattr(item.config, "workerinput"):
        return
    _reniced = True
    os.nice(UNIT_NICE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    outside = [i.nodeid for i in items if i.get_closest_marker("lab") and not _in_lab_dirs(i)]
    if outside:
        raise pytest.UsageError(
            f"tests marked lab must live under tests/lab or tests/faults (the scheduler runs "
            f"those folders last, on one worker): {', '.join(outside)}"
        )
    items.sort(key=lambda item: (_in_lab_dirs(item), item.get_closest_marker("last") is not None))


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
