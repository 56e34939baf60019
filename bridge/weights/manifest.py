"""The manifest of a model version's files, and `verify`, the check before any use.

`stb-weights.json` sits in a version's folder (`<repo>/<model>/<version>/`) in the shared
repository (written at publish: `write_manifest`) and in every node-local copy (the
source's manifest, with `staged_at` and `source` filled in by `bridge.weights.stage`):

    {"model": "weighty", "version": 1,
     "files": [{"path": "weights.bin", "size": 209715200, "sha256": "..."}, ...],
     "total_bytes": 209715300, "digest": "<sha256 over the file list>",
     "staged_at": "2027-01-04T12:00:00+00:00", "source": "http://127.0.0.1:8090"}

`digest` is the sha256 of one line `path<TAB>size<TAB>sha256` per file, sorted by path: a
copy's identity, stored in the catalogue (`bridge.leases.weights`) and compared across
nodes without reading any weights.

`verify(copy)` reads every listed file and refuses the copy, with a reason, when one is
missing, has another size or another sha256, or when the manifest is missing, unreadable
or inconsistent (its digest is not its list's). Files the manifest does not list are
ignored (the Python backend writes `__pycache__` beside model.py). Pure file reading:
no network, no database; used by the stage CLI, the Triton job's overlay and the lab.

A full verification of a node-local copy leaves a stamp, `.stb-verified.json`: the
manifest's digest and each file's size, mtime, ctime and inode as they were when every
byte matched. `verify(copy, stamp=True)` (a Triton job's start, `[weights] verify =
"stamp"`) takes a copy whose files all still have that identity as verified without
reading them: any write, truncation, replacement, `touch` or `utime` changes the ctime,
which no user can set back. What it does not see is a change below the file system
(a disk's bit rot, a write to the raw device): `stb weights verify` and every staging
job's pass over an existing copy read every byte, and `verify = "full"` does at each
start (1.4 s for 2 GB on the lab, against 0.05 s).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

#: the manifest's file name inside a version folder
MANIFEST = "stb-weights.json"
#: a full verification's stamp in a node-local copy (module docstring)
STAMP = ".stb-verified.json"
#: files and folders of a version that a manifest never lists
SKIP = frozenset({MANIFEST, STAMP, "__pycache__"})
#: read size when hashing (large enough for disk throughput, small for memory)
CHUNK = 4 << 20


class ManifestError(RuntimeError):
    """A manifest cannot be written, read or trusted; the message says which and why."""


@dataclass(frozen=True)
class FileEntry:
    #: the path inside the version folder, '/'-separated, never absolute or with '..'
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    model: str
    version: int
    files: tuple[FileEntry, ...]
    total_bytes: int
    digest: str
    #: when this copy was staged (None in the shared repository's own manifest)
    staged_at: str | None = None
    #: where this copy came from: a folder or an origin URL (None in the shared repository)
    source: str | None = None

    def to_json(self) -> str:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return json.dumps(data, indent=1) + "\n"

    def staged(self, at: datetime, source: str) -> Manifest:
        """This manifest as a node-local copy's: when and from where it was staged."""
        return replace(self, staged_at=at.isoformat(), source=source)


@dataclass(frozen=True)
class Verdict:
    """The outcome of `verify`: ok, or the reason the copy is refused."""

    ok: bool
    reason: str
    manifest: Manifest | None = None
    #: taken on its stamp, unread: when the full verification it rests on was
    stamped_at: str | None = None


def list_digest(files: tuple[FileEntry, ...]) -> str:
    lines = "".join(
        f"{f.path}\t{f.size}\t{f.sha256}\n" for f in sorted(files, key=lambda f: f.path)
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def file_sha256(path: Path, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return h.hexdigest()


def safe_path(rel: str) -> PurePosixPath:
    """`rel` as a relative path inside a version folder; ManifestError for an absolute
    path, '..', an empty part or a NUL (a manifest from an origin is not trusted)."""
    p = PurePosixPath(rel)
    if (
        not rel
        or "\x00" in rel
        or p.is_absolute()
        or any(part in ("", "..", ".") for part in rel.split("/"))
    ):
        raise ManifestError(f"manifest path {rel!r} is not a plain relative path")
    return p


def build(folder: Path, model: str, version: int) -> Manifest:
    """The manifest of the version folder `folder` (every regular file but `SKIP`;
    ManifestError for a symbolic link or another special file)."""
    if not folder.is_dir():
        raise ManifestError(f"{folder}: not a directory")
    files = []
    for dirpath, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP)
        for name in sorted(names):
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if rel in SKIP:
                continue
            if path.is_symlink() or not path.is_file():
                raise ManifestError(f"{path}: not a regular file (a manifest lists files only)")
            files.append(FileEntry(rel, path.stat().st_size, file_sha256(path)))
    entries = tuple(sorted(files, key=lambda f: f.path))
    return Manifest(model, version, entries, sum(f.size for f in entries), list_digest(entries))


def _write_atomic(target: Path, text: str) -> Path:
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def write(folder: Path, manifest: Manifest) -> Path:
    """Write `manifest` into `folder` atomically (temp file, fsync, rename)."""
    return _write_atomic(folder / MANIFEST, manifest.to_json())


def _identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def write_stamp(copy: Path, manifest: Manifest) -> Path:
    """Stamp `copy`, just verified in full against `manifest`: each file's identity
    (size, mtime, ctime, inode) now, for `verify(..., stamp=True)`."""
    data = {
        "digest": manifest.digest,
        "verified_at": now().isoformat(),
        "files": {f.path: _identity(copy / f.path) for f in manifest.files},
    }
    return _write_atomic(copy / STAMP, json.dumps(data, indent=1) + "\n")


def _stamped(copy: Path, manifest: Manifest) -> str | None:
    """When `copy`'s stamp was written, if every file of `manifest` still has the
    identity it stamped; None when it has no stamp, another, or a file changed since."""
    try:
        data = json.loads((copy / STAMP).read_text())
        if data["digest"] != manifest.digest:
            return None
        files = data["files"]
        for f in manifest.files:
            if files.get(f.path) != _identity(copy / f.path):
                return None
        return str(data["verified_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_manifest(folder: Path, model: str, version: int) -> Manifest:
    """Build and write the manifest of a version folder of the shared repository."""
    manifest = build(folder, model, version)
    write(folder, manifest)
    return manifest


def parse(text: str, where: str = "manifest") -> Manifest:
    """A manifest from its JSON; ManifestError naming what is wrong."""
    try:
        data: Any = json.loads(text)
        files = tuple(
            FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in data["files"]
        )
        m = Manifest(
            model=str(data["model"]),
            version=int(data["version"]),
            files=files,
            total_bytes=int(data["total_bytes"]),
            digest=str(data["digest"]),
            staged_at=data.get("staged_at"),
            source=data.get("source"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(
            f"{where}: not a weights manifest ({type(exc).__name__}: {exc})"
        ) from exc
    for f in m.files:
        safe_path(f.path)
        if f.size < 0 or len(f.sha256) != 64:
            raise ManifestError(f"{where}: entry {f.path!r} has a bad size or sha256")
    if m.digest != list_digest(m.files):
        raise ManifestError(f"{where}: its digest is not that of its file list (edited or torn)")
    if m.total_bytes != sum(f.size for f in m.files):
        raise ManifestError(f"{where}: total_bytes is not the sum of its files' sizes")
    return m


def read(folder: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from exc
    return parse(text, str(path))


def verify(
    copy: Path,
    model: str | None = None,
    version: int | None = None,
    progress: Callable[[int], None] | None = None,
    *,
    stamp: bool = False,
) -> Verdict:
    """Whether the copy in `copy` is complete and intact: every file of its manifest
    present with its size and sha256 (and, when given, of `model` and `version`).
    `stamp`: a copy whose files are unchanged since its last full verification (its
    stamp, module docstring) is taken without reading them."""
    try:
        m = read(copy)
    except ManifestError as exc:
        return Verdict(False, str(exc))
    if model is not None and m.model != model:
        return Verdict(False, f"{copy}: the manifest is of model {m.model!r}, not {model!r}", m)
    if version is not None and m.version != version:
        return Verdict(False, f"{copy}: the manifest is of version {m.version}, not {version}", m)
    for f in m.files:  # sizes first: a partial copy is refused without hashing
        path = copy / f.path
        if path.is_symlink() or not path.is_file():
            return Verdict(False, f"{path}: missing (listed in the manifest)", m)
        size = path.stat().st_size
        if size != f.size:
            return Verdict(False, f"{path}: {size} bytes, the manifest says {f.size}", m)
    if stamp and (at := _stamped(copy, m)) is not None:
        return Verdict(
            True,
            f"{len(m.files)} file(s), {m.total_bytes} bytes, digest {m.digest[:12]}, unchanged "
            f"since verified at {at}",
            m,
            stamped_at=at,
        )
    for f in m.files:
        got = file_sha256(copy / f.path, progress)
        if got != f.sha256:
            return Verdict(
                False,
                f"{copy / f.path}: sha256 {got[:12]}..., the manifest says {f.sha256[:12]}...",
                m,
            )
    return Verdict(
        True, f"{len(m.files)} file(s), {m.total_bytes} bytes, digest {m.digest[:12]}", m
    )


def now() -> datetime:
    return datetime.now(UTC)
