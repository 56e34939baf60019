"""Atomic file replacement for the routing outputs.

Called by `bridge.routing.nginxctl` (the nginx routing file) and `bridge.routing.http_sd`
(the service-discovery document): a reader sees the old file or the new one, never a
half-written one, and a crash leaves at most a stray temporary file next to it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from bridge import paths


def write_durably(path: Path, data: bytes) -> None:
    """Write `data` to `path` (created or truncated) and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Make renames in `directory` durable (best effort on filesystems that refuse)."""
    with contextlib.suppress(OSError):
        paths.fsync_dir(directory)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically: temporary file in the same directory,
    fsync, rename over `path`, fsync the directory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_durably(tmp, data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
