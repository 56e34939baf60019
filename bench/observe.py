"""Time to compute the Triton signal for a fleet per tick, beside prometheus_client's parser
alone on the same pages (the baseline), in one run.

The pages are the real ones recorded from the lab's Triton (tests/data/triton/busy_a.prom
and busy_b.prom, two scrapes 10 s apart under load), widened to `--models` models by
rewriting the model labels (busy -> busy-0, busy-1, ...; echo likewise), and replicated for
`--instances` instances. Each timed tick, for every instance: the baseline parses the page
with `text_string_to_metric_families` and materializes its samples; the signal path parses
it with `bridge.triton.metrics.parse_page`, computes `instance_signal` against the
instance's previous scrape, then `model_signals` aggregates over the fleet. Ticks alternate
busy_b and busy_a pages, so half the windows are ordinary and half are counter resets.

No lab needed. Usage:
    .venv/bin/python bench/observe.py [--instances 1000] [--models 20] [--ticks 2]
Prints the time per tick of each path (median and each tick), the ratio signal/baseline,
and one model's aggregate from the last tick. The signal path hands the parser only the
families it reads (bridge.triton.metrics._relevant), which is why it can beat the baseline.

With `--prometheus` (needs the `prometheus` binary, as `stb lab up` installs it), the pages
are served over HTTP by a separate local process, one 127.0.0.1 port per instance, and a
real Prometheus server scrapes them all (deploy/prometheus/rules.yml loaded) every
`--scrape-s`. Timed per tick, beside the parser alone:
  prometheus: the bridge's Prometheus path (`PrometheusSignal.read`: one query)
  direct:     the direct path: every page fetched over HTTP (16 at once) and folded
All traffic stays on 127.0.0.1 and ends with the bench. The last line is `RESULT ...`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bridge.paths import project_root
from bridge.triton.metrics import parse_page
from bridge.triton.signal import ModelSignal, Scrape, instance_signal, model_signals

MODEL_LABEL = re.compile(r'model="([^"]*)"')


def widen(text: str, models: int) -> str:
    """The page with each model's series repeated under `models` names in all (the recorded
    page has two models: each is copied models/2 times, as NAME-0, NAME-1, ...)."""
    copies = max(1, models // 2)
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("#") or 'model="' not in line:
            out.append(line)
            continue
        out.extend(
            MODEL_LABEL.sub(lambda m, i=i: f'model="{m[1]}-{i}"', line) for i in range(copies)
        )
    return "\n".join(out) + "\n"


def baseline_tick(page: str, instances: int) -> float:
    start = time.perf_counter()
    for _ in range(instances):
        for family in text_string_to_metric_families(page):
            _ = family.samples
    return time.perf_counter() - start


def signal_tick(
    page: str, instances: int, names: list[str], prev: dict[str, Scrape], at: float
) -> tuple[float, Mapping[str, ModelSignal]]:
    start = time.perf_counter()
    signals = []
    for name in names[:instances]:
        obs = Scrape(name, at, parse_page(page))
        signals.append(instance_signal(prev.get(name), obs))
        prev[name] = obs
    aggregate = model_signals(signals)
    return time.perf_counter() - start, aggregate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--ticks", type=int, default=2, help="timed ticks (one more warms up)")
    ap.add_argument("--prometheus", action="store_true", help="through a real Prometheus")
    ap.add_argument("--scrape-s", type=int, default=5, help="Prometheus' scrape interval")
    args = ap.parse_args()

    data = project_root() / "tests" / "data" / "triton"
    pages = [widen(Path(data / f"{n}.prom").read_text(), args.models) for n in ("busy_a", "busy_b")]
    check = parse_page(pages[0])
    assert check.ok and len(check.models) == args.models, check.error
    lines = pages[0].count("\n")
    print(
        f"{args.instances} instances x {args.models} models, page {len(pages[0]) / 1024:.0f} KiB"
        f" ({lines} lines), {args.ticks} timed ticks"
    )

    if args.prometheus:
        prometheus_bench(args, pages)
        return
    names = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(args.instances)]
    prev: dict[str, Scrape] = {}
    signal_tick(pages[0], args.instances, names, prev, at=0.0)  # warm-up: first scrapes
    base_t: list[float] = []
    sig_t: list[float] = []
    for tick in range(1, args.ticks + 1):
        page = pages[tick % 2]
        base_t.append(baseline_tick(page, args.instances))
        took, aggregate = signal_tick(page, args.instances, names, prev, at=10.0 * tick)
        sig_t.append(took)
        assert len(aggregate) == args.models
    b, s = statistics.median(base_t), statistics.median(sig_t)
    print(f"baseline (prometheus_client parser only): {b:.2f} s/tick  {_fmt(base_t)}")
    print(f"signal (parse_page + instance_signal + model_signals): {s:.2f} s/tick  {_fmt(sig_t)}")
    print(f"ratio signal/baseline: {s / b:.2f}")
    m = aggregate["busy-0"]
    print(
        f"last tick, model busy-0 over {m.with_data}/{m.instances} instances:"
        f" p99 {m.p99_ms} ms, mean {m.mean_latency_ms:.1f} ms,"
        f" queue/compute {m.queue_compute_ratio:.2f}, {m.request_rate:.0f} req/s"
    )
    print(
        f"RESULT instances={args.instances} models={args.models} signal_s={s:.3f} "
        f"parser_s={b:.3f} ratio={s / b:.3f}"
    )


SERVER = """
import asyncio, sys
pages = [open(p, "rb").read() for p in sys.argv[3:5]]
base, count = int(sys.argv[1]), int(sys.argv[2])
loop_start = None

async def serve(reader, writer):
    try:
        await reader.readuntil(b"\\r\\n\\r\\n")
        now = asyncio.get_running_loop().time()
        page = pages[int(now // 10) % 2]
        writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain; version=0.0.4\\r\\n"
                     b"Content-Length: " + str(len(page)).encode() + b"\\r\\n"
                     b"Connection: close\\r\\n\\r\\n" + page)
        await writer.drain()
    except Exception:
        pass
    finally:
        writer.close()

async def main():
    for port in range(base, base + count):
        await asyncio.start_server(serve, "127.0.0.1", port, backlog=64)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _free_base(count: int) -> int:
    """A run of `count` free ports on 127.0.0.1 (checked one by one)."""
    import socket

    for base in range(20000, 60000 - count, count):
        try:
            socks = []
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no run of free ports")


def prometheus_bench(args: argparse.Namespace, pages: list[str]) -> None:
    """Pages served to a real Prometheus; the Prometheus path and the direct path timed."""
    import shutil
    import subprocess
    import sys
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from bridge.triton.prometheus import PrometheusSignal

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("error: no prometheus binary (stb lab up installs Debian's)")
    n = args.instances
    with tempfile.TemporaryDirectory(prefix="stb-observe-") as tmp:
        work = Path(tmp)
        files = []
        for i, page in enumerate(pages):
            f = work / f"page{i}.prom"
            f.write_text(page)
            files.append(str(f))
        base = _free_base(n)
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(base), str(n), *files], stdout=subprocess.PIPE
        )
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        prom_port = _free_base(1) + 1
        targets = "\n".join(
            f"        - targets: ['127.0.0.1:{base + i}']\n"
            f"          labels: {{slurm_job_id: '{i}', node: 'n{i}'}}"
            for i in range(n)
        )
        keep = (
            "nv_inference_(request_(success|failure|duration_us)|queue_duration_us|"
            "compute_(input|infer|output)_duration_us|pending_request_count|"
            "request_summary_us)"
        )
        (work / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {args.scrape_s}s\n  evaluation_interval: 5s\n"
            f"rule_files: [rules.yml]\nscrape_configs:\n  - job_name: triton\n"
            f"    static_configs:\n{targets}\n"
            f"    metric_relabel_configs:\n"
            f"      - {{source_labels: [__name__], regex: '{keep}', action: keep}}\n"
        )
        shutil.copy(project_root() / "deploy" / "prometheus" / "rules.yml", work)
        prom = subprocess.Popen(
            [prometheus, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{prom_port}"
        try:
            source = PrometheusSignal(url, max_staleness_s=3 * args.scrape_s, timeout_s=60)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # every target scraped twice, rules evaluated
                try:
                    busy = source.read().models.get("busy-0")
                    if busy is not None and busy.with_data == n:
                        break
                except Exception:  # Prometheus still starting
                    pass
                time.sleep(2)
            else:
                raise SystemExit("error: Prometheus did not scrape every target within 300 s")
            local = threading.local()

            def fetch(i: int) -> Scrape:
                c = getattr(local, "client", None)
                if c is None:
                    c = local.client = httpx.Client(timeout=10)
                try:
                    text = c.get(f"http://127.0.0.1:{base + i}/metrics").text
                except httpx.HTTPError:
                    text = ""  # counted below as a page not read
                return Scrape(str(i), time.monotonic(), parse_page(text))

            pool = ThreadPoolExecutor(16)
            prev: dict[str, Scrape] = {}
            prom_t: list[float] = []
            direct_t: list[float] = []
            base_t: list[float] = []
            for tick in range(args.ticks + 1):
                start = time.perf_counter()
                agg = source.read().models
                took_p = time.perf_counter() - start
                start = time.perf_counter()
                obs = list(pool.map(fetch, range(n)))
                sigs = [instance_signal(prev.get(o.instance), o) for o in obs]
                prev = {o.instance: o for o in obs}
                direct = model_signals(sigs)
                took_d = time.perf_counter() - start
                if tick == 0:
                    continue  # the direct path's first scrapes have no window
                prom_t.append(took_p)
                direct_t.append(took_d)
                base_t.append(baseline_tick(pages[tick % 2], n))
                read = sum(1 for o in obs if o.page.ok)
                print(
                    f"tick {tick}: direct {read}/{n} pages, {len(direct)} models; "
                    f"Prometheus {len(agg)} models",
                    flush=True,
                )
                time.sleep(args.scrape_s)
            pool.shutdown()
            source.close()
            groups = httpx.get(f"{url}/api/v1/rules", timeout=30).json()["data"]["groups"]
            rule_eval = max(float(g.get("evaluationTime", 0.0)) for g in groups)
        finally:
            prom.terminate()
            server.terminate()
            prom.wait(30)
            server.wait(30)
    p, d, b = (statistics.median(x) for x in (prom_t, direct_t, base_t))
    print(f"parser alone (prometheus_client, every page):  {b:.2f} s/tick  {_fmt(base_t)}")
    print(f"direct path (HTTP fetch x16 + parse + signal): {d:.2f} s/tick  {_fmt(direct_t)}")
    print(f"Prometheus path (one query):                   {p:.2f} s/tick  {_fmt(prom_t)}")
    print(f"Prometheus' own evaluation of the rules (last): {rule_eval:.2f} s per {5} s interval")
    m = agg.get("busy-0")
    print(
        f"last tick via Prometheus, busy-0 over {m.with_data}/{m.instances} replicas"
        if m is not None
        else "last tick via Prometheus: no data (its rules were not evaluated in time)"
    )
    print(
        f"RESULT instances={n} models={args.models} prometheus_s={p:.3f} direct_s={d:.3f} "
        f"parser_s={b:.3f} prometheus_vs_direct={p / d:.5f} prometheus_vs_parser={p / b:.5f} "
        f"rule_eval_s={rule_eval:.3f}"
    )


def _fmt(ts: list[float]) -> str:
    return "(ticks: " + " ".join(f"{t:.2f}" for t in ts) + ")"


if __name__ == "__main__":
    main()
