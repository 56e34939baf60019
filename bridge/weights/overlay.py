"""The Triton job's view of the model repository: each model version from its verified
node-local copy where there is one, else from the shared repository.

`prepare(shared, cache_root, out, models)` builds, in the folder `out` (a job's own,
under `<cache_root>/.jobs/<job id>`), a repository of symbolic links:

- a model with no verified local copy of any of its versions: `out/<model>` links to the
  shared model folder (Triton sees it exactly as before, new versions included);
- a model with one: `out/<model>/` holds a link to the shared `config.pbtxt` and one link
  per version of the shared folder, to `<cache_root>/<model>/<version>` when that copy
  verifies (`bridge.weights.manifest.verify`: every file's size and sha256, or with
  `stamp` its files unchanged since a staging job or `stb weights verify` read them all),
  else to the shared version folder. A copy that does not verify is never used, and the reason is
  said. A version published after the job started is not in its view (the job is
  restarted, or the version staged, to serve it).

One `stb-weights:` line per model says what the served (highest) version is read from:
`stb-weights: model=<m> version=<v> source=local|shared path=<folder> reason=<why>`.
The job's log thus records the source of each model (`sources` reads it back).

`python -m bridge.weights.overlay` is run by `deploy/slurm/triton-server.sbatch` when
`STB_WEIGHTS_CACHE` is set; exit 0 with the overlay built, 2 when it could not be (the
job then serves from the shared repository).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bridge.weights import manifest as mf

#: job folders under `<cache_root>/.jobs` older than this are removed by the next job
STALE_JOB_S = 7 * 86400
LINE = re.compile(r"^stb-weights: model=(\S+) version=(\d+) source=(local|shared)\b", re.M)


@dataclass(frozen=True)
class Choice:
    model: str
    version: int | None
    source: str  # "local" | "shared"
    path: Path
    reason: str

    def line(self) -> str:
        return (
            f"stb-weights: model={self.model} version={self.version or 0} source={self.source} "
            f"path={self.path} reason={self.reason}"
        )


def _versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def prepare(
    shared: Path,
    cache_root: Path,
    out: Path,
    models: list[str] | None = None,
    *,
    stamp: bool = False,
) -> list[Choice]:
    """Build the overlay in `out` (module docstring); one Choice per model. `stamp`:
    take a copy unchanged since its last full verification without re-reading it
    (`bridge.weights.manifest.verify`)."""
    shared = shared.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    choices = []
    names = sorted(
        p.name
        for p in shared.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / "config.pbtxt").exists()
    )
    for name in names:
        src = shared / name
        versions = _versions(src)
        served = versions[-1] if versions else None
        if models is not None and name not in models:
            (out / name).symlink_to(src)  # not loaded at start: as it is
            continue
        local: dict[int, Path] = {}
        checked: dict[int, str] = {}  # how each local copy was found intact
        refused: dict[int, str] = {}
        for v in versions:
            copy = cache_root / name / str(v)
            if not copy.is_dir():
                continue
            verdict = mf.verify(copy, name, v, stamp=stamp)
            if verdict.ok:
                local[v] = copy.resolve()
                at = verdict.stamped_at
                checked[v] = "verified" if at is None else f"unchanged since verified at {at}"
            else:
                refused[v] = verdict.reason
        if not local:
            (out / name).symlink_to(src)
            why = refused.get(served or 0, "no local copy") if served is not None else "no version"
            choices.append(Choice(name, served, "shared", src / str(served or ""), why))
            continue
        (out / name).mkdir()
        (out / name / "config.pbtxt").symlink_to(src / "config.pbtxt")
        for v in versions:
            (out / name / str(v)).symlink_to(local.get(v, src / str(v)))
        assert served is not None
        if served in local:
            choices.append(Choice(name, served, "local", local[served], checked[served]))
        else:
            why = refused.get(served, "no local copy of the served version")
            choices.append(Choice(name, served, "shared", src / str(served), why))
    return choices


def sources(log_text: str) -> dict[str, tuple[int, str]]:
    """Per model, (version, source) as a Triton job's log says (`Choice.line`)."""
    return {m.group(1): (int(m.group(2)), m.group(3)) for m in LINE.finditer(log_text)}


#: how a lease's move to serving names its models' sources in the lease history
#: (`in_reason`, read back by `from_reason`): "weights: busy=local calm=shared"
REASON = re.compile(r"weights: ((?:\S+=(?:local|shared) ?)+)")


def in_reason(found: dict[str, tuple[int, str]]) -> str:
    """The lease history's words for a job's sources (`sources`); "" without any."""
    if not found:
        return ""
    return "weights: " + " ".join(f"{m}={src}" for m, (_, src) in sorted(found.items()))


def from_reason(reason: str) -> dict[str, str]:
    """Per model, its source as a lease history's reason says (`in_reason`)."""
    m = REASON.search(reason)
    if m is None:
        return {}
    return dict(part.split("=", 1) for part in m.group(1).split())


def _prune(jobs: Path, keep: Path) -> None:
    if not jobs.is_dir():
        return
    cutoff = time.time() - STALE_JOB_S
    for d in jobs.iterdir():
        if d != keep and d.lstat().st_mtime < cutoff:
            shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bridge.weights.overlay",
        description="Build a Triton job's model repository from node-local copies where verified.",
    )
    p.add_argument("--shared", required=True, type=Path, help="the shared model repository")
    p.add_argument("--cache-root", required=True, type=Path, help="this node's weight cache")
    p.add_argument("--out", required=True, type=Path, help="the job's repository folder to build")
    p.add_argument(
        "--models", default="*", help="models loaded at start, ';' or ',' between (*: all)"
    )
    p.add_argument(
        "--verify",
        choices=("stamp", "full"),
        default="stamp",
        help="stamp: a copy unchanged since its last full check is not re-read; full: "
        "every byte read at every start",
    )
    args = p.parse_args(argv)
    wanted = (
        None
        if args.models.strip() in ("", "*")
        else [m for m in re.split("[;,]", args.models) if m]
    )
    t0 = time.monotonic()
    try:
        _prune(args.out.parent, args.out)
        choices = prepare(
            args.shared, args.cache_root, args.out, wanted, stamp=args.verify == "stamp"
        )
    except OSError as exc:
        print(f"stb-weights: error: could not build {args.out}: {exc}", file=sys.stderr)
        return 2
    for c in choices:
        print(c.line(), flush=True)
    print(f"stb-weights: repository {args.out} ready in {time.monotonic() - t0:.2f}s", flush=True)
    os.utime(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
