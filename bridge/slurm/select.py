"""Choosing a Slurm backend: `STB_SLURM_BACKEND` = `cli` (default) or `pyslurm`.

Called where the daemon and the ledger are wired together. `cli` serves Slurm 22.05 and
later; `pyslurm` serves only the Slurm release its wheel was built for (25.11 for
pyslurm 25.11.x) and fails here with a message saying so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from bridge.slurm.cli import SlurmCLI
from bridge.slurm.protocol import SlurmProtocol

BACKENDS = ("cli", "pyslurm")


def open_backend(name: str | None = None, env: Mapping[str, str] | None = None) -> SlurmProtocol:
    """The backend called `name` (default: $STB_SLURM_BACKEND, else "cli")."""
    name = (name or os.environ.get("STB_SLURM_BACKEND") or "cli").strip().lower()
    if name == "cli":
        return SlurmCLI(env=env)
    if name == "pyslurm":
        try:
            from bridge.slurm.pyslurm_backend import PySlurm
        except ImportError as exc:
            raise ValueError(
                f"STB_SLURM_BACKEND=pyslurm, but pyslurm does not import ({exc}); it must be "
                "built for this site's Slurm release (pip install pyslurm==<release>)"
            ) from exc
        return PySlurm(sacct_env=env)
    raise ValueError(f"unknown Slurm backend {name!r}; choose one of {', '.join(BACKENDS)}")
