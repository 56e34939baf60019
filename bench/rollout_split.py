"""How exact a rollout's traffic split is, and what it costs, through a real nginx.

The bridge's routing (`bridge.routing.nginx.render` of a `RoutingTable` with a `Split`,
published by `RoutingPublisher` to an `NginxProcess`) in front of a small upstream on
127.0.0.1 that answers each `/v2/models/m/versions/<v>/infer` with the version it was
asked for (and `/v2/models/m/infer` with "unversioned"). For each share (`--shares`,
default 1, 10 and 50%), `--requests` unversioned requests go through nginx; the bench
prints the new version's observed share, its distance from the configured share in
standard deviations of the binomial (each request is an independent draw on nginx's random
`$request_id`), and whether it is within 3 of them. Baseline in the same run: the same
requests with no split (nginx proxying unversioned requests as before a rollout), before
and after the split rounds, so the ratio of the request rates is the rewrite's cost.

No lab needed; the `nginx` binary must be installed (`stb lab up` installs it). All traffic
goes to 127.0.0.1, at most `--requests` per round, and ends with the bench.
Usage: .venv/bin/python bench/rollout_split.py [--requests 10000] [--shares 1,10,50]
The last line is `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from bridge.routing import nginx
from bridge.routing.nginxctl import NginxProcess
from bridge.routing.publisher import RoutingPublisher
from bridge.routing.table import RoutingTable, Split

_VERSIONED = re.compile(r"^/v2/models/m/versions/(\d+)/infer$")


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body in separate writes: no 40 ms stall

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        m = _VERSIONED.match(self.path)
        version = m.group(1) if m else ("unversioned" if self.path.endswith("/infer") else "")
        body = json.dumps({"model_name": "m", "model_version": version}).encode()
        self.send_response(200 if version else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _send(url: str, n: int, threads: int) -> tuple[dict[str, int], float, int]:
    """n POSTs to url from `threads` threads: (answers by version, seconds, failures)."""
    counts: dict[str, int] = {}
    failures = [0]
    lock = threading.Lock()

    def work(k: int) -> None:
        mine: dict[str, int] = {}
        bad = 0
        with httpx.Client(timeout=10) as client:
            for _ in range(k):
                try:
                    r = client.post(url, content=b"{}")
                    v = r.json()["model_version"] if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError, KeyError):
                    v = None
                if v is None:
                    bad += 1
                else:
                    mine[v] = mine.get(v, 0) + 1
        with lock:
            for v, c in mine.items():
                counts[v] = counts.get(v, 0) + c
            failures[0] += bad

    began = time.monotonic()
    workers = [
        threading.Thread(target=work, args=(n // threads + (i < n % threads),))
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return counts, time.monotonic() - began, failures[0]


def _plain(
    publisher: RoutingPublisher, routes: dict[str, list[str]], url: str, args: argparse.Namespace
) -> tuple[float, int]:
    """One baseline round: no split. Run before and after the split rounds (averaged), so
    a machine that slows down during the run does not bias the ratio."""
    publisher.publish(RoutingTable.build(routes))
    plain, secs, bad = _send(url, args.requests, args.threads)
    if not set(plain) <= {"unversioned"}:
        raise SystemExit(f"no split, yet versioned answers: {plain}")
    rps = args.requests / secs
    print(f"no split (baseline): {rps:,.0f} requests/s, {bad} failed")
    return rps, bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000, help="requests per round")
    ap.add_argument("--shares", default="1,10,50", help="the new version's shares, percent")
    ap.add_argument("--threads", type=int, default=4, help="client threads")
    args = ap.parse_args()
    if not 100 <= args.requests <= 200_000:
        ap.error("--requests must be within 100 and 200000")
    shares = [float(x) for x in args.shares.split(",")]
    if not all(0 < p < 100 for p in shares):
        ap.error("--shares must be within 0 and 100 (exclusive)")

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    backend = f"127.0.0.1:{upstream.server_address[1]}"
    figures: dict[str, str] = {"requests": str(args.requests)}
    with tempfile.TemporaryDirectory(prefix="stb-split-") as tmp:
        proc = NginxProcess(Path(tmp) / "nginx")
        proc.start()
        try:
            listen = f"127.0.0.1:{_port()}"
            publisher = RoutingPublisher(
                proc.routing_conf, Path(tmp) / "sd.json", proc.control,
                settings=nginx.NginxSettings(listen=listen),
            )  # fmt: skip
            url = f"http://{listen}/v2/models/m/infer"
            routes = {"m": [backend]}
            publisher.publish(RoutingTable.build(routes))
            _send(url, 200, args.threads)  # warm up
            plain_rps, plain_bad = _plain(publisher, routes, url, args)
            split_rps = []
            for p in shares:
                publisher.publish(RoutingTable.build(routes, splits=[Split("m", 1, 2, p)]))
                counts, secs, bad = _send(url, args.requests, args.threads)
                n = sum(counts.values())
                got = counts.get("2", 0) / n if n else 0.0
                sigma = math.sqrt(p / 100 * (1 - p / 100) / n) if n else float("nan")
                z = (got - p / 100) / sigma
                split_rps.append(n / secs)
                inside = abs(z) <= 3
                print(
                    f"split {p:g}%: new version {got:.3%} of {n} (old {counts.get('1', 0)}, "
                    f"other {n - counts.get('1', 0) - counts.get('2', 0)}), "
                    f"{z:+.2f} sigma ({'within' if inside else 'OUTSIDE'} 3), "
                    f"{n / secs:,.0f} requests/s, {bad} failed"
                )
                key = f"{p:g}".replace(".", "_")
                figures |= {f"share_{key}": f"{got * 100:.3f}", f"z_{key}": f"{z:.2f}",
                            f"failed_{key}": str(bad)}  # fmt: skip
            after_rps, after_bad = _plain(publisher, routes, url, args)
            plain_rps, plain_bad = (plain_rps + after_rps) / 2, plain_bad + after_bad
            mean_split = sum(split_rps) / len(split_rps)
            ratio = mean_split / plain_rps
            print(f"split / no split request rate: {ratio:.3f}")
            figures |= {
                "rps_plain": f"{plain_rps:.0f}",
                "rps_split": f"{mean_split:.0f}",
                "ratio_split_plain": f"{ratio:.3f}",
                "failed_plain": str(plain_bad),
            }
        finally:
            proc.stop()
            upstream.shutdown()
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
