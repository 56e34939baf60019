"""GPU usage: the records the GPU sampler's Epilog writes (slurm_plugins/gpu_sampler.py,
one JSON file per job and node in its spool folder) -> the `gpu_usage` table, and the
utilization of each job that reports use.

A record: {cluster, job_id, node, gpus: [ids], samples, mean_util_pct, max_mem_bytes,
start, end} (times ISO 8601 UTC). Idempotent by (cluster, job_id, node, start): a record
read twice changes nothing. A file that is not such a record is an error naming the file,
and nothing of the batch is written. Collecting the nodes' spool folders to one place
(rsync, a shared file system) is the site's; see slurm_plugins/README.md.

How reports use it: a job's utilization is the GPU-weighted mean of its nodes' records;
its ledger rows' GPU time times that share is "used", the rows of jobs that have a record
are "measured" (used / measured is the measured jobs' utilization).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select, tuple_, update

from accounting.buckets import utc
from accounting.errors import LedgerError
from accounting.schema import GpuUsage
from accounting.tables import batched
from bridge.db import write_transaction

USAGE = GpuUsage.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class UsageRecord:
    cluster: str
    job_id: str
    node: str
    start: datetime
    end: datetime
    gpus: int
    samples: int
    mean_util_pct: float | None
    max_mem_bytes: int | None


def parse_record(data: Any, where: str) -> UsageRecord:
    try:
        util = data["mean_util_pct"]
        mem = data["max_mem_bytes"]
        rec = UsageRecord(
            cluster=str(data["cluster"]),
            job_id=str(data["job_id"]),
            node=str(data["node"]),
            start=utc(datetime.fromisoformat(str(data["start"]).replace("Z", "+00:00"))),
            end=utc(datetime.fromisoformat(str(data["end"]).replace("Z", "+00:00"))),
            gpus=len(data["gpus"]),
            samples=int(data["samples"]),
            mean_util_pct=None if util is None else float(util),
            max_mem_bytes=None if mem is None else int(mem),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerError(f"{where}: not a GPU usage record ({type(exc).__name__}: {exc})") from exc
    if not rec.job_id or rec.end < rec.start:
        raise LedgerError(
            f"{where}: not a GPU usage record (no job id, or it ends before it starts)"
        )
    if rec.mean_util_pct is not None and not 0 <= rec.mean_util_pct <= 100:
        raise LedgerError(f"{where}: mean_util_pct {rec.mean_util_pct} is not a percentage")
    return rec


def read_spool(spool: Path) -> list[UsageRecord]:
    """Every `job-*.json` record in the spool folder."""
    if not spool.is_dir():
        raise LedgerError(f"GPU usage spool {spool} is not a directory")
    out = []
    for path in sorted(spool.glob("job-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LedgerError(f"{path}: not a GPU usage record ({exc})") from exc
        out.append(parse_record(data, str(path)))
    return out


def ingest_usage(engine: Engine, records: Iterable[UsageRecord], cluster: str = "") -> int:
    """Store the records (one transaction); returns how many were new or changed."""
    rows = {
        (r.cluster or cluster, r.job_id, r.node, r.start): {
            "cluster": r.cluster or cluster, "job_id": r.job_id, "node": r.node,
            "start": r.start, "end": r.end, "gpus": r.gpus, "samples": r.samples,
            "mean_util_pct": r.mean_util_pct, "max_mem_bytes": r.max_mem_bytes,
        }
        for r in records
    }  # fmt: skip
    changed = 0
    with write_transaction(engine) as conn:
        for part in batched(list(rows), 200):
            have = {
                (row.cluster, row.job_id, row.node, utc(row.start)): row
                for row in conn.execute(
                    select(USAGE).where(
                        tuple_(USAGE.c.cluster, USAGE.c.job_id, USAGE.c.node).in_(
                            [(c, j, n) for c, j, n, _ in part]
                        )
                    )
                )
            }
            for key in part:
                new, old = rows[key], have.get(key)
                if old is None:
                    conn.execute(USAGE.insert().values(**new))
                    changed += 1
                elif any(getattr(old, k) != v for k, v in new.items() if k != "start"):
                    conn.execute(update(USAGE).where(USAGE.c.id == old.id).values(**new))
                    changed += 1
    return changed


def utilization_by_job(engine: Engine) -> dict[tuple[str, str], float]:
    """(cluster, job_id) -> share of its allocated GPU time in use (0..1), GPU-weighted
    over its nodes' records; jobs whose records read nothing are absent."""
    acc: dict[tuple[str, str], list[float]] = {}
    with engine.connect() as conn:
        for row in conn.execute(
            select(USAGE.c.cluster, USAGE.c.job_id, USAGE.c.gpus, USAGE.c.mean_util_pct)
        ):
            if row.mean_util_pct is None or row.gpus <= 0:
                continue
            cell = acc.setdefault((row.cluster, row.job_id), [0.0, 0.0])
            cell[0] += row.gpus * row.mean_util_pct / 100.0
            cell[1] += row.gpus
    return {k: used / gpus for k, (used, gpus) in acc.items() if gpus}
