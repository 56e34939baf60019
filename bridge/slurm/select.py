"""Choosing a Slurm backend: `STB_SLURM_BACKEND` = `cli` (default), `rest` or `pyslurm`.

Called where the daemon and the ledger are wired together. `cli` serves Slurm 22.05 and
later; `rest` serves a slurmrestd with Slurm 22.05's OpenAPI plugins (v0.0.38), settings
`STB_SLURM_REST_URL`, `_USER`, `_TOKEN` (or `SLURM_JWT`), `_TOKEN_LIFESPAN_S`, `_TIMEOUT_S`,
`_VERSION` (`bridge.slurm.rest.RestSettings`); `pyslurm` serves only the Slurm release
its wheel was built for (25.11 for pyslurm 25.11.x) and fails here with a message saying
so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from bridge.slurm.cli import SlurmCLI
from bridge.slurm.protocol import SlurmProtocol

BACKENDS = ("cli", "rest", "pyslurm")


def open_backend(name: str | None = None, env: Mapping[str, str] | None = None) -> SlurmProtocol:
    """The backend called `name` (default: $STB_SLURM_BACKEND, else "cli"). `env` is
    added to the Slurm commands' environment (e.g. SLURM_CONF); the `rest` backend reads
    its settings from it over the process's environment."""
    name = (name or os.environ.get("STB_SLURM_BACKEND") or "cli").strip().lower()
    if name == "cli":
        return SlurmCLI(env=env)
    if name == "rest":
        from bridge.slurm.rest import RestSettings, SlurmRest

        try:
            settings = RestSettings.from_env(os.environ | dict(env or {}))
        except ValueError as exc:
            raise ValueError(f"STB_SLURM_BACKEND=rest: {exc}") from exc
        return SlurmRest(settings, env=env)
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
