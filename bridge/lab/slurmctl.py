"""Runs Slurm's command-line tools against the lab (SLURM_CONF set), without a shell.

A narrow helper for bringing the lab up and for its tests; the daemon's full Slurm
adapter lives in `bridge.slurm`.
"""

from __future__ import annotations

import os
import subprocess

from bridge.lab.spec import LabSpec


class SlurmCommandError(RuntimeError):
    """A Slurm command failed; the message quotes the command and Slurm's words."""


def slurm(spec: LabSpec, *argv: str, timeout_s: float = 30.0, check: bool = True) -> str:
    env = os.environ | spec.env()
    try:
        done = subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(f"{' '.join(argv)} timed out after {timeout_s}s") from exc
    if check and done.returncode != 0:
        raise SlurmCommandError(
            f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or done.stdout).strip()}"
        )
    return done.stdout
