"""Where the project's own files are: the one place that knows the checkout layout.

Called by the lab and the CLI to find templates (`deploy/`), the model repository
(`triton_repo/`) and the default lab directory. `STB_HOME` overrides the checkout root
for an installed (non-editable) package.
"""

from __future__ import annotations

import os
from pathlib import Path


class ProjectLayoutError(RuntimeError):
    """The project's files (deploy/, triton_repo/) cannot be found."""


def project_root() -> Path:
    """The checkout root: `$STB_HOME`, else the folder above the `bridge` package."""
    root = Path(os.environ.get("STB_HOME") or Path(__file__).resolve().parent.parent)
    if not (root / "deploy" / "lab" / "templates").is_dir():
        raise ProjectLayoutError(
            f"no deploy/lab/templates under {root}; set STB_HOME to the project checkout"
        )
    return root


def templates_dir() -> Path:
    return project_root() / "deploy" / "lab" / "templates"


def triton_sbatch() -> Path:
    return project_root() / "deploy" / "slurm" / "triton-server.sbatch"


def key_shim_source() -> Path:
    """The C source of the Triton key shim (`bridge.daemon.keyshim`)."""
    return project_root() / "deploy" / "slurm" / "stb-keyshim.c"


def slurm_plugins_dir() -> Path:
    """`slurm_plugins/`: job_submit.lua and the GPU sampler's Prolog/Epilog."""
    return project_root() / "slurm_plugins"


def model_repository() -> Path:
    return project_root() / "triton_repo"


def traces_dir() -> Path | None:
    """`$STB_TRACES_DIR`: a folder of arrival and job traces (the formats of
    `bridge.load.arrivals` and `bridge.sim.workload`) where a bare trace name is looked
    up; None when unset (the product ships no traces: give a path, or use a generator)."""
    env = os.environ.get("STB_TRACES_DIR")
    return Path(env) if env else None


def default_lab_dir() -> Path:
    """`$STB_LAB_DIR`, else `.lab` in the checkout (ignored by git)."""
    env = os.environ.get("STB_LAB_DIR")
    return Path(env).resolve() if env else project_root() / ".lab"
