"""Staging a model version into a node's weight cache, and evicting it.

`stage(source, cache_root, model, version, bandwidth_bytes_s)` copies
`<source>/<model>/<version>/` (a folder of the shared repository, or an http(s) origin
serving it: its manifest first, then each file it lists) into
`<cache_root>/<model>/.partial-<version>-<random>/`, at most `bandwidth_bytes_s` bytes a
second (0: unthrottled), hashing each file as it arrives; a file whose size or sha256
differs from the manifest stops the copy. Then the copy's manifest (the source's, with
`staged_at` and `source`) is written, the whole copy is verified from disk
(`bridge.weights.manifest.verify`), and one `rename(2)` makes it
`<cache_root>/<model>/<version>/`. A crash at any point leaves at most a hidden partial
folder, which no reader takes for a copy and the next stage of that version removes.

One stage or eviction of a version at a time on a node: each holds an flock on
`<cache_root>/<model>/.<version>.lock`. A version already there and intact is not copied
again; one there but corrupt is replaced.

`python -m bridge.weights.stage` is what a staging Slurm job runs on its node
(`deploy/slurm/stage-weights.sbatch`): progress on stderr, one result line on stdout
(`stb-weights: staged model=... version=... bytes=... seconds=... digest=... path=...`),
exit 0 when the copy is in place and verified, 1 when the source's files do not match
their manifest, 2 for any other error (the message says which).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx

from bridge.paths import fsync_dir
from bridge.weights import manifest as mf

#: one progress report every this many seconds (the CLI's)
PROGRESS_EVERY_S = 1.0
#: seconds an origin may take to answer or send the next bytes
HTTP_TIMEOUT_S = 30.0

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class StageError(RuntimeError):
    """A version could not be staged or evicted; the message says which and why."""


class CorruptSource(StageError):
    """The source's bytes do not match its manifest: copying again will not help."""


@dataclass(frozen=True)
class Staged:
    model: str
    version: int
    path: Path
    total_bytes: int
    digest: str
    seconds: float
    #: False when an intact copy was already there (nothing copied)
    copied: bool


@dataclass(frozen=True)
class Copy:
    """A copy in a node's cache, as its manifest says (not verified)."""

    model: str
    version: int
    path: Path
    total_bytes: int
    digest: str
    staged_at: str | None
    source: str | None


class Throttle:
    """At most `rate` bytes a second on average since the first byte (0: no limit);
    `clock` and `sleep` are injectable for tests."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate < 0:
            raise ValueError(f"bandwidth must be >= 0 bytes/s, got {rate}")
        self.rate, self.clock, self.sleep = rate, clock, sleep
        self.start: float | None = None
        self.done = 0

    def took(self, n: int) -> None:
        if self.start is None:
            self.start = self.clock()
        self.done += n
        if self.rate > 0:
            ahead = self.done / self.rate - (self.clock() - self.start)
            if ahead > 0:
                self.sleep(ahead)


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _check_name(model: str, version: int) -> None:
    if not model or model.startswith(".") or any(c in model for c in "/\\\x00"):
        raise StageError(f"model name {model!r} is not a plain folder name")
    if version < 1:
        raise StageError(f"version must be a positive integer, got {version}")


def version_dir(cache_root: Path, model: str, version: int) -> Path:
    _check_name(model, version)
    return cache_root / model / str(version)


@contextlib.contextmanager
def version_lock(cache_root: Path, model: str, version: int) -> Iterator[None]:
    folder = cache_root / model
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{version}.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _source_manifest(
    source: str, model: str, version: int, client: httpx.Client | None
) -> mf.Manifest:
    if client is None:
        folder = Path(source) / model / str(version)
        if not folder.is_dir():
            raise StageError(f"{folder}: no such version folder in the shared repository")
        try:
            return mf.read(folder)
        except mf.ManifestError as exc:
            raise StageError(f"{exc} (publish writes it: `stb weights manifest`)") from exc
    url = _url(source, model, version, mf.MANIFEST)
    try:
        r = client.get(url)
    except httpx.HTTPError as exc:
        raise StageError(f"{url}: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise StageError(f"{url}: HTTP {r.status_code}")
    try:
        return mf.parse(r.text, url)
    except mf.ManifestError as exc:
        raise StageError(str(exc)) from exc


def source_manifest(source: str, model: str, version: int, timeout_s: float = 30.0) -> mf.Manifest:
    """A version's manifest at the shared repository `source` (a folder, or an http(s)
    origin serving it): what a copy of it is staged and verified against. StageError
    when it cannot be read."""
    if not is_url(source):
        return _source_manifest(source, model, version, None)
    with httpx.Client(timeout=timeout_s) as client:
        return _source_manifest(source, model, version, client)


def _url(source: str, model: str, version: int, rel: str) -> str:
    return f"{source.rstrip('/')}/{quote(model)}/{version}/{quote(rel)}"


def _chunks(
    source: str, model: str, version: int, rel: str, client: httpx.Client | None
) -> Iterator[bytes]:
    if client is None:
        path = Path(source) / model / str(version) / rel
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk
        except OSError as exc:
            raise StageError(f"{path}: {exc.strerror or exc}") from exc
        return
    url = _url(source, model, version, rel)
    try:
        with client.stream("GET", url) as r:
            if r.status_code != 200:
                raise StageError(f"{url}: HTTP {r.status_code}")
            yield from r.iter_bytes(1 << 20)
    except httpx.HTTPError as exc:
        raise StageError(f"{url}: {type(exc).__name__}: {exc}") from exc


def _copy_file(
    entry: mf.FileEntry,
    dest: Path,
    chunks: Iterator[bytes],
    throttle: Throttle,
    on_bytes: Callable[[int], None],
) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    size = 0
    with open(dest, "wb") as f:
        for chunk in chunks:
            size += len(chunk)
            if size > entry.size:
                raise CorruptSource(f"{entry.path}: more than the manifest's {entry.size} bytes")
            f.write(chunk)
            h.update(chunk)
            on_bytes(len(chunk))
            throttle.took(len(chunk))
        f.flush()
        os.fsync(f.fileno())
    if size != entry.size:
        raise CorruptSource(f"{entry.path}: {size} bytes arrived, the manifest says {entry.size}")
    if h.hexdigest() != entry.sha256:
        raise CorruptSource(
            f"{entry.path}: sha256 differs from the manifest's (the source is corrupt)"
        )


def used_bytes(cache_root: Path) -> int:
    """Bytes the complete copies under `cache_root` hold (their manifests' totals)."""
    return sum(c.total_bytes for c in copies(cache_root))


def stage(
    source: str,
    cache_root: Path,
    model: str,
    version: int,
    bandwidth_bytes_s: float = 0,
    *,
    budget_bytes: int | None = None,
    progress: Progress | None = None,
    throttle: Throttle | None = None,
) -> Staged:
    """Copy one version into the cache (module docstring); StageError says what failed,
    CorruptSource when the source does not match its manifest."""
    target = version_dir(cache_root, model, version)
    t0 = time.monotonic()
    with version_lock(cache_root, model, version):
        for stale in target.parent.glob(f".partial-{version}-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a crashed stage's (we hold the lock)
        if target.is_dir():
            verdict = mf.verify(target, model, version)
            if verdict.ok and verdict.manifest is not None:
                m = verdict.manifest
                mf.write_stamp(target, m)  # every byte just read: the start's check
                return Staged(model, version, target, m.total_bytes, m.digest, 0.0, False)
            _remove(target)  # corrupt or partial: staged afresh below
        with (
            httpx.Client(timeout=HTTP_TIMEOUT_S, follow_redirects=True)
            if is_url(source)
            else contextlib.nullcontext()
        ) as client:
            m = _source_manifest(source, model, version, client)
            if (m.model, m.version) != (model, version):
                raise StageError(f"the source's manifest is of {m.model} version {m.version}")
            if budget_bytes is not None:
                used = used_bytes(cache_root)
                if used + m.total_bytes > budget_bytes:
                    raise StageError(
                        f"{model} version {version} needs {m.total_bytes} bytes; the cache "
                        f"holds {used} of its budget {budget_bytes}: evict first"
                    )
            partial = target.parent / f".partial-{version}-{secrets.token_hex(4)}"
            partial.mkdir()
            try:
                done = 0

                def on_bytes(n: int) -> None:
                    nonlocal done
                    done += n
                    if progress is not None:
                        progress(done, m.total_bytes)

                pace = throttle or Throttle(bandwidth_bytes_s)
                for entry in m.files:
                    rel = mf.safe_path(entry.path)
                    chunks = _chunks(source, model, version, entry.path, client)
                    _copy_file(entry, partial.joinpath(*rel.parts), chunks, pace, on_bytes)
                mf.write(partial, m.staged(mf.now(), source))
                verdict = mf.verify(partial, model, version)
                if not verdict.ok:
                    raise StageError(f"the staged copy does not verify: {verdict.reason}")
                mf.write_stamp(partial, m)
                fsync_dir(partial)
                os.rename(partial, target)
                fsync_dir(target.parent)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
    return Staged(model, version, target, m.total_bytes, m.digest, time.monotonic() - t0, True)


def _remove(path: Path) -> None:
    """Take `path` out of sight in one rename, then delete it."""
    aside = path.parent / f".evicting-{path.name}-{secrets.token_hex(4)}"
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def evict(cache_root: Path, model: str, version: int) -> int:
    """Remove a version's copy (first out of sight, in one rename); the bytes its
    manifest said it held (0 when there was none)."""
    target = version_dir(cache_root, model, version)
    with version_lock(cache_root, model, version):
        if not target.exists():
            return 0
        try:
            size = mf.read(target).total_bytes
        except mf.ManifestError:
            size = 0
        _remove(target)
        return size


def copies(cache_root: Path) -> list[Copy]:
    """The complete copies under `cache_root` (version folders with a readable manifest),
    by model and version; nothing is verified."""
    out: list[Copy] = []
    if not cache_root.is_dir():
        return out
    for model_dir in sorted(
        p for p in cache_root.iterdir() if p.is_dir() and not p.name.startswith(".")
    ):
        for vdir in sorted(
            (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
            key=lambda p: int(p.name),
        ):
            try:
                m = mf.read(vdir)
            except mf.ManifestError:
                continue
            out.append(
                Copy(
                    model_dir.name,
                    int(vdir.name),
                    vdir,
                    m.total_bytes,
                    m.digest,
                    m.staged_at,
                    m.source,
                )
            )
    return out


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bridge.weights.stage",
        description="Copy a model version from the shared repository into this node's "
        "weight cache.",
    )
    p.add_argument(
        "--source", required=True, help="shared repository: a folder, or an http(s) origin URL"
    )
    p.add_argument("--cache-root", required=True, type=Path, help="this node's weight cache")
    p.add_argument("--model", required=True)
    p.add_argument("--version", required=True, type=int)
    p.add_argument(
        "--bandwidth", type=float, default=0, help="bytes a second at most (0: no limit)"
    )
    p.add_argument("--budget", type=int, default=None, help="bytes the cache may hold in all")
    p.add_argument(
        "--evict",
        action="append",
        default=[],
        metavar="MODEL/VERSION",
        help="a copy to remove first, for room (the daemon's cache plan); repeatable",
    )
    args = p.parse_args(argv)
    for item in args.evict:
        model, _, version = item.rpartition("/")
        try:
            freed = evict(args.cache_root, model, int(version))
        except (StageError, OSError, ValueError) as exc:
            print(f"stage: error: evicting {item!r}: {exc}", file=sys.stderr)
            return 2
        print(f"stb-weights: evicted model={model} version={version} bytes={freed}", flush=True)
    last = [0.0]
    t0 = time.monotonic()

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or done == total:
            last[0] = now
            rate = done / max(now - t0, 1e-9)
            print(
                f"stage: {args.model} {args.version}: {_mb(done)} of {_mb(total)} ({_mb(rate)}/s)",
                file=sys.stderr,
                flush=True,
            )

    try:
        s = stage(
            args.source,
            args.cache_root,
            args.model,
            args.version,
            args.bandwidth,
            budget_bytes=args.budget,
            progress=progress,
        )
    except CorruptSource as exc:
        print(
            f"stage: error: {args.model} version {args.version} from {args.source}: {exc}",
            file=sys.stderr,
        )
        return 1
    except (StageError, mf.ManifestError, OSError, ValueError) as exc:
        print(
            f"stage: error: {args.model} version {args.version} from {args.source}: {exc}",
            file=sys.stderr,
        )
        return 2
    print(
        f"stb-weights: staged model={s.model} version={s.version} bytes={s.total_bytes} "
        f"seconds={s.seconds:.2f} digest={s.digest} copied={'yes' if s.copied else 'no'} "
        f"path={s.path}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
