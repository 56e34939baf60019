"""The token capacity model (`bridge.policy.tokens`) against the lab's LLM (smol:
SmolLM2-135M on llama-cpp-python, two instances, CPU).

(a) A short profile: closed batches of 1 and 2 streams (2 started 0.25 s apart), their
lengths drawn as the load's, sent straight to one smol replica; each stream's client TTFT
(no queue: never more streams than slots) and mean TPOT fitted into a `TokenProfile`
(`fit_profile`). (b) Open-loop Poisson load at rates from 30% to 90% of that replica's
predicted capacity (the rate at which its slots are always busy), prompt and output
lengths drawn from the Azure conversation trace's token columns (scaled to the tiny
model); each rate's client TTFT p99 and TPOT p99 beside the profile's prediction for that
rate and the lengths the model actually produced (`predict`), as predicted/measured,
measured over the streams sent after `--warmup` seconds of load at that rate (the
prediction is the queue's steady state; a run from an idle replica starts below it);
beside it the profile's TTFT p99 with this run's own queue replayed (`replay_ttft_p99`:
the same service times, the run's arrivals, no steady state), which tells a profile
that is off from a run too short for the stationary p99 near saturation.
With --reprofile (the default) the profile is taken again before each rate after the
first and that rate's prediction uses it: on a shared machine the per-token times drift.
Beside them, the prediction with the profile corrected by the replica's own counters
over the run (`calibrate`: the backend's TTFT-clock and token-gap means, as the daemon
corrects it). The issue's target: within 0.75-1.33 at each rate. Ends with a
`RESULT key=value ...` line. About 6 minutes of lab time.

Usage (lab up, root; `$STB_TRACES_DIR` holding azure_llm_conv_2023.csv; run it under the
lab's lock where others share the lab):
    .venv/bin/python bench/llm_capacity.py [--rates 0.3,0.6,0.9] [--seconds 40] [--warmup 30]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx

from bridge.lab import lab as lab_mod
from bridge.lab import triton
from bridge.lab.slurmctl import slurm
from bridge.lab.spec import LabSpec
from bridge.load import lengths
from bridge.load.arrivals import Schedule, poisson
from bridge.load.report import latency_stats
from bridge.load.runner import parse_endpoint
from bridge.load.stream_report import StreamReport, summarize_streams
from bridge.load.streams import StreamConfig, StreamRecord, StreamResult, run_streams
from bridge.paths import default_lab_dir, traces_dir
from bridge.policy.tokenfit import ProfilePoint, calibrate, fit_profile
from bridge.policy.tokens import (
    TokenDemand,
    TokenProfile,
    mean_service,
    predict,
)
from bridge.triton.metrics import parse_page

MODEL = "smol"
TRACE = "azure_llm_conv_2023.csv"
LOW, HIGH = 0.75, 1.33
STAGGER_S = 0.25
"""Seconds between the starts of a profile batch's streams."""
MAX_SECONDS = 120.0
"""The longest load at one rate, whatever --min-streams asks."""


@contextmanager
def served(lab: LabSpec) -> Iterator[triton.TritonJob]:
    """A Triton job serving smol (from the lab's model repository) on the first
    inference node, cancelled (and waited out) on the way out. Waits first for the node
    to be free of other jobs (a Triton there holds the node's ports), and checks that
    the server that answers is one serving smol."""
    node = lab.pool_nodes("infer")[0].name
    deadline = time.monotonic() + 60
    while slurm(lab, "squeue", "-h", "-w", node, "-o", "%i", check=False).strip():
        if time.monotonic() > deadline:
            sys.exit(f"{node} still runs other jobs after 60 s: is the lab in use?")
        time.sleep(1)
    job_id = triton.submit(lab, node=node, models=MODEL, name="stb-bench-llm")
    try:
        job = triton.wait_ready(lab, job_id, timeout_s=120)
        ready = f"http://{job.http_url}/v2/models/{MODEL}/ready"
        if httpx.get(ready, timeout=5).status_code != 200:
            sys.exit(f"the Triton on {job.http_url} does not serve {MODEL}: another server?")
        yield job
    finally:
        slurm(lab, "scancel", job_id, check=False)
        deadline = time.monotonic() + 40
        while triton.job_state(lab, job_id)[0] and time.monotonic() < deadline:
            time.sleep(0.5)


def prompt_overhead(base_url: str) -> int:
    """Tokens the server adds around a prompt's text (its chat template): one word's
    prompt as the server counts it, less one."""
    body = {
        "text_input": lengths.prompt_text(1),
        "parameters": {"max_tokens": 1, "return_num_input_tokens": True},
    }
    r = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", json=body, timeout=60)
    r.raise_for_status()
    counted = r.json()["num_input_tokens"]
    return int(counted[0] if isinstance(counted, list) else counted) - 1


def play(
    endpoint: str,
    schedule: Schedule,
    pairs: Sequence[tuple[int, int]],
    overhead: int,
    seed: int,
    timeout_s: float = 120.0,
) -> StreamResult:
    config = StreamConfig(
        endpoints=(parse_endpoint(endpoint),),
        model=MODEL,
        lengths=tuple(pairs),
        prompt_overhead=overhead,
        temperature=1.0,
        seed=seed,
        max_requests=len(pairs),
        max_duration_s=max(schedule.window_s, 1.0) + 1.0,
        concurrency_cap=256,
        timeout_s=timeout_s,
    )
    return asyncio.run(run_streams(schedule, config))


def profile(
    endpoint: str,
    overhead: int,
    sequences: int,
    spec: lengths.LengthSpec,
    batches: int,
    seed: int,
) -> tuple[TokenProfile, list[ProfilePoint]]:
    """`batches` closed batches of each of 1..sequences streams, their lengths drawn as
    the load's are (`spec`); every stream of two tokens or more a point. A batch's
    streams start STAGGER_S apart. Both so that, as under the load, one stream's prefill
    runs beside another's decode in the mix the load's lengths make: started together
    with like lengths, both prefill and then both decode, and on the lab's CPU two
    decodes share the two cores far better than a decode and a prefill do."""
    points: list[ProfilePoint] = []
    for n in range(1, sequences + 1):
        for _ in range(batches):
            offsets = tuple(k * STAGGER_S for k in range(n))
            batch = Schedule(offsets=offsets, window_s=offsets[-1], source=f"batch of {n}")
            pairs = lengths.draw_lengths(spec, n, seed)
            result = play(endpoint, batch, pairs, overhead, seed)
            seed += n
            for r in result.records:
                if r.ok and r.tpot_s is not None and r.service_ttft_s is not None:
                    points.append(ProfilePoint(n, r.prompt_tokens, r.service_ttft_s, r.tpot_s))
    return fit_profile(points, sequences=sequences), points


def describe(prof: TokenProfile) -> str:
    return (
        f"prefill {prof.prefill_overhead_s * 1000:.0f} ms + "
        f"{prof.prefill_s_per_token * 1000:.2f} ms/token, TPOT "
        + ", ".join(f"{t * 1000:.1f} ms at {i + 1}" for i, t in enumerate(prof.tpot_s))
    )


def spread(points: Sequence[ProfilePoint]) -> str:
    """Each concurrency's TPOT points, median and p90: the profile keeps the median, and
    `predict`'s TPOT p99 is that median at the p99 concurrency."""
    parts = []
    for n in sorted({p.concurrency for p in points}):
        xs = sorted(p.tpot_s * 1000.0 for p in points if p.concurrency == n)
        p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
        parts.append(f"at {n}: median {xs[len(xs) // 2]:.1f} ms, p90 {p90:.1f} ms")
    return "profile TPOT points " + "; ".join(parts)


def capacity(prof: TokenProfile, demand: TokenDemand) -> float:
    """Requests/s at which every slot of one replica is always busy."""
    return prof.sequences / mean_service(prof, demand, float(prof.sequences))


def measured_p99s(records: Sequence[StreamRecord]) -> tuple[float | None, float | None]:
    ok = [r for r in records if r.ok]
    ttft = latency_stats([r.ttft_s for r in ok if r.ttft_s is not None]).p99_ms
    tpot = latency_stats([r.tpot_s for r in ok if r.tpot_s is not None]).p99_ms
    return (
        None if ttft is None else ttft / 1000.0,
        None if tpot is None else tpot / 1000.0,
    )


def diagnostics(records: Sequence[StreamRecord]) -> dict[str, float | None]:
    """What explains a miss: the TPOT p99 of the ok streams of 8 tokens or more (a short
    stream's mean gap is one stall away from its p99), and the sender's own lateness
    p99 (ms from a stream's scheduled time to its send: the client's share of the
    machine)."""
    ok = [r for r in records if r.ok]
    long_ones = latency_stats([r.tpot_s for r in ok if r.tpot_s is not None and r.tokens >= 8])
    late = [r.sent_s - r.scheduled_s for r in records if r.sent_s is not None]
    return {
        "tpot8": None if long_ones.p99_ms is None else long_ones.p99_ms / 1000.0,
        "late_ms": latency_stats(late).p99_ms or 0.0,
    }


def replay_ttft_p99(
    prof: TokenProfile, records: Sequence[StreamRecord], since: float = -math.inf
) -> float | None:
    """The TTFT p99 the profile gives this run's own streams with their queue replayed,
    not taken at its steady state: each ok stream, at the time it was sent, takes the
    first free of the replica's `sequences` slots (first come, first served) and holds it
    for slowdown(n) x prefill(its prompt) + its tokens x tpot(n), n the slots busy when it
    starts (itself included); its TTFT the wait plus that prefill. `predict` is the
    stationary queue's p99; a run of a minute or two near saturation starts empty and
    ends long before its queue reaches that state, and this says how much of a miss is
    that rather than the profile (seconds; None without an ok stream)."""
    ok = sorted(
        (r for r in records if r.ok and r.sent_s is not None), key=lambda r: r.sent_s or 0.0
    )
    free = [0.0] * prof.sequences  # when each slot is next free
    ttfts: list[float] = []
    for r in ok:
        sent = r.sent_s or 0.0
        slot = min(range(len(free)), key=free.__getitem__)
        start = max(sent, free[slot])
        n = 1 + sum(1 for j, f in enumerate(free) if j != slot and f > start)
        pre = prof.slowdown(n) * prof.prefill(r.prompt_tokens)
        free[slot] = start + pre + r.tokens * prof.tpot(n)
        if r.scheduled_s >= since:  # (the warm-up's streams hold the queue, not the p99)
            ttfts.append(start - sent + pre)
    p99 = latency_stats(ttfts).p99_ms
    return None if p99 is None else p99 / 1000.0


def counters(job: triton.TritonJob) -> tuple[float, float, float, float]:
    """smol's TTFT and TPOT histograms' (sum, count, sum, count) on the replica's metrics
    page, cumulative since its load: what the daemon reads of it."""
    page = parse_page(httpx.get(job.metrics_url, timeout=10).text)
    for (model, _), sample in page.models.items():
        llm = sample.llm
        if model == MODEL and llm is not None and llm.ttft_s and llm.tpot_s:
            return (
                llm.ttft_s.sum or 0.0,
                llm.ttft_s.count or 0.0,
                llm.tpot_s.sum or 0.0,
                llm.tpot_s.count or 0.0,
            )
    sys.exit(f"no {MODEL} TTFT/TPOT histograms on {job.metrics_url}")


def window_means(
    before: tuple[float, float, float, float], after: tuple[float, float, float, float]
) -> tuple[float | None, float | None]:
    """The mean of the replica's own TTFT clock and of its token gaps between two
    scrapes (seconds; None without an observation)."""
    d = [b - a for a, b in zip(before, after, strict=True)]
    return (d[0] / d[1] if d[1] > 0 else None, d[2] / d[3] if d[3] > 0 else None)


def _ratio(predicted: float, measured: float | None) -> float:
    return predicted / measured if measured else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rates", default="0.3,0.6,0.9", help="shares of predicted capacity")
    parser.add_argument("--seconds", type=float, default=40.0, help="load per rate, at least")
    parser.add_argument(
        "--min-streams", type=int, default=40, help="per rate: longer than --seconds for these"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="seconds of load at each rate before the streams measured (the queue reaches "
        "its steady state; 0: measure from an idle replica)",
    )
    parser.add_argument("--prompt-scale", type=float, default=0.05)
    parser.add_argument("--output-scale", type=float, default=0.05)
    parser.add_argument("--max-prompt-tokens", type=int, default=160)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--min-output-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--batches", type=int, default=8, help="profile: batches of each concurrency (1, 2)"
    )
    parser.add_argument(
        "--reprofile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="profile again before each rate after the first; that rate's prediction "
        "uses it (the rates stay the first profile's shares)",
    )
    args = parser.parse_args()
    lab = LabSpec.load(default_lab_dir())
    if lab is None or not lab_mod.is_up(lab):
        sys.exit("the lab is not up: run `stb lab up` first")
    folder = traces_dir()
    if folder is None or not (folder / TRACE).exists():
        sys.exit(f"set $STB_TRACES_DIR to a folder holding {TRACE}")
    trace = lengths.read_token_trace(folder / TRACE)
    shares = [float(s) for s in args.rates.split(",")]
    started = time.monotonic()
    with served(lab) as job:
        endpoint = job.http_url
        overhead = prompt_overhead(f"http://{endpoint}")
        spec = lengths.LengthSpec(
            trace=trace,
            prompt_scale=args.prompt_scale,
            output_scale=args.output_scale,
            min_prompt_tokens=overhead + 1,
            max_prompt_tokens=max(args.max_prompt_tokens, overhead + 1),
            min_output_tokens=args.min_output_tokens,
            max_output_tokens=args.max_output_tokens,
        )
        print(f"smol on {job.node}; chat template {overhead} tokens; lengths {spec.describe()}")
        prof, points = profile(
            endpoint, overhead, sequences=2, spec=spec, batches=args.batches, seed=1000
        )
        print(
            f"profile ({len(points)} streams, load average {os.getloadavg()[0]:.1f}): "
            + describe(prof)
        )
        print(f"{'':>6} {spread(points)}")
        asked = lengths.draw_lengths(spec, 4000, args.seed)
        demand = TokenDemand.of(1.0, [p for p, _ in asked], [o for _, o in asked])
        cap = capacity(prof, demand)
        print(f"predicted capacity of one replica: {cap:.2f} req/s (lengths asked)")
        print(
            f"{'share':>6}{'rate/s':>8}{'streams':>8}{'broken':>7}{'out/asked':>10}"
            f"{'TTFT p99 pred':>14}{'meas':>8}{'ratio':>7}{'TPOT p99 pred':>14}{'meas':>8}"
            f"{'ratio':>7}{'TPOT>=8':>8}{'late':>6}{'load1':>6}{'replayed':>11}{'ratio':>7}"
            f"{'calibrated TTFT':>16}{'ratio':>7}{'TPOT':>8}{'ratio':>7}"
        )
        rows: list[tuple[float, float, float, StreamReport]] = []
        replays: list[float] = []
        cal_rows: list[tuple[float, float]] = []
        for i, share in enumerate(shares):
            rate = share * cap
            seconds = min(MAX_SECONDS, max(args.seconds, args.min_streams / rate))
            schedule = poisson(rate, args.warmup + seconds, args.seed + i)
            pairs = lengths.draw_lengths(spec, len(schedule.offsets), args.seed + 100 + i)
            # the profile again just before this rate: on a shared machine the per-token
            # times drift with whatever else runs beside the lab
            if args.reprofile and i > 0:
                prof, _ = profile(endpoint, overhead, 2, spec, args.batches, 5000 + 100 * i)
                print(f"{'':>6} profile again: {describe(prof)}")
            before = counters(job)
            result = play(endpoint, schedule, pairs, overhead, seed=10_000 * (i + 1))
            mean_ttft, mean_tpot = window_means(before, counters(job))
            # the streams sent after the warm-up: the queue in its steady state, which
            # the stationary prediction is of (a run that starts empty sits below it)
            first = min((r.scheduled_s for r in result.records), default=0.0)
            records = [r for r in result.records if r.scheduled_s >= first + args.warmup]
            rep = summarize_streams(result)
            ok = [r for r in records if r.ok]
            if not ok:
                errors = ", ".join(f"{k} x{v}" for k, v in rep.errors.items())
                sys.exit(f"no stream ended cleanly at {rate:.2f}/s ({errors}): the server?")
            # the demand as it came: the prompts the server counted, the answers' real
            # lengths (the model may end one before its max_tokens)
            came = TokenDemand.of(rate, [r.prompt_tokens for r in ok], [r.tokens for r in ok])
            pred = predict(prof, came, 1)
            ttft, tpot = measured_p99s(records)
            diag = diagnostics(records)
            out_share = rep.tokens_out / max(1, sum(r.output_target for r in result.records))
            rt, rp = _ratio(pred.ttft_p99_s, ttft), _ratio(pred.tpot_p99_s, tpot)
            replayed = replay_ttft_p99(prof, result.records, first + args.warmup)
            rr = _ratio(replayed, ttft) if replayed is not None else float("nan")
            replays.append(rr)
            # the profile corrected by the replica's own counters over the run (the
            # backend's TTFT and TPOT histograms' means, as the daemon reads them)
            cal = predict(calibrate(prof, came, mean_ttft, mean_tpot), came, 1)
            ct, cp = _ratio(cal.ttft_p99_s, ttft), _ratio(cal.tpot_p99_s, tpot)
            cal_rows.append((ct, cp))
            rows.append((share, rt, rp, rep))
            print(
                f"{share:>6.2f}{rate:>8.2f}{rep.sent:>8}{rep.broken:>7}{out_share:>10.2f}"
                f"{pred.ttft_p99_s * 1000:>12.0f}ms{(ttft or 0) * 1000:>6.0f}ms{rt:>7.2f}"
                f"{pred.tpot_p99_s * 1000:>12.1f}ms{(tpot or 0) * 1000:>6.1f}ms{rp:>7.2f}"
                f"{(diag['tpot8'] or 0) * 1000:>6.1f}ms{diag['late_ms'] or 0:>4.0f}ms"
                f"{os.getloadavg()[0]:>6.1f}{(replayed or 0) * 1000:>9.0f}ms{rr:>7.2f}"
                f"{cal.ttft_p99_s * 1000:>14.0f}ms{ct:>7.2f}{cal.tpot_p99_s * 1000:>6.1f}ms"
                f"{cp:>7.2f}"
            )
            print(
                f"{'':>6} the replica's own means over the run: TTFT clock "
                f"{(mean_ttft or 0) * 1000:.0f} ms, token gap {(mean_tpot or 0) * 1000:.1f} ms"
            )
    within = all(LOW <= rt <= HIGH and LOW <= rp <= HIGH for _, rt, rp, _ in rows)
    within_cal = all(LOW <= ct <= HIGH and LOW <= cp <= HIGH for ct, cp in cal_rows)
    print(
        "RESULT "
        + " ".join(
            [
                f"capacity_rps={cap:.3f}",
                "shares=" + ",".join(f"{s:g}" for s, _, _, _ in rows),
                "ttft_ratio=" + ",".join(f"{rt:.2f}" for _, rt, _, _ in rows),
                "tpot_ratio=" + ",".join(f"{rp:.2f}" for _, _, rp, _ in rows),
                "ttft_replay_ratio=" + ",".join(f"{r:.2f}" for r in replays),
                "ttft_calibrated_ratio=" + ",".join(f"{ct:.2f}" for ct, _ in cal_rows),
                "tpot_calibrated_ratio=" + ",".join(f"{cp:.2f}" for _, cp in cal_rows),
                "broken=" + str(sum(rep.broken for *_, rep in rows)),
                f"warmup_s={args.warmup:g}",
                f"within_{LOW}_{HIGH}={'yes' if within else 'no'}",
                f"calibrated_within={'yes' if within_cal else 'no'}",
                f"lab_s={time.monotonic() - started:.0f}",
            ]
        )
    )


if __name__ == "__main__":
    main()
