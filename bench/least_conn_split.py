"""How nginx's `least_conn` splits a model's requests over replicas of different sizes
(issue 32): the fact the simulator's routing model rests on. The daemon's nginx routes
with `least_conn` (`bridge.routing.nginx`), which passes over a replica with more
requests in flight, and weighs each replica by its GPUs where a model's replicas differ
(`RoutingTable.weights`); the simulator and the capacity model split a model's requests
over its replicas by their GPUs (`bridge.sim.serving`, `bridge.policy.capacity.weight`).
This bench measures the split and the latency it gives.

Two replicas of one model behind the bridge's own nginx configuration
(`bridge.routing.publisher.RoutingPublisher`, real nginx): a small one of `--small`
parallel executions (a one-GPU lend) and a large one of `--large` (a whole node). Each
replica is a queue of that many servers of `--service-ms` each, first come first served
(as a Triton instance group; an asyncio server in its own process, on loopback). Poisson
load from the project's load generator (`bridge.load`), at rates that put the small
replica at `--rho` of its capacity under an even split.

Baseline, in the same run: the even split itself, the load generator sending request i
to replica i mod 2 (round robin), at the same rates. Then `least_conn` as the daemon
routes replicas alike (no weights), and `weighted`: each replica weighted by its
executions, as the daemon weighs a replica by its GPUs (`RoutingTable.weights`, nginx's
`weight=`), what the simulator and the capacity model take.

Per rate and routing: the small replica's share of the requests (even split: 1/2; by
executions: small / (small + large)), the p99 of the time in each replica (queue and
service) and the p99 the clients saw. Beside them, the simulator's figures for the same
replicas and rate (`model`): the small replica's share as `bridge.sim.serving` routes it
(the even split, or `_steer` for least_conn) and its p99 from the M/G/c queue of
`bridge.sim.latency` (constant service) with the arrivals the simulator takes for that
routing (least_conn's `LEAST_CONN_CA2`, fitted to this bench's figures; the even split's
Poisson), and with Poisson arrivals (`Poisson p99`: the capacity model's, and the
simulator's before it modelled least_conn's arrivals).

Usage:
    .venv/bin/python bench/least_conn_split.py [--small 1] [--large 8] [--service-ms 20]
        [--rho 0.5,0.8,1.1] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bridge.load.arrivals import poisson
from bridge.load.runner import RunConfig, parse_endpoint, run
from bridge.routing import nginx
from bridge.routing.nginxctl import NginxProcess
from bridge.routing.publisher import RoutingPublisher
from bridge.routing.table import RoutingTable
from bridge.sim import latency
from bridge.sim.serving import Group, _steer

HOSTS = ("127.0.3.1", "127.0.3.2")


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def serve(host: str, port: int, servers: int, service_s: float) -> None:
    """One replica: `servers` parallel executions of `service_s`, FIFO; `GET /stats` gives
    and clears the requests served and their times in the replica (s)."""
    from aiohttp import web

    sem = asyncio.Semaphore(servers)
    times: list[float] = []

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        t0 = time.monotonic()
        async with sem:
            await asyncio.sleep(service_s)
        times.append(time.monotonic() - t0)
        return web.json_response({"model_name": "busy", "outputs": []})

    async def stats(request: web.Request) -> web.Response:
        out = list(times)
        times.clear()
        return web.json_response(out)

    async def ready(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v2/models/busy/infer", infer)
    app.router.add_get("/stats", stats)
    app.router.add_get("/v2/health/ready", ready)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


def p99(xs: list[float]) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


def load(endpoints: list[str], rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson at `rate` for `seconds`, request i to endpoints[i % n]; the latencies (s)."""
    config = RunConfig(
        endpoints=tuple(parse_endpoint(e) for e in endpoints),
        model="busy",
        shape=(4,),
        max_requests=int(rate * seconds * 2) + 100,
        max_duration_s=seconds,
        concurrency_cap=2_000,
        timeout_s=30,
    )
    result = asyncio.run(run(poisson(rate, seconds, seed), config, target_rate=rate))
    bad = [r for r in result.records if r.error is not None or r.sent_s is None]
    if bad:
        raise SystemExit(f"{len(bad)} of {len(result.records)} requests failed: {bad[0]}")
    return [r.latency_s for r in result.records if r.latency_s is not None]


def modelled(
    sizes: tuple[int, int], rate: float, service_s: float, routing: str
) -> tuple[float, float, float]:
    """The simulator's (share, p99 s) of the small replica and the p99 with Poisson
    arrivals: its share as `bridge.sim.serving` routes `rate` over the two replicas (the
    even split, or `_steer` for least_conn), its p99 the service plus the M/G/c waiting
    p99 (constant service), with the arrivals' SCV the simulator takes for the routing
    (`latency.LEAST_CONN_CA2` for least_conn, Poisson's 1 for the even split) and with
    Poisson's (the capacity model's, and the simulator's before it knew least_conn)."""
    # each replica's effective count: the model's weight over its own (1 each, or its
    # executions where nginx weighs it so)
    weights = sizes if routing == "weighted" else (1, 1)
    groups = [
        (Group(("m",), nodes=1, servers=c), [(0, sum(weights) / w, service_s)])
        for c, w in zip(sizes, weights, strict=True)
    ]
    layout = _steer(groups, [rate], 1) if routing != "even" else None
    share = weights[0] / sum(weights) if layout is None else layout[1][0][0][0]
    small = rate * share
    routed = latency.LEAST_CONN_CA2 if routing != "even" else 1.0

    def p99(ca2: float) -> float:
        if small * service_s >= sizes[0]:  # saturated: the queue grows without bound
            return math.inf
        step = latency.step(sizes[0], small * service_s, small, 0.0, 1.0, 0.0, ca2)
        return service_s + step.state.wait_quantile()

    return share, p99(routed), p99(1.0)


def stats(client: httpx.Client, endpoint: str) -> list[float]:
    return list(client.get(f"http://{endpoint}/stats", timeout=5).json())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1)
    parser.add_argument("--large", type=int, default=8)
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--rho", default="0.5,0.8,1.1")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        host, port, servers, service = args.serve
        serve(host, int(port), int(servers), float(service))
        return 0
    if args.small < 1 or args.large < 1 or args.service_ms <= 0 or args.seconds <= 0:
        parser.error("--small and --large must be >= 1, --service-ms and --seconds > 0")
    rhos = [float(x) for x in args.rho.split(",")]
    service_s = args.service_ms / 1000.0
    sizes = (args.small, args.large)
    eps = [f"{h}:{_free_port(h)}" for h in HOSTS]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--serve", *ep.split(":"), str(n), str(service_s)]
        )
        for ep, n in zip(eps, sizes, strict=True)
    ]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stb-lc-") as tmp, httpx.Client() as client:
        for ep in eps:  # until both answer
            while True:
                try:
                    client.get(f"http://{ep}/v2/health/ready", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
        proc = NginxProcess(Path(tmp) / "nginx")
        proc.start()
        port = _free_port()
        publisher = RoutingPublisher(
            proc.routing_conf,
            Path(tmp) / "sd.json",
            proc.control,
            settings=nginx.NginxSettings(listen=f"127.0.0.1:{port}"),
            bridge_metrics="127.0.0.1:9100",
        )
        # the table as the daemon publishes it: without weights, and with each replica's
        # executions as its weight (`RoutingTable.weights`: a replica's GPUs)
        tables = {
            "least_conn": RoutingTable.build({"busy": eps}),
            "weighted": RoutingTable.build(
                {"busy": eps}, weights={"busy": dict(zip(eps, sizes, strict=True))}
            ),
        }
        front = f"127.0.0.1:{port}"
        rows = []
        try:
            print(
                f"replicas of {args.small} and {args.large} executions of {args.service_ms:g} ms;"
                f" {args.seconds:g} s of Poisson load a rate; even split = round robin"
            )
            print(
                f"{'rho':>5} {'req/s':>6} {'routing':>10} {'small %':>8} "
                f"{'small p99':>10} {'large p99':>10} {'client p99':>11}"
                f" {'model %':>8} {'model p99':>10} {'Poisson p99':>12}"
            )
            for i, rho in enumerate(rhos):
                # the rate that puts the small replica at rho under an even split
                rate = 2 * rho * args.small / service_s
                for routing, targets in (
                    ("even", eps),
                    ("least_conn", [front]),
                    ("weighted", [front]),
                ):
                    if routing in tables:
                        publisher.publish(tables[routing])
                        time.sleep(1.0)  # nginx's new workers take over
                    for ep in eps:
                        stats(client, ep)  # cleared
                    seen = load(targets, rate, args.seconds, seed=i)
                    small, large = (stats(client, ep) for ep in eps)
                    share = len(small) / max(1, len(small) + len(large))
                    m_share, m_p99, poisson_p99 = modelled(sizes, rate, service_s, routing)
                    row = (rho, rate, routing, share, p99(small), p99(large), p99(seen), m_p99)
                    rows.append(row)
                    print(
                        f"{rho:5.2f} {rate:6.1f} {routing:>10} {100 * share:8.1f} "
                        f"{1000 * row[4]:10.1f} {1000 * row[5]:10.1f} {1000 * row[6]:11.1f}"
                        f" {100 * m_share:8.1f} {1000 * m_p99:10.1f} {1000 * poisson_p99:12.1f}"
                    )
        finally:
            proc.stop()
            for p in procs:
                p.terminate()
                p.wait(10)
    by_exec = args.small / (args.small + args.large)
    print(f"by executions, the small replica's share would be {100 * by_exec:.1f}%")
    figures = []
    for rho, _, routing, share, small_p99, _, client_p99, model_p99 in rows:
        short = {"least_conn": "lc", "weighted": "wlc"}.get(routing, "even")
        key = f"rho{rho:g}_{short}"
        figures += [
            f"{key}_small_pct={100 * share:.1f}",
            f"{key}_small_p99_ms={1000 * small_p99:.1f}",
            f"{key}_client_p99_ms={1000 * client_p99:.1f}",
            f"{key}_model_small_p99_ms={1000 * model_p99:.1f}",
        ]
    wall = time.monotonic() - started
    print(f"RESULT {' '.join(figures)} by_exec_pct={100 * by_exec:.1f} wall_s={wall:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
