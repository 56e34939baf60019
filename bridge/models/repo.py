"""Writing the Triton model repository so that Triton never sees a half-written model.

Layout: `<root>/<model>/config.pbtxt` and `<root>/<model>/<version>/...` (what Triton
reads); beside the repository, `<root's parent>/.<root's name>-archive/` holds what Triton
must not see: the publish lock, every published config by version, rolled-back versions
and retired models. A new version is copied into a staging directory inside the model
directory (not a number, so Triton ignores it), flushed, then renamed to its version
number in one `rename(2)`; the config is replaced the same way (write, fsync, `replace`).
Each committed version holds its weights manifest, `stb-weights.json` (`bridge.weights.
manifest`), written before the rename: what node-local copies are staged and verified by.

One publish at a time: `lock()` holds an flock on the archive's lock file; two publishes of
one model (or of two models) are serialized, never interleaved.

Nothing leaves the repository: every model name is checked to be one plain folder name
(`model_dir`: no '/', NUL or leading '.', so no '..') before a path is built from it, and a
published folder may hold only regular files and folders (`check_source`: a symbolic
link, wherever it points, a FIFO or a device is refused by name before anything is
copied; links are never followed while copying, and the staged copy is checked again).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from bridge.paths import fsync_dir
from bridge.weights import manifest as weights_manifest

#: files a model directory may hold besides its versions that are never copied
_SKIP = {"config.pbtxt", "__pycache__"}
#: the longest model name, in bytes (a file name's limit on Linux file systems)
MAX_NAME_BYTES = 255


class RepositoryError(RuntimeError):
    """The repository cannot be changed as asked; says why."""


@dataclass(frozen=True)
class Change:
    """What `commit` did, for `revert`."""

    name: str
    version: int
    #: the version Triton served before (None: the model is new)
    previous: int | None
    #: the config.pbtxt text before (None: the model is new)
    previous_config: str | None


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(path)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class ModelRepository:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.archive = self.root.parent / f".{self.root.name}-archive"

    # --- reading -----------------------------------------------------------------------

    def models(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and (p / "config.pbtxt").exists()
        )

    def model_dir(self, name: str) -> Path:
        """`<root>/<name>`; RepositoryError unless `name` is one plain folder name (not
        empty, no '/', '\\' or NUL, not starting with '.', at most `MAX_NAME_BYTES`)."""
        bad = (
            not name
            or name.startswith(".")
            or any(c in name for c in "/\\\x00")
            or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
        )
        if bad:
            shown = name if len(name) <= 80 else f"{name[:80]}... ({len(name)} chars)"
            raise RepositoryError(
                f"model name {shown!r} is not a plain folder name (no '/', '\\', NUL or "
                f"leading '.', at most {MAX_NAME_BYTES} bytes)"
            )
        return self.root / name

    def _archived(self, name: str) -> Path:
        return self.archive / self.model_dir(name).name

    def versions(self, name: str) -> list[int]:
        d = self.model_dir(name)
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())

    def latest(self, name: str) -> int | None:
        v = self.versions(name)
        return v[-1] if v else None

    def config_text(self, name: str) -> str | None:
        path = self.model_dir(name) / "config.pbtxt"
        return path.read_text() if path.exists() else None

    # --- writing -----------------------------------------------------------------------

    @contextmanager
    def lock(self, timeout_s: float = 600.0) -> Iterator[None]:
        """Hold the repository's publish lock; waits up to `timeout_s` for another one."""
        self.archive.mkdir(parents=True, exist_ok=True)
        with open(self.archive / "publish.lock", "a+") as handle:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RepositoryError(
                            f"another publish holds {self.archive / 'publish.lock'} "
                            f"for more than {timeout_s:g}s"
                        ) from None
                    time.sleep(0.2)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def stage(self, name: str, src: Path) -> Path:
        """Copy the version's files from `src` (everything but config.pbtxt; or, when `src`
        has numbered version folders, the highest one) into a staging folder Triton
        ignores; returns it. `src` must pass `check_source`."""
        check_source(src)
        content = _version_content(src)
        staging = self.model_dir(name) / f".staging-{secrets.token_hex(6)}"
        staging.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(
                content,
                staging,
                symlinks=True,  # never followed: one made since the check is caught below
                ignore=lambda d, names: [n for n in names if n in _SKIP],
            )
            check_source(staging)
            if not any(staging.iterdir()):
                raise RepositoryError(f"{src}: no model files to publish besides config.pbtxt")
            _fsync_tree(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return staging

    def commit(
        self,
        name: str,
        staging: Path,
        version: int,
        config_text: str,
        served_text: str | None = None,
    ) -> Change:
        """Make the staged version `version` visible (one rename), then the new config:
        `config_text` is the version's own (kept in the archive), `served_text`, when
        given, what Triton reads meanwhile (a rollout pins the old version with it)."""
        target = self.model_dir(name) / str(version)
        if target.exists():
            shutil.rmtree(staging, ignore_errors=True)
            raise RepositoryError(f"{name} version {version} already exists in {self.root}")
        # the version's weights manifest (bridge.weights): what staging jobs copy and
        # every node-local copy is verified against
        try:
            weights_manifest.write_manifest(staging, name, version)
        except (weights_manifest.ManifestError, OSError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise RepositoryError(f"{name} version {version}: no weights manifest: {exc}") from exc
        previous, previous_config = self.latest(name), self.config_text(name)
        configs = self._archived(name) / "configs"
        configs.mkdir(parents=True, exist_ok=True)
        if previous is not None and previous_config is not None:
            kept = configs / f"{previous}.pbtxt"
            if not kept.exists():
                write_atomic(kept, previous_config)
        write_atomic(configs / f"{version}.pbtxt", config_text)
        os.rename(staging, target)
        fsync_dir(target.parent)
        write_atomic(self.model_dir(name) / "config.pbtxt", served_text or config_text)
        return Change(name, version, previous, previous_config)

    def serve_config(self, name: str, text: str) -> None:
        """Replace what Triton reads as the model's config (atomically)."""
        write_atomic(self.model_dir(name) / "config.pbtxt", text)

    def revert(self, change: Change, why: str) -> None:
        """Undo `commit`: the version goes to the archive, the old config comes back (a
        new model leaves the repository altogether)."""
        self.set_aside(change.name, change.version, why)
        if change.previous_config is None:
            self.retire(change.name, f"first publish failed: {why}")
        else:
            write_atomic(self.model_dir(change.name) / "config.pbtxt", change.previous_config)

    def set_aside(self, name: str, version: int, why: str) -> Path:
        """Move a version out of Triton's sight, into the archive."""
        src = self.model_dir(name) / str(version)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        dest = self._archived(name) / "rejected" / f"{version}-{stamp}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while dest.exists():  # the same version set aside again within the second
            n += 1
            dest = dest.with_name(f"{version}-{stamp}-{n}")
        os.rename(src, dest)
        dest.with_name(f"{dest.name}.why").write_text(why + "\n")
        return dest

    def save_checks(self, name: str, version: int, text: str) -> None:
        """Keep a rollout's output checks (`bridge.models.checks`) beside the version's
        config in the archive."""
        checks = self._archived(name) / "checks"
        checks.mkdir(parents=True, exist_ok=True)
        write_atomic(checks / f"{version}.json", text)

    def checks_of(self, name: str, version: int) -> str | None:
        path = self._archived(name) / "checks" / f"{version}.json"
        return path.read_text() if path.exists() else None

    def config_of(self, name: str, version: int) -> str | None:
        path = self._archived(name) / "configs" / f"{version}.pbtxt"
        return path.read_text() if path.exists() else None

    def rollback(self, name: str, why: str) -> tuple[int, int]:
        """Set the latest version aside; the one before serves again, with its config.
        Returns (rolled back, now serving)."""
        versions = self.versions(name)
        if len(versions) < 2:
            raise RepositoryError(f"{name} has {len(versions)} version(s): nothing to roll back to")
        latest, previous = versions[-1], versions[-2]
        self.set_aside(name, latest, why)
        config = self.config_of(name, previous)
        if config is not None:
            write_atomic(self.model_dir(name) / "config.pbtxt", config)
        return latest, previous

    def retire(self, name: str, why: str) -> Path:
        """Move the whole model out of the repository, into the archive."""
        src = self.model_dir(name)
        if not src.is_dir():
            raise RepositoryError(f"no model {name!r} in {self.root}")
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        dest = self._archived(name) / "retired" / stamp
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, dest)
        (dest.parent / f"{stamp}.why").write_text(why + "\n")
        return dest


def check_source(src: Path) -> None:
    """RepositoryError naming the first entry under the folder `src` that is not a regular
    file or a folder: a symbolic link (wherever it points: copying it would bring in what
    lies outside `src`), a FIFO (copying would block), a device or a socket."""
    if not src.is_dir():
        raise RepositoryError(f"{src}: not a directory")

    def refuse(exc: OSError) -> NoReturn:
        raise RepositoryError(f"{exc.filename or src}: {exc.strerror or exc}") from exc

    for folder, dirs, files in os.walk(src, onerror=refuse):
        for entry in sorted(dirs + files):
            path = Path(folder) / entry
            try:
                mode = path.lstat().st_mode
                target = os.readlink(path) if stat.S_ISLNK(mode) else None
            except OSError as exc:
                refuse(exc)
            if target is not None:
                raise RepositoryError(
                    f"{path} is a symbolic link (to {target}): a model folder may hold only "
                    "regular files and folders"
                )
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise RepositoryError(
                    f"{path} is not a regular file or folder (a FIFO, device or socket)"
                )


def _version_content(src: Path) -> Path:
    if not src.is_dir():
        raise RepositoryError(f"{src}: not a directory")
    numbered = sorted(
        (p for p in src.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    return numbered[-1] if numbered else src
