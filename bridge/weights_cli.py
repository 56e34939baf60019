"""`stb weights status | stage | verify | evict | manifest`: the node-local weight cache
by hand. Thin: calls `bridge.weights` (the files; `bridge.weights.view`, the per-version
summary `stb status` also shows), `bridge.slurm.staging` (a staging job, `stage --job
NODE`) and the catalogue (`bridge.leases.weights`), prints plain lines.

Paths default to `[weights]`: `cache_root` (this host's cache, or the nodes' when run on
one) and `source` (else `triton.model_repository`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from bridge.cli_text import fail, say
from bridge.config import BridgeConfig
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.db import make_engine
from bridge.leases.schema import create_schema
from bridge.leases.weights import WeightStore, WeightStoreError
from bridge.slurm.errors import SlurmError
from bridge.slurm.select import open_backend
from bridge.slurm.staging import staging_job, submit_staging
from bridge.weights import manifest as mf
from bridge.weights.stage import StageError, copies, evict, stage, version_dir
from bridge.weights.view import cache_view, read_jobs

console = Console()
weights_app = typer.Typer(
    help="The node-local weight cache: copies of model versions on lendable nodes.",
    no_args_is_help=True,
)
CacheOpt = Annotated[
    Path | None, typer.Option("--cache-root", help="Cache folder (default: [weights] cache_root).")
]
Model = Annotated[str, typer.Argument(help="Model name.")]
Version = Annotated[int, typer.Argument(help="Version number.")]


def _cache(cfg: BridgeConfig, cache_root: Path | None) -> Path:
    root = cache_root or cfg.weights.cache_root
    if root is None:
        raise fail("no cache: give --cache-root or set [weights] cache_root")
    return root


def _source(cfg: BridgeConfig, source: str | None) -> str:
    return source or cfg.weights.source or str(cfg.triton.model_repository)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@weights_app.command()
def status(
    cache_root: CacheOpt = None,
    verify: Annotated[bool, typer.Option(help="Read every file against its manifest.")] = False,
    catalogue: Annotated[
        bool, typer.Option(help="Also list the copies the bridge's database records.")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """The copies in this host's cache (and, with --catalogue, every node's: per version
    the nodes holding it and the staging jobs in flight, then each catalogue row)."""
    cfg = load_or_exit(config)
    root = _cache(cfg, cache_root)
    found = copies(root)
    if not found:
        say(console, f"{root}: no copies")
    for c in found:
        state = ""
        if verify:
            v = mf.verify(c.path, c.model, c.version)
            state = " verified" if v.ok else f" REFUSED: {v.reason}"
        say(
            console,
            f"{c.model} {c.version}: {_mb(c.total_bytes)} digest {c.digest[:12]} "
            f"staged {c.staged_at} from {c.source}{state}",
        )
    if catalogue:
        engine = make_engine(cfg.database_url)
        try:
            create_schema(engine)
            rows = WeightStore(engine).copies()
            # per version, as `stb status` shows it (bridge.weights.view), then each row
            for line in cache_view(rows, *read_jobs(open_backend())).lines():
                say(console, line)
            for r in rows:
                say(
                    console,
                    f"{r.node} {r.model} {r.version}: {r.state} {_mb(r.size_bytes)} "
                    f"job {r.job_id or '-'} staged {r.staged_at} verified {r.verified_at}"
                    f"{' (' + r.reason + ')' if r.reason else ''}",
                )
        finally:
            engine.dispose()


@weights_app.command("stage")
def stage_cmd(
    model: Model,
    version: Version,
    source: Annotated[
        str | None, typer.Option(help="Shared repository folder or http(s) origin.")
    ] = None,
    cache_root: CacheOpt = None,
    bandwidth: Annotated[
        float | None, typer.Option(help="Bytes a second (default: [weights] bandwidth_bytes_s).")
    ] = None,
    job: Annotated[
        str | None, typer.Option(help="Submit a staging Slurm job on this node instead.")
    ] = None,
    partition: Annotated[
        str | None, typer.Option(help="With --job: its partition (default: [weights]).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Copy a version into the cache here, or (--job NODE) as a Slurm job on NODE."""
    cfg = load_or_exit(config)
    src = _source(cfg, source)
    if job is not None:
        root = _cache(cfg, cache_root)
        weights = cfg.weights.model_copy(update={"cache_root": root})
        try:
            spec = staging_job(
                weights,
                node=job,
                model=model,
                version=version,
                source=src,
                account=cfg.triton.account,
                partition=partition,
                log_dir=cfg.triton.log_dir,
            )
            job_id = submit_staging(open_backend(), spec)
        except (ValueError, SlurmError) as exc:
            raise fail(exc) from exc
        say(console, f"staging job {job_id} ({spec.name}) on {job}")
        # in the catalogue, so the daemon reads the job's outcome as it does its own
        path = version_dir(root, model, version)
        engine = make_engine(cfg.database_url)
        try:
            create_schema(engine)
            WeightStore(engine).begin(job, model, version, str(path), mf.now(), job_id)
        except (SQLAlchemyError, WeightStoreError) as exc:
            say(console, f"warning: not recorded in the catalogue ({exc}); the job runs")
        finally:
            engine.dispose()
        return
    root = _cache(cfg, cache_root)
    rate = cfg.weights.bandwidth_bytes_s if bandwidth is None else bandwidth
    try:
        s = stage(src, root, model, version, rate, budget_bytes=cfg.weights.budget_bytes)
    except (StageError, mf.ManifestError, OSError) as exc:
        raise fail(exc) from exc
    what = f"copied in {s.seconds:.1f} s" if s.copied else "already there and intact"
    say(console, f"{model} {version}: {_mb(s.total_bytes)} at {s.path}, {what}")


@weights_app.command("verify")
def verify_cmd(
    model: Model, version: Version, cache_root: CacheOpt = None, config: ConfigOpt = None
) -> None:
    """Check a copy against its manifest (size and sha256 of every file); exit 1 if refused.
    Renews the copy's stamp (what a Triton job's start checks) when intact, removes it
    when not, so that a change the file system did not record is refused at start too."""
    cfg = load_or_exit(config)
    path = version_dir(_cache(cfg, cache_root), model, version)
    v = mf.verify(path, model, version)
    try:
        if v.ok and v.manifest is not None:
            mf.write_stamp(path, v.manifest)
        else:
            (path / mf.STAMP).unlink(missing_ok=True)
    except OSError as exc:
        say(console, f"{model} {version}: its stamp could not be written: {exc}")
    if not v.ok:
        raise fail(f"{model} {version} refused: {v.reason}")
    say(console, f"{model} {version}: intact ({v.reason})")


@weights_app.command("evict")
def evict_cmd(
    model: Model, version: Version, cache_root: CacheOpt = None, config: ConfigOpt = None
) -> None:
    """Remove a version's copy from the cache."""
    cfg = load_or_exit(config)
    try:
        freed = evict(_cache(cfg, cache_root), model, version)
    except (StageError, OSError) as exc:
        raise fail(exc) from exc
    say(
        console, f"{model} {version}: {'evicted, ' + _mb(freed) + ' freed' if freed else 'no copy'}"
    )


@weights_app.command("manifest")
def manifest_cmd(
    model: Model,
    version: Version,
    repository: Annotated[
        Path | None, typer.Option(help="Shared repository (default: triton.model_repository).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Write the manifest of a version already in the shared repository (publish writes
    it for new versions)."""
    cfg = load_or_exit(config)
    folder = (repository or cfg.triton.model_repository) / model / str(version)
    try:
        m = mf.write_manifest(folder, model, version)
    except (mf.ManifestError, OSError) as exc:
        raise fail(exc) from exc
    say(
        console,
        f"{folder / mf.MANIFEST}: {len(m.files)} file(s), {_mb(m.total_bytes)}, "
        f"digest {m.digest[:12]}",
    )
