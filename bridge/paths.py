"""Where the project's own files are: the one place that knows the checkout layout.

Called by the lab and the CLI to find templates (`deploy/`), the model repository
(`triton_repo/`) and the default lab directory. `STB_HOME` overrides the checkout root
for an installed (non-editable) package.

Also the one copy of how a file is replaced: `write_whole`, what a command writes for a
person (`stb config init`'s TOML, the simulator's report, a saved Prometheus answer): a
temp file beside the target, then a rename, so a reader sees the old file or the new one
and a failure leaves neither a half-written file nor the temp file; and `fsync_dir`,
which makes a rename durable (the model repository, the routing files:
`bridge.routing.files` calls it best-effort).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
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


def write_whole(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `text` (UTF-8) to `path` whole or not at all: a temp file beside it, then a
    rename. `mode`: the file's permissions (None: those of an ordinary new file under the
    umask, not mkstemp's 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_dir(directory: Path) -> None:
    """Make the renames in `directory` durable (an OSError where the filesystem refuses)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
