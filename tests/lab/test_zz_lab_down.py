"""`stb lab down` leaves no lab process behind. Runs last: it stops the lab."""

from __future__ import annotations

import os

import pytest

from bridge.lab import lab as lab_mod
from bridge.lab import system
from bridge.lab.procs import pid_alive
from bridge.lab.spec import LabSpec

pytestmark = [pytest.mark.lab, pytest.mark.last]


@pytest.mark.skipif(os.environ.get("STB_LAB_KEEP") == "1", reason="STB_LAB_KEEP=1 keeps the lab")
def test_down_leaves_no_lab_process(lab: LabSpec) -> None:
    before = lab_mod.lab_processes(lab)
    assert len(before) >= len(lab.nodes) + 3  # munged, slurmdbd, slurmctld, one slurmd each
    lab_mod.down(lab, say=print)
    assert lab_mod.lab_processes(lab) == []
    assert [p for p in before if pid_alive(p)] == []
    assert not system.port_open("127.0.0.1", lab.ctld_port)
    assert not system.port_open("127.0.0.1", lab.dbd_port)
    for node in lab.nodes:
        assert not system.port_open(node.addr, node.port)
    # Down twice is harmless, and status reports everything stopped.
    lab_mod.down(lab, say=print)
    assert all(d.pid is None for d in lab_mod.status(lab))
