"""The weight cache as the status commands show it: per model version, the nodes holding
a complete copy and the staging jobs in flight. Called by `stb status`
(`bridge.ops.cli`), `stb models status` (`bridge.models.status`) and `stb weights status
--catalogue` (`bridge.weights_cli`), which read the two sources and print `lines` (or
the JSON, `CacheView.to_json`).

- Complete copies, their size and failed stagings: the catalogue
  (`bridge.leases.weights.WeightStore`, table `weight_copy`).
- In flight: Slurm's staging jobs (comment `stb:staging`; `read_jobs`), each on the
  version its catalogue row names (matched by job id) or else its name names
  (`stb-staging-<model>-<version>`), on the node it runs on or asked for. External truth
  wins: a catalogue row `staging` whose job has ended is shown with Slurm's final state
  (`COMPLETED, not yet recorded`), or `not queued` once Slurm no longer lists it (the
  daemon's next staging pass reads its outcome); one staged by hand (no job) `by hand`.
  With Slurm not answering (`jobs` None) the catalogue's rows are all there is, each
  `unknown`, and the view's note says why.

`cache_view` is pure (rows and jobs in, a value out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bridge.leases.weights import WeightCopy
from bridge.slurm.errors import SlurmError
from bridge.slurm.model import STAGING_TAG, Job, staged_version
from bridge.slurm.protocol import SlurmProtocol

#: Slurm states of a staging job still in flight (squeue lists ended ones a while)
IN_FLIGHT = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED",
                       "RESIZING", "SUSPENDED", "STOPPED"})  # fmt: skip


@dataclass(frozen=True)
class Staging:
    """One staging of the version in flight."""

    node: str
    #: the Slurm job ("" when staged by hand)
    job_id: str
    #: Slurm's state (PENDING, RUNNING, ...), or `not queued`, `by hand`, `unknown`
    state: str
    #: when it started (running) or was submitted (pending); None: not known
    since: datetime | None = None


@dataclass(frozen=True)
class VersionCache:
    model: str
    version: int
    #: the nodes holding a complete copy (as the catalogue last recorded: a Triton job
    #: verifies it again before use)
    nodes: tuple[str, ...] = ()
    #: bytes of a complete copy (0: none complete yet)
    size_bytes: int = 0
    staging: tuple[Staging, ...] = ()
    #: (node, why) of the copies whose last staging or verify failed
    failed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CacheView:
    versions: tuple[VersionCache, ...] = ()
    #: what could not be read ("" when both sources answered)
    note: str = ""

    def of_model(self, model: str) -> CacheView:
        return CacheView(tuple(v for v in self.versions if v.model == model), self.note)

    def to_json(self) -> dict[str, Any]:
        return {
            "versions": [
                {
                    **asdict(v),
                    "nodes": list(v.nodes),
                    "staging": [
                        {**asdict(s), "since": s.since.isoformat() if s.since else None}
                        for s in v.staging
                    ],
                    "failed": [{"node": n, "reason": r} for n, r in v.failed],
                }
                for v in self.versions
            ],
            "note": self.note,
        }

    def lines(self) -> list[str]:
        """One line per version: `weighty 1: complete on n3, n4 (2.00 GB); staging on n5
        (job 41 RUNNING since 2026-12-04 10:02:03); failed on n6 (why)`."""
        out = []
        for v in self.to_json()["versions"]:
            model, version, *parts = cells(v)
            named = [
                f"{what} {text}"
                for what, text in zip(
                    ("complete on", "staging on", "failed on"), parts, strict=True
                )
                if text != "-"
            ]
            out.append(f"{model} {version}: " + ("; ".join(named) or "no copy"))
        if not self.versions:
            out.append("no copy and no staging job")
        if self.note:
            out.append(f"({self.note})")
        return out


def cells(version: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """A version of `CacheView.to_json` as text: model, version, the nodes complete (with
    the size), the stagings in flight, the failures ("-" for none). The status tables and
    `CacheView.lines` all show these."""
    nodes = version["nodes"]
    complete = f"{', '.join(nodes)} ({version['size_bytes'] / 1e9:.2f} GB)" if nodes else "-"
    staging = ", ".join(_staging_text(s) for s in version["staging"]) or "-"
    failed = ", ".join(f"{f['node']} ({f['reason']})" for f in version["failed"]) or "-"
    return version["model"], str(version["version"]), complete, staging, failed


def print_table(doc: dict[str, Any], out: Console, *, per_model: bool = True) -> None:
    """`CacheView.to_json` as the status commands print it: a "weight cache" table of
    `cells` (without the model column for one model's status, `per_model` False; there a
    line says when there is no version), and the view's note."""
    if doc["versions"]:
        head = ("model", "version") if per_model else ("version",)
        table = Table(*head, "complete on", "staging", "failed", title="weight cache")
        for version in doc["versions"]:
            table.add_row(*map(escape, cells(version)[0 if per_model else 1 :]))
        out.print(table)
    elif not per_model:
        out.print("weight cache: no copy and no staging job", highlight=False)
    if doc["note"]:
        out.print(f"[yellow]weight cache: {escape(doc['note'])}[/yellow]", soft_wrap=True)


def _staging_text(s: dict[str, Any]) -> str:
    job = f"job {s['job_id']} " if s["job_id"] else ""
    since = f" since {s['since'][:19].replace('T', ' ')}" if s["since"] else ""
    return f"{s['node']} ({job}{s['state']}{since})"


def read_jobs(slurm: SlurmProtocol) -> tuple[list[Job] | None, str]:
    """Slurm's staging jobs, or None and why not (Slurm not answering is said, not raised)."""
    try:
        return slurm.jobs(tag=STAGING_TAG), ""
    except SlurmError as exc:
        return None, f"Slurm's staging jobs not read: {exc}"


def cache_view(
    copies: Iterable[WeightCopy], jobs: Sequence[Job] | None, note: str = ""
) -> CacheView:
    """Per model version (by model, newest version first), its complete copies, stagings
    in flight and failures (module docstring); `jobs` None: Slurm's are unknown."""
    rows = list(copies)
    versions: dict[tuple[str, int], dict[str, Any]] = {}

    def slot(model: str, version: int) -> dict[str, Any]:
        return versions.setdefault(
            (model, version), {"nodes": [], "size": 0, "staging": [], "failed": []}
        )

    by_job = {r.job_id: r for r in rows if r.job_id and r.state == "staging"}
    ended_jobs = {j.job_id: j for j in jobs or () if j.state.upper() not in IN_FLIGHT}
    listed: set[str] = set()
    for job in jobs or ():
        if job.state.upper() not in IN_FLIGHT:
            continue
        row = by_job.get(job.job_id)
        found = (row.model, row.version) if row is not None else staged_version(job.name)
        if found is None:
            continue
        listed.add(job.job_id)
        node = row.node if row is not None else _node_of(job)
        since = job.start_time if job.state.upper() == "RUNNING" else job.submit_time
        slot(*found)["staging"].append(Staging(node, job.job_id, job.state.upper(), since))
    for r in rows:
        if r.state == "complete":
            s = slot(r.model, r.version)
            s["nodes"].append(r.node)
            s["size"] = max(s["size"], r.size_bytes)
        elif r.state == "failed":
            slot(r.model, r.version)["failed"].append((r.node, r.reason))
        elif r.state == "staging" and r.job_id not in listed:
            ended = ended_jobs.get(r.job_id)
            state = (
                "by hand" if not r.job_id
                else "unknown" if jobs is None
                else f"{ended.state.upper()}, not yet recorded" if ended is not None
                else "not queued"
            )  # fmt: skip
            slot(r.model, r.version)["staging"].append(
                Staging(r.node, r.job_id, state, r.updated_at)
            )
    out = tuple(
        VersionCache(
            model,
            version,
            tuple(sorted(s["nodes"])),
            s["size"],
            tuple(sorted(s["staging"], key=lambda x: (x.node, x.job_id))),
            tuple(sorted(s["failed"])),
        )
        for (model, version), s in sorted(versions.items(), key=lambda kv: (kv[0][0], -kv[0][1]))
    )
    return CacheView(out, note)


def _node_of(job: Job) -> str:
    nodes = job.nodes or job.requested_nodes
    return ",".join(nodes) if nodes else "?"


__all__ = [
    "IN_FLIGHT", "CacheView", "Staging", "VersionCache", "cache_view", "cells", "read_jobs",
]  # fmt: skip
