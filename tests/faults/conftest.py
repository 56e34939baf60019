"""Fixtures of the fault cases.

The lab fixtures are shared, not copied: `lab` comes from tests/conftest.py, and `bridge`
(a Reconciler wired to the lab, driven by `run_once`), `daemon_config` (a TOML for a real
`stb daemon`) and `triton_config` are imported from tests/lab/fixtures.py. Added here:

- `daemons`: starts `stb daemon` subprocesses and, at the end, stops them and cancels the
  Triton jobs and bridge reservations they left.
- `lab_restored` (autouse): whatever a case stopped (slurmctld, slurmdbd) runs again
  after it, pass or fail, so the next case and the next session find the lab whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from bridge.lab import lab as lab_mod
from bridge.lab.spec import LabSpec
from bridge.slurm.cli import SlurmCLI
from tests.lab.fixtures import audit_agrees, bridge, bridge_update, daemon_config, triton_config

from .tools import DaemonProc, lab_env, restart_lab

# the lab's fixtures, re-exported
__all__ = ["audit_agrees", "bridge", "bridge_update", "daemon_config", "triton_config"]


@pytest.fixture(autouse=True)
def lab_restored(lab: LabSpec) -> Iterator[None]:
    yield
    if not lab_mod.is_up(lab):
        restart_lab(lab)


@pytest.fixture
def daemons(lab: LabSpec, tmp_path: Path) -> Iterator[Callable[..., DaemonProc]]:
    """start(config, extra_env=None) -> a running `stb daemon` subprocess."""
    started: list[DaemonProc] = []

    def start(config: Path, extra_env: Mapping[str, str] | None = None) -> DaemonProc:
        env = lab_env(lab) | dict(extra_env or {})
        d = DaemonProc(config, env, tmp_path / f"daemon-{len(started)}.log").start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
    if lab_mod.is_up(lab):
        cli = SlurmCLI(env=lab.env())
        for job in cli.jobs(tag="stb:triton"):
            cli.cancel(job.job_id)
        for resv in cli.reservations():
            if resv.name.startswith("stb-lease-"):
                cli.delete_reservation(resv.name)
