"""Lend and return cycles under open token streams, on the lab: how many streams a return
cuts (the target: 0 over 10 cycles).

The LLM (smol) is loaded on the reserved node's baseline; `--clients` curl processes (a
plain HTTP client reading generate_stream's events: `bridge.lab.streams`) keep streams
open through the bridge's own nginx, on loopback, while the real reconciler, ticking
twice a second, lends the elastic node for smol (an operator's lend), lets the streams
reach it for `--hold-s`, and returns it. A stream is broken when it began (200) and did
not end whole (curl read the body to its end, the last event carries the model's finish
reason); refused when it never began. Prints one line per cycle, then
`RESULT key=value ...`: streams, broken, refused, streams on the lent replica, those
open there when its return was asked, cycles, and the return's durations (request to
returned; time spent draining), min / median / max.

Usage (lab up, root; run it under the lab's lock where others share the lab):
    .venv/bin/python bench/stream_returns.py [--cycles 10] [--clients 3] [--hold-s 4]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bridge.config import load_config
from bridge.daemon.clients import TritonClients
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.lab import triton
from bridge.lab.spec import LabSpec
from bridge.lab.streams import StreamLoad, cycle, tick
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.paths import default_lab_dir, project_root
from bridge.routing import nginx
from bridge.routing.nginxctl import NginxProcess
from bridge.routing.publisher import RoutingPublisher
from bridge.slurm.cli import SlurmCLI
from bridge.triton.client import TritonHttpClient

MODEL = "smol"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spread(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--clients", type=int, default=3, help="streams open at once")
    ap.add_argument("--hold-s", type=float, default=4.0, help="load on the lent replica")
    args = ap.parse_args()
    if not 1 <= args.cycles <= 50 or not 1 <= args.clients <= 8 or not 0 < args.hold_s <= 60:
        ap.error("--cycles 1-50, --clients 1-8, --hold-s in (0, 60]")
    lab = LabSpec.load(default_lab_dir())
    if lab is None:
        print("no lab: run `stb lab up` first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="stb-stream-returns-") as tmp:
        return run(lab, Path(tmp), args.cycles, args.clients, args.hold_s)


def run(lab: LabSpec, tmp: Path, cycles: int, clients: int, hold_s: float) -> int:
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    config = base.model_copy(
        update={
            "database_url": f"sqlite:///{tmp / 'bridge.db'}",
            "triton": triton.job_config(lab),
            "policy": base.policy.model_copy(update={"max_lent_nodes": 1}),
        }
    )
    engine = make_engine(config.database_url)
    create_schema(engine)
    tritons = TritonClients(triton.api_key(lab))
    proc = NginxProcess(tmp / "nginx")
    proc.start()
    port = _free_port()
    publisher = RoutingPublisher(
        proc.routing_conf,
        tmp / "http_sd.json",
        proc.control,
        settings=nginx.NginxSettings(listen=f"127.0.0.1:{port}"),
    )
    cli = SlurmCLI(env=lab.env())
    rec = Reconciler(
        config,
        cli,
        LeaseStore(engine),
        Observer(cli, config, tritons),
        tritons,
        publisher,
        requests=RequestQueue(engine),
        forget_triton=tritons.forget,
    )
    log: list[str] = []
    reserved = lab.pool_nodes("infer")[0].name
    try:
        tick(rec, lambda: _server(rec, reserved) is not None, 120, log)
        address = _server(rec, reserved) or ""
        with TritonHttpClient(address, api_key=triton.api_key(lab)) as client:
            client.load_model(MODEL)
        tick(rec, lambda: MODEL in _models(rec, reserved), 60, log)
        load = StreamLoad(f"127.0.0.1:{port}", MODEL, clients=clients).start()
        done = []
        try:
            for i in range(cycles):
                c = cycle(rec, lab, MODEL, load, hold_s, log)
                done.append(c)
                print(
                    f"cycle {i + 1}: lease {c.lease_id} on {c.address}, returned in "
                    f"{c.returned_s:.1f} s (draining {c.draining_s:.1f} s)",
                    flush=True,
                )
            time.sleep(1.0)
        finally:
            results = load.stop()
    finally:
        proc.stop()
        tritons.close()
        for job in cli.jobs(tag="stb:triton"):
            cli.cancel(job.job_id)
    lent = {c.address for c in done}
    on_lent = [r for r in results if r.upstream in lent]
    open_at_return = [r for r in on_lent if any(r.started < c.asked_at < r.ended for c in done)]
    broken = [r for r in results if r.broken]
    for r in broken[:5]:
        print(f"broken: {r.upstream} {r.events} events, curl {r.curl_rc}, {r.error}")
    print(
        f"RESULT streams={len(results)} broken={len(broken)} "
        f"refused={sum(r.refused for r in results)} on_lent={len(on_lent)} "
        f"open_at_return={len(open_at_return)} cycles={len(done)} "
        f"return_s={_spread([c.returned_s for c in done])} "
        f"draining_s={_spread([c.draining_s for c in done])} clients={clients} "
        f"at={datetime.now(UTC).isoformat(timespec='seconds')}"
    )
    return 0 if not broken and len(done) == cycles else 1


def _server(rec: Reconciler, node: str) -> str | None:
    obs = rec.last_observation
    if obs is None:
        return None
    return next((s.address for s in obs.servers if s.ready and s.node == node), None)


def _models(rec: Reconciler, node: str) -> tuple[str, ...]:
    obs = rec.last_observation
    if obs is None:
        return ()
    return next((s.models for s in obs.servers if s.ready and s.node == node), ())


if __name__ == "__main__":
    sys.exit(main())
