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
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bridge.paths import project_root
from bridge.triton.metrics import parse_page
from bridge.triton.signal import ModelSignal, Observation, instance_signal, model_signals

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
    page: str, instances: int, names: list[str], prev: dict[str, Observation], at: float
) -> tuple[float, Mapping[str, ModelSignal]]:
    start = time.perf_counter()
    signals = []
    for name in names[:instances]:
        obs = Observation(name, at, parse_page(page))
        signals.append(instance_signal(prev.get(name), obs))
        prev[name] = obs
    aggregate = model_signals(signals)
    return time.perf_counter() - start, aggregate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--ticks", type=int, default=2, help="timed ticks (one more warms up)")
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

    names = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(args.instances)]
    prev: dict[str, Observation] = {}
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


def _fmt(ts: list[float]) -> str:
    return "(ticks: " + " ".join(f"{t:.2f}" for t in ts) + ")"


if __name__ == "__main__":
    main()
