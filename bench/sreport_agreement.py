"""The ledger against sreport, hour by hour, on the lab's own history: for each completed
hour slurmdbd has rolled up, the ledger's allocated, down, planned-down, idle, planned and
reported GPU-seconds and its GPU-seconds per account beside `sreport -T gres/gpu cluster
Utilization` and `cluster AccountUtilizationByUser`.

The window is ingested afresh into a scratch SQLite ledger twice, in the same run:
  events    capacity and down time from slurmdbd's events (the ledger now)
  inventory capacity from the nodes the ingest sees (`[accounting] capacity =
            "inventory"`), each node from its first job run in the window or its first
            observation: the baseline, with no down time and no registration gaps
Each difference is listed with its cause. The lab must have run through at least one whole
hour (slurmdbd rolls an hour up a few minutes after it ends); hours not rolled up yet are
named and skipped.

Usage (lab up):  .venv/bin/python bench/sreport_agreement.py [--hours 6] [--window A..B]
Last line: `RESULT hours=N agreed=N baseline_agreed=N ...` (GPU-seconds summed over the
compared hours, each side).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from accounting.agreement import COLUMNS, Agreement, summarize
from accounting.buckets import floor_hour
from accounting.db import open_ledger
from accounting.report import Window
from bridge.lab.demo import lab_config
from bridge.lab.spec import LabSpec
from bridge.ledger.feed import ingest_window
from bridge.ledger.sreport import sreport_agreement
from bridge.paths import default_lab_dir
from bridge.slurm.cli import SlurmCLI


def _run(spec: LabSpec, folder: Path, name: str, start: datetime, end: datetime,
         *, events: bool) -> Agreement:  # fmt: skip
    config = lab_config(spec)
    engine = open_ledger(f"sqlite:///{folder / (name + '.db')}")
    slurm = SlurmCLI(env=spec.env())
    now = datetime.now(UTC)
    summary = ingest_window(config, slurm, engine, start, now, now=now, events=events)
    print(f"[{name}] ingest {start:%Y-%m-%dT%H:%M}..{now:%H:%M}: {summary.line()}", flush=True)
    return sreport_agreement(slurm, engine, spec.cluster, start, end)


def _table(name: str, agreement: Agreement) -> None:
    print(f"\n[{name}] per hour, GPU-seconds (ledger / sreport)")
    print("| hour (UTC) | " + " | ".join(COLUMNS) + " | accounts |")
    print("|---|" + "---|" * (len(COLUMNS) + 1))
    for hour, (led, srep) in sorted(agreement.figures.items()):
        cells = [
            f"{led.column(c):,}"
            + ("" if led.column(c) == srep.column(c) else f" / {srep.column(c):,}")
            for c in COLUMNS
        ]
        accts = sorted(a for a in set(led.accounts) | set(srep.accounts) if a != "root")
        same = all(led.accounts.get(a, 0) == srep.accounts.get(a, 0) for a in accts)
        acct = "equal" if same else "differ"
        print(f"| {hour:%m-%d %H:00} | " + " | ".join(cells) + f" | {len(accts)} {acct} |")
    for d in agreement.differences:
        print(f"  {d.hour:%m-%d %H:00} {d.what}: ledger {d.ledger:,} sreport {d.sreport:,} "
              f"({d.delta:+,}): {d.cause}")  # fmt: skip
    for hour, view in sorted(agreement.reconciled.items()):
        led = agreement.figures[hour][0]
        print(f"  {hour:%m-%d %H:00} reconciled by sreport's cluster-wide rules: "
              + ", ".join(f"{c} {led.column(c):,} -> {view.column(c):,}" for c in COLUMNS
                          if led.column(c) != view.column(c)))  # fmt: skip
    for p in agreement.pending:
        print(f"  {p.hour:%m-%d %H:00} pending (slurmdbd has not re-rolled it): "
              + ", ".join(f"{d.what} {d.delta:+,}" for d in p.differences)
              + "; changed runs: " + ", ".join(f"job {r.job_id}" for r in p.runs))  # fmt: skip
    if agreement.not_rolled:
        print(f"  not rolled up yet: {', '.join(f'{h:%H:00}' for h in agreement.not_rolled)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=int, default=6, help="the last N completed hours")
    ap.add_argument("--window", help="START..END on hours (UTC), instead of --hours")
    ap.add_argument("--lab-dir", type=Path, default=None)
    args = ap.parse_args()
    spec = LabSpec.load(args.lab_dir or default_lab_dir())
    if spec is None:
        print("no lab here: run `stb lab up` first", file=sys.stderr)
        return 2
    if args.window:
        w = Window.parse(args.window)
        start, end = w.start, w.end
    else:
        end = floor_hour(datetime.now(UTC))
        start = end - timedelta(hours=args.hours)
    with tempfile.TemporaryDirectory(prefix="stb-sreport-") as tmp:
        folder = Path(tmp)
        now_ = _run(spec, folder, "events", start, end, events=True)
        base = _run(spec, folder, "inventory", start, end, events=False)
    _table("events (the ledger now)", now_)
    _table("inventory (the ledger before)", base)
    if not now_.hours:
        print("no hour of the window is rolled up: run the lab through a whole hour first")
    figures = summarize(now_)
    base_figures = summarize(base)
    print(
        f"RESULT hours={len(now_.hours)} agreed={len(now_.agreed)} "
        f"baseline_agreed={len(base.agreed)} differences={len(now_.differences)} "
        f"baseline_differences={len(base.differences)} pending={len(now_.pending)} "
        f"reconciled={len(now_.reconciled)} "
        + " ".join(f"{k}={v}" for k, v in sorted(figures.items()))
        + f" baseline_ledger_idle_s={base_figures.get('ledger_idle_s', 0)}"
        f" baseline_ledger_reported_s={base_figures.get('ledger_reported_s', 0)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
