"""The key shim: the small LD_PRELOAD library (`deploy/slurm/stb-keyshim.c`) that puts
the Triton model-control key into tritonserver's arguments inside the process, so the
key is on no command line and in no environment (docs/operators/security.md, the threat model).

`ensure_key_shim(cfg)` makes sure the library a Triton job preloads
(`TritonJobConfig.key_shim_path`) is there: `[triton] key_shim` when set (a site builds it
once, for its nodes), else built here with the C compiler next to the key file (where the
nodes already read the key from), again whenever the source is newer. Called when the
daemon starts and when the lab prepares Triton; the launcher only names the path.

Under a container runtime (`[triton] runtime`) the job binds the library into the
container at the same path and the image's own glibc loads it: it needs glibc 2.28 or
newer there (its newest symbol version; tests/unit/test_triton_runtimes.py checks), and
the job refuses to start tritonserver when the library did not load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bridge.config import TritonJobConfig
from bridge.paths import key_shim_source


class KeyShimError(RuntimeError):
    """The shim cannot be found or built; the message says why."""


def ensure_key_shim(cfg: TritonJobConfig) -> Path:
    """The shim library's absolute path; built if needed."""
    target = cfg.key_shim_path
    if cfg.key_shim is not None:
        if not target.is_file():
            raise KeyShimError(f"triton.key_shim {cfg.key_shim} does not exist")
        return target
    source = key_shim_source()
    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    return build(source, target)


def build(source: Path, target: Path) -> Path:
    """Compile `source` into `target` (written whole, then renamed into place)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise KeyShimError(
            f"no C compiler to build the key shim {source}: install gcc, or build it once "
            "and set triton.key_shim"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libstbkey-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, "-shared", "-fPIC", "-O2", "-o", tmp, str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise KeyShimError(f"building the key shim failed: {done.stderr.strip()[:500]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
