"""The daemon's control passes under sustained load: how many complete, how many fail.

Runs the real `stb daemon` (its APScheduler and worker threads) on the lab while an
open-loop load generator (`stb load`, loopback only, bounded in time and count) drives the
`echo` model through the daemon's nginx and operator lend/return cycles of the elastic
node run the whole time. Counts the passes by outcome (ok: no error; errors: completed
with a step error; failed: no pass, or a pass that raised) and the requests that failed.

Baseline in the same run: the same load and cycles against the daemon of another revision
(`--baseline-rev`, default the commit before the control-loop rework), checked out in a
temporary git worktree. That daemon has no `stb_ticks_total`; its failed passes are its
log's "tick failed" lines and its completed ones the tick-duration histogram's count.

Usage (lab up, root): .venv/bin/python bench/ticks.py [--minutes 4] [--rate 300]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bridge.lab import lab as lab_mod
from bridge.lab.demo import daemon_toml
from bridge.lab.spec import LabSpec
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.lifecycle import LeaseState
from bridge.paths import default_lab_dir, project_root
from bridge.slurm.cli import SlurmCLI
from bridge.slurm.model import TRITON_TAG

ROOT = project_root()
BASELINE_REV = "b4934eb"


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(spec: LabSpec, work: Path, tick_s: float) -> tuple[Path, str, str]:
    """A daemon configuration under `work`: (path, nginx listen, exporter address)."""
    listen, exporter = f"127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"
    path = work / "bridge.toml"
    path.write_text(
        daemon_toml(
            spec, work, listen=listen, exporter=exporter, tick_s=tick_s, ingest_interval_s=30
        )
    )
    return path, listen, exporter


def metrics(exporter: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://{exporter}/metrics", timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def cycles(db_url: str, node: str, stop: threading.Event, log: list[str]) -> None:
    """Operator lend, hold while serving, return; again until `stop`."""
    engine = make_engine(db_url)
    create_schema(engine)
    queue, store = RequestQueue(engine), LeaseStore(engine)

    def wait(cond: object, limit: float) -> bool:
        end = time.monotonic() + limit
        while time.monotonic() < end and not stop.is_set():
            if cond():  # type: ignore[operator]
                return True
            time.sleep(0.5)
        return False

    while not stop.is_set():
        queue.request_lend(node, ["echo"], datetime.now(UTC))
        if not wait(lambda: any(x.state == LeaseState.SERVING for x in store.open_leases()), 90):
            log.append("lend did not reach serving in 90 s")
        time.sleep(5)
        for lease in store.open_leases():
            assert lease.id is not None
            queue.request_return(lease.id, datetime.now(UTC))
        wait(lambda: not store.open_leases(), 90)
        log.append("cycle")


def run_variant(
    name: str, tree: Path, spec: LabSpec, args: argparse.Namespace, work: Path
) -> dict[str, float]:
    path, listen, exporter = write_config(spec, work, args.tick_s)
    env = dict(os.environ, PYTHONPATH=str(tree), **spec.env())
    daemon_log = work / "daemon.log"
    with daemon_log.open("w") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-c", "from bridge.cli import app; app()", "daemon", "-c", str(path)],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        end = time.monotonic() + 120  # the baseline server and routing come up first
        while time.monotonic() < end:
            try:
                if httpx.get(f"http://{listen}/v2/models/echo/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise SystemExit(f"{name}: echo not routed within 120 s; see {daemon_log}")
        before = metrics(exporter)
        log: list[str] = []
        stop = threading.Event()
        node = spec.pool_nodes("elastic")[0].name
        cycler = threading.Thread(
            target=cycles, args=(f"sqlite:///{work / 'bridge.db'}", node, stop, log)
        )
        cycler.start()
        seconds = args.minutes * 60
        load = subprocess.run(
            [
                str(ROOT / ".venv" / "bin" / "stb"),
                "load",
                "-e",
                listen,
                "--model",
                "echo",
                "--shape",
                "1,16",
                "--rate",
                str(args.rate),
                "--duration",
                str(seconds),
                "--max-requests",
                str(int(args.rate * seconds * 1.2) + 100),
                "--json",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        stop.set()
        cycler.join()
        after = metrics(exporter)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        cleanup(spec)
    report = json.loads(load.stdout)["total"] if load.stdout.strip() else {}
    text = daemon_log.read_text()

    def delta(key: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after.get((key, labels), 0.0) - before.get((key, labels), 0.0)

    if ("stb_ticks_total", (("outcome", "ok"),)) in after:
        ok = delta("stb_ticks_total", (("outcome", "ok"),))
        errors = delta("stb_ticks_total", (("outcome", "errors"),))
        failed = delta("stb_ticks_total", (("outcome", "failed"),))
    else:  # the baseline: completed passes and its log's failed ones
        ok, errors = delta("stb_tick_duration_seconds_count"), 0.0
        failed = float(text.count("tick failed"))
    return {
        "ticks": ok + errors + failed,
        "ok": ok,
        "errors": errors,
        "failed": failed,
        "cycles": float(log.count("cycle")),
        "requests": float(report.get("sent", 0)),
        "request_errors": float(sum((report.get("errors") or {}).values())),
        "greenlet_errors": float(text.count("Cannot switch to a different thread")),
    }


def cleanup(spec: LabSpec) -> None:
    cli = SlurmCLI(env=spec.env())
    for job in cli.jobs(tag=TRITON_TAG):
        cli.cancel(job.job_id)
    for resv in cli.reservations():
        if resv.name.startswith("stb-lease-"):
            cli.delete_reservation(resv.name)
    time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--rate", type=float, default=300.0, help="requests/s to echo")
    parser.add_argument("--tick-s", type=float, default=2.0)
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    args = parser.parse_args()
    spec = LabSpec.load(default_lab_dir().resolve())
    if spec is None or not lab_mod.is_up(spec):
        sys.exit("the lab is not up: run `stb lab up` first")
    cleanup(spec)
    results = {}
    with tempfile.TemporaryDirectory(prefix="stb-bench-ticks-") as tmp:
        base_tree = Path(tmp) / "baseline"
        subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "worktree",
                "add",
                "--detach",
                str(base_tree),
                args.baseline_rev,
            ],
            check=True,
            capture_output=True,
        )
        try:
            for name, tree in (("baseline", base_tree), ("current", ROOT)):
                work = Path(tmp) / f"work-{name}"
                work.mkdir()
                print(f"{name}: {args.minutes:g} min at {args.rate:g} req/s ...", flush=True)
                results[name] = run_variant(name, tree, spec, args, work)
                print(f"  {json.dumps(results[name])}", flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                check=False,
                capture_output=True,
            )
    print(
        f"{'':10} {'ticks':>6} {'ok':>6} {'errors':>7} {'failed':>7} {'cycles':>7} "
        f"{'requests':>9} {'req err':>8}"
    )
    for name, r in results.items():
        print(
            f"{name:10} {r['ticks']:6.0f} {r['ok']:6.0f} {r['errors']:7.0f} {r['failed']:7.0f} "
            f"{r['cycles']:7.0f} {r['requests']:9.0f} {r['request_errors']:8.0f}"
        )
    b, c = results["baseline"], results["current"]
    share = lambda r: r["failed"] / r["ticks"] if r["ticks"] else 0.0  # noqa: E731
    print(
        f"RESULT minutes={args.minutes:g} rate={args.rate:g} "
        f"baseline_ticks={b['ticks']:.0f} baseline_failed={b['failed']:.0f} "
        f"baseline_failed_share={share(b):.3f} current_ticks={c['ticks']:.0f} "
        f"current_ok={c['ok']:.0f} current_errors={c['errors']:.0f} "
        f"current_failed={c['failed']:.0f} current_failed_share={share(c):.3f} "
        f"request_errors_baseline={b['request_errors']:.0f} "
        f"request_errors_current={c['request_errors']:.0f}"
    )


if __name__ == "__main__":
    main()
