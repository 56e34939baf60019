"""Simulation workloads (bridge.sim.workload): the trace readers on literal rows in the
schemas of ../shared/traces (quirks, malformed rows), the arrival series (exact means,
envelope, burst shape, seeds) and the job lists (offered load, kinds, shapes, ids), plus
the same checks on the public traces themselves where they are present."""

from __future__ import annotations

import itertools
import math
import re
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from bridge.paths import traces_dir
from bridge.sim import workload
from bridge.sim.workload import (
    DAY_S,
    FloatArray,
    SimJob,
    TraceTask,
    alibaba_jobs,
    azure_series,
    read_alibaba_tasks,
    read_azure_arrivals,
    synthetic_jobs,
    synthetic_series,
)

TRACES = traces_dir() or Path("$STB_TRACES_DIR")
WEEK_S = 7 * DAY_S


def _shared_trace(name: str) -> Path:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"public trace {name} not in {TRACES}")
    return path


def _load(jobs: list[SimJob], horizon_s: float) -> float:
    """Offered load: GPUs busy on average if every job ran as submitted."""
    return sum(j.gpus * j.duration_s for j in jobs) / horizon_s


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * abs(b)


# --- Azure arrivals -------------------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
T0 = datetime(2023, 11, 16, 18, 15, 46)


def _stamp(ticks: int) -> str:
    """T0 + ticks x 100 ns in the trace's format (7 fractional digits)."""
    whole, frac = divmod(ticks, 10_000_000)
    return f"{T0 + timedelta(seconds=whole):%Y-%m-%d %H:%M:%S}.{frac:07d}"


def _write(path: Path, lines: list[str], end: str = "\n") -> Path:
    # No final newline, as in the shared files.
    path.write_text(end.join(lines), encoding="utf-8", newline="")
    return path


#: per 5 s bin, the arrivals of the generated sample trace (100 bins, 500 s)
BIN_COUNTS = np.random.default_rng(7).poisson(5.0, 100)
BIN_COUNTS[0] = max(BIN_COUNTS[0], 1)  # the first arrival opens the trace at 0


@pytest.fixture
def azure_sample(tmp_path: Path) -> Path:
    """BIN_COUNTS arrivals in consecutive 5 s bins, then one at 500 s that opens a
    partial bin (dropped), rows in reverse order, CRLF, one empty token field."""
    ticks = [b * 50_000_000 + j * 1_000_001 for b, c in enumerate(BIN_COUNTS) for j in range(c)]
    ticks.append(500 * 10_000_000)
    rows = [f"{_stamp(t)},{100 + i},{i % 7}" for i, t in enumerate(ticks)]
    rows[1] = rows[1].rsplit(",", 1)[0] + ","
    return _write(tmp_path / "azure.csv", [AZURE_HEADER, *reversed(rows)], end="\r\n")


def test_read_azure_arrivals_sorted_from_zero_with_full_precision(azure_sample: Path) -> None:
    times = read_azure_arrivals(azure_sample)
    assert times.dtype == np.float64
    assert len(times) == BIN_COUNTS.sum() + 1
    assert times[0] == 0.0 and times[-1] == pytest.approx(500.0)
    assert np.all(np.diff(times) >= 0)
    # 1,000,001 ticks of 100 ns apart: the 7th fractional digit is kept.
    first_bin = times[: BIN_COUNTS[0]]
    assert np.allclose(np.diff(first_bin), 0.1000001, rtol=0, atol=1e-9)


def test_read_azure_arrivals_names_file_and_line_of_a_bad_timestamp(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "bad.csv",
        [AZURE_HEADER, f"{_stamp(0)},1,2", "2023-11-16 18:15:4x.0000000,1,2"],
    )
    with pytest.raises(ValueError, match=r"bad\.csv: line 3: .*TIMESTAMP"):
        read_azure_arrivals(path)


def test_read_azure_arrivals_rejects_empty_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"empty\.csv.*no rows"):
        read_azure_arrivals(_write(tmp_path / "empty.csv", [AZURE_HEADER, ""]))
    alibaba = _write(tmp_path / "ali.csv", [ALIBABA_HEADER, "p0,1,1,1,1000,,LS,Running,0,9,0"])
    with pytest.raises(ValueError, match=r"ali\.csv.*not an Azure"):
        read_azure_arrivals(alibaba)


# --- azure_series ---------------------------------------------------------------------


def test_azure_series_means_are_the_rates_and_length_is_ceil(azure_sample: Path) -> None:
    models = {"llama": 12.5, "small": 0.3, "idle": 0.0}
    s = azure_series(azure_sample, models, horizon_s=WEEK_S + 1.0, step_s=5.0, seed=3)
    assert s.step_s == 5.0
    assert set(s.rates) == set(models)
    for name, rate in models.items():
        series = s.rates[name]
        assert len(series) == math.ceil((WEEK_S + 1.0) / 5.0)
        assert series.min() >= 0
        if rate:
            assert _close(float(series.mean()), rate), (name, series.mean())
        else:
            assert not series.any()


def test_azure_series_replays_the_trace_bins_from_an_offset(azure_sample: Path) -> None:
    # Flat envelope: the series is the trace's per-bin counts, rotated, repeated, scaled.
    s = azure_series(
        azure_sample, {"m": 2.0}, 1234.0, diurnal_amplitude=0.0, weekly_amplitude=0.0, seed=5
    )
    series = s.rates["m"]
    assert len(series) == 247
    rotations = [np.resize(np.roll(BIN_COUNTS, -o), 247) for o in range(len(BIN_COUNTS))]
    matches = [
        o for o, r in enumerate(rotations) if np.allclose(series / series.sum(), r / r.sum())
    ]
    assert matches, "the series is not a rotation of the trace's bins"


def test_azure_series_seeds(azure_sample: Path) -> None:
    def series(seed: int) -> dict[str, FloatArray]:
        return azure_series(azure_sample, {"a": 1.0, "b": 1.0}, 3600.0, seed=seed).rates

    same = series(11), series(11)
    assert all(np.array_equal(same[0][m], same[1][m]) for m in ("a", "b"))
    others = [series(seed)["a"] for seed in range(5)]
    assert len({o.tobytes() for o in others}) > 1, "seeds do not move the offset"
    # Two models with the same rate do not burst in lockstep.
    assert not np.array_equal(same[0]["a"], same[0]["b"])


def test_azure_series_too_short_a_trace_for_one_step(tmp_path: Path) -> None:
    path = _write(tmp_path / "short.csv", [AZURE_HEADER, f"{_stamp(0)},1,1", f"{_stamp(3)},1,1"])
    with pytest.raises(ValueError, match=r"short\.csv.*step_s"):
        azure_series(path, {"m": 1.0}, 60.0)


def test_azure_series_as_an_intensity_does_not_scale_up_the_traces_own_noise(
    azure_sample: Path,
) -> None:
    """BIN_COUNTS is Poisson noise at 1 req/s around a flat rate: scaled to 5,000 req/s
    as it stands it swings by about 45% a step, a load no fleet of that size sees. As an
    intensity (averaged over a minute, then drawn as arrivals at 5,000 req/s) it swings
    by a few percent, keeps its mean and the model's offset in the trace."""
    flat = {"diurnal_amplitude": 0.0, "weekly_amplitude": 0.0}
    raw = azure_series(azure_sample, {"m": 5000.0}, 3600.0, seed=2, **flat).rates["m"]
    smooth = azure_series(azure_sample, {"m": 5000.0}, 3600.0, seed=2, smooth_s=60.0, **flat)
    drawn = azure_series(
        azure_sample, {"m": 5000.0}, 3600.0, seed=2, smooth_s=60.0, draw=True, **flat
    ).rates["m"]
    cv = {name: float(x.std() / x.mean()) for name, x in (("raw", raw), ("drawn", drawn))}
    assert cv["raw"] > 0.35 and cv["drawn"] < 0.15, cv
    assert _close(float(smooth.rates["m"].mean()), 5000.0)
    assert abs(float(drawn.mean()) - 5000.0) < 50.0
    # the draw is on top of the smoothed intensity, from the same offset
    assert np.corrcoef(drawn, smooth.rates["m"])[0, 1] > 0.5
    assert np.all(drawn >= 0) and np.allclose(drawn * 5.0, np.round(drawn * 5.0))
    with pytest.raises(ValueError, match="smooth_s"):
        azure_series(azure_sample, {"m": 1.0}, 60.0, smooth_s=-1.0)


def test_azure_series_keeps_the_real_trace_burstiness(monkeypatch: pytest.MonkeyPatch) -> None:
    path = _shared_trace("azure_llm_conv_2023.csv")
    times = read_azure_arrivals(path)
    assert len(times) == 19_366
    # Parsed once (about a second): the series below reuse it.
    monkeypatch.setattr(workload, "read_azure_arrivals", lambda _: times)
    whole = int(times[-1] // 5)
    counts = np.bincount((times // 5).astype(int))[:whole]
    trace_peak = counts.max() / counts.mean()
    # Flat envelope over two hours (two cycles of the 58 min trace): the trace's shape.
    flat = azure_series(
        path, {"m": 4.0}, 7200.0, diurnal_amplitude=0.0, weekly_amplitude=0.0, seed=1
    ).rates["m"]
    assert flat.max() / flat.mean() == pytest.approx(trace_peak, rel=0.05)
    assert flat.std() / flat.mean() > 0.25  # a Poisson series at 4 req/s x 5 s: ~0.2
    # Default envelope over a week: bursts on the diurnal swing, the mean still exact.
    week = azure_series(path, {"m": 4.0}, WEEK_S, seed=1).rates["m"]
    assert week.max() / week.mean() > 2.0
    assert _close(float(week.mean()), 4.0)


# --- synthetic_series -----------------------------------------------------------------


def test_synthetic_series_envelope_peaks_mid_afternoon_and_dips_at_weekends() -> None:
    step = 600.0
    s = synthetic_series({"m": 3.0}, WEEK_S, step, noise=0.0, bursts_per_day=0.0, seed=0).rates["m"]
    assert _close(float(s.mean()), 3.0)
    per_day = int(DAY_S // step)
    monday, saturday, sunday = s[:per_day], s[5 * per_day : 6 * per_day], s[6 * per_day :]
    assert abs((np.argmax(monday) + 0.5) * step - 15 * 3600) <= step
    assert abs((np.argmin(monday) + 0.5) * step - 3 * 3600) <= step
    assert monday.max() / monday.min() == pytest.approx(1.5 / 0.5, rel=0.01)
    assert np.allclose(saturday / monday, 0.8) and np.allclose(sunday / monday, 0.8)
    assert np.allclose(s[per_day : 2 * per_day], monday)


def test_synthetic_series_bursts_come_on_top_of_the_exact_mean() -> None:
    models = {"m": 2.0, "n": 7.0}
    base = synthetic_series(models, WEEK_S, 5.0, burst_factor=1.0, seed=4).rates
    burst = synthetic_series(models, WEEK_S, 5.0, burst_factor=3.0, seed=4).rates
    for name, rate in (("m", 2.0), ("n", 7.0)):
        assert _close(float(base[name].mean()), rate)
        ratio = burst[name] / base[name]
        in_burst = np.isclose(ratio, 3.0)
        assert np.all(in_burst | np.isclose(ratio, 1.0))
        # 4 bursts a day of 600 s over a week: ~28 bursts, ~2.8% of the steps.
        assert 0.005 < in_burst.mean() < 0.1, in_burst.mean()
        assert burst[name].mean() > rate
        assert burst[name].max() / rate > 3.0
    assert not np.array_equal(base["m"] / 2.0, base["n"] / 7.0)  # independent noise


def test_synthetic_series_noise_is_lognormal_with_the_sigma_asked() -> None:
    def flat(noise: float) -> FloatArray:
        return synthetic_series(
            {"m": 5.0}, DAY_S, 5.0, diurnal_amplitude=0.0, weekly_amplitude=0.0,
            bursts_per_day=0.0, noise=noise, seed=1,
        ).rates["m"]  # fmt: skip

    assert np.allclose(flat(0.0), 5.0)
    log = np.log(flat(0.1))  # 17,280 steps: the sd's estimate is within 1% or so
    assert float(log.std()) == pytest.approx(0.1, rel=0.05)
    assert _close(float(flat(0.1).mean()), 5.0)


def test_synthetic_series_seeds() -> None:
    def s(seed: int) -> FloatArray:
        return synthetic_series({"m": 1.0}, DAY_S, seed=seed).rates["m"]

    assert np.array_equal(s(3), s(3))
    assert not np.array_equal(s(3), s(4))


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"horizon_s": 0.0}, "horizon_s"),
        ({"horizon_s": math.inf}, "horizon_s"),
        ({"step_s": -5.0}, "step_s"),
        ({"models": {"": 1.0}}, "model name"),
        ({"models": {"m": -1.0}}, r"models\['m'\]"),
        ({"models": {"m": math.nan}}, r"models\['m'\]"),
        ({"diurnal_amplitude": 1.5}, "diurnal_amplitude"),
        ({"weekly_amplitude": -0.1}, "weekly_amplitude"),
        ({"burst_factor": 0.5}, "burst_factor"),
        ({"bursts_per_day": -1.0}, "bursts_per_day"),
        ({"burst_s": 0.0}, "burst_s"),
        ({"noise": -0.1}, "noise"),
    ],
)
def test_synthetic_series_rejects_bad_arguments(kwargs: dict[str, object], bad: str) -> None:
    args: dict[str, object] = {"models": {"m": 1.0}, "horizon_s": 60.0, **kwargs}
    with pytest.raises(ValueError, match=bad):
        synthetic_series(**args)  # type: ignore[arg-type]


def test_azure_series_rejects_bad_arguments(azure_sample: Path) -> None:
    with pytest.raises(ValueError, match="step_s"):
        azure_series(azure_sample, {"m": 1.0}, 60.0, step_s=0.0)
    with pytest.raises(ValueError, match="model name"):
        azure_series(azure_sample, {" ": 1.0}, 60.0)


# --- Alibaba tasks --------------------------------------------------------------------

ALIBABA_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
ALIBABA_ROWS = [
    "p0,12000,16384,1,1000,,LS,Running,0,3000,0",
    "p1,6000,12288,0,0,,LS,Running,10,500,10",  # no GPU
    "p2,6000,12288,2,1000,,BE,Pending,20,30,",  # never scheduled
    "p3,6000,12288,8,1000,,BE,Succeeded,30,600,100",
    "p4,6000,12288,1,460,,Burstable,Failed,40,100,100",  # deleted when scheduled
    "",
    "p5,6000,12288,4,1000,,Guaranteed,Succeeded,50,1250,250",
]
SAMPLE_TASKS = [
    TraceTask(submit_s=0.0, duration_s=3000.0, gpus=1, qos="LS"),
    TraceTask(submit_s=30.0, duration_s=500.0, gpus=8, qos="BE"),
    TraceTask(submit_s=50.0, duration_s=1000.0, gpus=4, qos="Guaranteed"),
]


@pytest.fixture
def alibaba_sample(tmp_path: Path) -> Path:
    return _write(tmp_path / "ali.csv", [ALIBABA_HEADER, *ALIBABA_ROWS])


def test_read_alibaba_tasks_keeps_gpu_tasks_that_ran(alibaba_sample: Path) -> None:
    assert read_alibaba_tasks(alibaba_sample) == SAMPLE_TASKS


def test_read_alibaba_tasks_sorts_by_submit_and_reads_crlf(tmp_path: Path) -> None:
    path = _write(tmp_path / "crlf.csv", [ALIBABA_HEADER, *reversed(ALIBABA_ROWS)], end="\r\n")
    assert read_alibaba_tasks(path) == SAMPLE_TASKS


@pytest.mark.parametrize(
    ("row", "what"),
    [
        ("p9,1,1,1,1000,,LS,Running,1x,10,0", r"line 4: creation_time '1x'"),
        ("p9,1,1,one,1000,,LS,Running,0,10,0", r"line 4: num_gpu 'one'"),
        ("p9,1,1,1.5,1000,,LS,Running,0,10,0", r"line 4: num_gpu '1\.5' is fractional"),
        ("p9,1,1,1,1000,,LS,Running,0,-10,0", r"line 4: deletion_time '-10'"),
        ("p9,1,1,1,1000,,LS,Running,0,nan,0", r"line 4: deletion_time 'nan'"),
        ("p9,1,1,,1000,,LS,Running,0,10,0", r"line 4: empty num_gpu"),
        ("p9,1,1,1,1000,,LS,Running,,10,0", r"line 4: empty creation_time"),
        ("p9,1,1,1,1000,,LS,Running,0", r"line 4: 9 fields, the header has 11"),
    ],
)
def test_read_alibaba_tasks_names_the_malformed_line(tmp_path: Path, row: str, what: str) -> None:
    # Line 4: the header, two good rows, then the bad one (a no-GPU row is checked too).
    path = _write(tmp_path / "ali.csv", [ALIBABA_HEADER, ALIBABA_ROWS[0], ALIBABA_ROWS[1], row])
    with pytest.raises(ValueError, match=r"ali\.csv: " + what):
        read_alibaba_tasks(path)


def test_read_alibaba_tasks_rejects_files_without_usable_tasks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"none\.csv: no usable task"):
        read_alibaba_tasks(_write(tmp_path / "none.csv", [ALIBABA_HEADER, *ALIBABA_ROWS[1:3]]))
    with pytest.raises(ValueError, match=r"blank\.csv: empty file"):
        read_alibaba_tasks(_write(tmp_path / "blank.csv", ["", ""]))
    with pytest.raises(ValueError, match=r"cols\.csv: no column scheduled_time"):
        header = ALIBABA_HEADER.replace(",scheduled_time", "")
        read_alibaba_tasks(_write(tmp_path / "cols.csv", [header, "p0,1,1,1,1,,LS,R,0,9"]))
    with pytest.raises(ValueError, match=r"cannot read trace .*missing\.csv"):
        read_alibaba_tasks(tmp_path / "missing.csv")


# --- alibaba_jobs ---------------------------------------------------------------------


def test_alibaba_jobs_tiles_the_trace_to_the_target_load(alibaba_sample: Path) -> None:
    # One copy of the sample offers 3000 + 8 x 500 + 4 x 1000 = 11,000 GPU-s; the
    # target 0.5 x 16 GPUs x 1 day = 691,200 GPU-s takes about 63 copies.
    horizon = DAY_S
    jobs = alibaba_jobs(alibaba_sample, horizon, capacity_gpus=16, target_load=0.5, seed=2)
    assert len(jobs) > 3 * 60
    assert _load(jobs, horizon) == pytest.approx(0.5 * 16, rel=0.01)
    submits = [j.submit_s for j in jobs]
    assert submits == sorted(submits) and submits[0] >= 0 and submits[-1] < horizon
    assert [j.job_id for j in jobs[:2]] == ["a-000000", "a-000001"]
    assert all(re.fullmatch(r"a-\d{6}", j.job_id) for j in jobs)
    # Each job is one of the three tasks: BE is elastic, LS and Guaranteed are training.
    by_duration = {t.duration_s: t for t in SAMPLE_TASKS}
    for j in jobs:
        task = by_duration[j.duration_s]
        assert j.kind == ("elastic" if task.qos == "BE" else "training")
        assert (j.gpus_per_node, j.nodes) == (task.gpus, 1)
    counts = {d: sum(j.duration_s == d for j in jobs) for d in by_duration}
    assert max(counts.values()) - min(counts.values()) <= 1  # whole copies, cut once
    # The copies are evenly spaced: the sample repeats with the same gaps.
    gaps = np.diff([j.submit_s for j in jobs if j.duration_s == 3000.0])
    assert np.allclose(gaps, gaps[0])
    # Within a copy the trace's gaps (30 s, 20 s), between copies its mean gap (25 s),
    # all scaled by one factor.
    in_trace_s = np.diff(submits) * 30 / np.diff(submits).max()
    assert np.allclose(np.sort(in_trace_s[:3]), [20, 25, 30])
    assert np.allclose(in_trace_s, np.resize(in_trace_s[:3], len(in_trace_s)))


def test_alibaba_jobs_options(alibaba_sample: Path) -> None:
    jobs = alibaba_jobs(
        alibaba_sample,
        DAY_S,
        16,
        0.5,
        gpus_per_node=4,
        elastic_qos=("BE", "Guaranteed"),
        max_duration_s=2000.0,
    )
    shapes = {(j.kind, j.duration_s, j.gpus_per_node, j.nodes) for j in jobs}
    assert shapes == {
        ("training", 2000.0, 1, 1),  # capped
        ("elastic", 500.0, 4, 2),  # 8 GPUs on 4-GPU nodes: two whole nodes
        ("elastic", 1000.0, 4, 1),
    }
    assert _load(jobs, DAY_S) == pytest.approx(8.0, rel=0.01)


def test_alibaba_jobs_seeds(alibaba_sample: Path) -> None:
    def submits(seed: int) -> list[float]:
        return [j.submit_s for j in alibaba_jobs(alibaba_sample, DAY_S, 16, 0.5, seed=seed)]

    assert submits(1) == submits(1)
    assert submits(1) != submits(2)


@pytest.mark.parametrize(
    ("horizon", "capacity", "load"),
    [(7 * DAY_S, 64, 0.6), (3 * DAY_S, 256, 0.8), (DAY_S, 1024, 0.5)],
)
def test_alibaba_jobs_on_the_real_trace(horizon: float, capacity: int, load: float) -> None:
    path = _shared_trace("alibaba_gpu2023_tasks.csv")
    jobs = alibaba_jobs(path, horizon, capacity, load, seed=1)
    assert _load(jobs, horizon) == pytest.approx(load * capacity, rel=0.1)
    assert all(0 <= j.submit_s < horizon for j in jobs)
    assert all(j.duration_s <= 2 * DAY_S and 1 <= j.gpus <= 8 for j in jobs)
    kinds = {j.kind for j in jobs}
    assert kinds == {"training", "elastic"}
    # The load is spread over the horizon, not bunched in one part of it.
    halves = np.histogram([j.submit_s for j in jobs], bins=2, range=(0, horizon))[0]
    assert halves.min() > 0.2 * halves.sum()


def test_read_alibaba_tasks_on_the_real_trace() -> None:
    tasks = read_alibaba_tasks(_shared_trace("alibaba_gpu2023_tasks.csv"))
    # 8,152 rows: 1,088 without a GPU, 861 GPU tasks never scheduled.
    assert len(tasks) == 6203
    assert {t.qos for t in tasks} == {"LS", "BE", "Burstable", "Guaranteed"}
    assert all(t.duration_s > 0 and 1 <= t.gpus <= 8 for t in tasks)


# --- synthetic_jobs -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_synthetic_jobs_offer_the_target_load_split_as_asked(seed: int) -> None:
    horizon, capacity = WEEK_S, 512
    jobs = synthetic_jobs(horizon, capacity, 0.7, seed=seed)
    assert _load(jobs, horizon) == pytest.approx(0.7 * capacity, rel=0.1)
    elastic = [j for j in jobs if j.kind == "elastic"]
    training = [j for j in jobs if j.kind == "training"]
    assert _load(elastic, horizon) / _load(jobs, horizon) == pytest.approx(0.4, rel=0.1)
    submits = [j.submit_s for j in jobs]
    assert submits == sorted(submits) and submits[0] >= 0 and submits[-1] < horizon
    # Ids count up per kind in submit order.
    assert [j.job_id for j in training] == [f"t-{i:06d}" for i in range(len(training))]
    assert [j.job_id for j in elastic] == [f"e-{i:06d}" for i in range(len(elastic))]
    # Shapes: training 1/2/4/8 GPUs on one node, or 2-8 whole nodes (about 10% of them).
    multi = [j for j in training if j.nodes > 1]
    assert all(j.gpus_per_node in (1, 2, 4, 8) for j in training if j.nodes == 1)
    assert all(j.gpus_per_node == 8 and 2 <= j.nodes <= 8 for j in multi)
    assert 0.05 < len(multi) / len(training) < 0.15
    assert all(j.nodes == 1 and 1 <= j.gpus_per_node <= 8 for j in elastic)
    assert len({j.gpus_per_node for j in elastic}) == 8
    # Lognormal durations: medians 4 h and 20 min (a few hundred jobs or more each).
    assert np.median([j.duration_s for j in training]) == pytest.approx(4 * 3600, rel=0.2)
    assert np.median([j.duration_s for j in elastic]) == pytest.approx(1200, rel=0.2)
    # Poisson arrivals: spread evenly over the horizon's days.
    per_day = np.histogram(submits, bins=7, range=(0, horizon))[0]
    assert per_day.min() > 0.8 * per_day.mean()


def test_synthetic_jobs_options() -> None:
    only_training = synthetic_jobs(DAY_S, 256, 0.5, elastic_share=0.0, multi_node_share=0.0)
    assert {j.kind for j in only_training} == {"training"}
    assert all(j.nodes == 1 for j in only_training)
    assert _load(only_training, DAY_S) == pytest.approx(128, rel=0.1)
    only_elastic = synthetic_jobs(DAY_S, 256, 0.5, elastic_share=1.0)
    assert {j.kind for j in only_elastic} == {"elastic"}
    all_multi = synthetic_jobs(DAY_S, 4096, 0.5, elastic_share=0.0, multi_node_share=1.0)
    assert {j.nodes for j in all_multi} == set(range(2, 9))
    small_nodes = synthetic_jobs(DAY_S, 256, 0.5, gpus_per_node=4, seed=3)
    assert max(j.gpus_per_node for j in small_nodes) == 4
    assert any(j.kind == "training" and j.gpus == 8 and j.nodes == 2 for j in small_nodes)
    assert any(j.kind == "elastic" and j.nodes == 2 for j in small_nodes)


def test_synthetic_jobs_seeds() -> None:
    assert synthetic_jobs(DAY_S, 64, 0.7, seed=5) == synthetic_jobs(DAY_S, 64, 0.7, seed=5)
    assert synthetic_jobs(DAY_S, 64, 0.7, seed=5) != synthetic_jobs(DAY_S, 64, 0.7, seed=6)


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"horizon_s": 0.0}, "horizon_s"),
        ({"capacity_gpus": 0}, "capacity_gpus"),
        ({"target_load": 0.0}, "target_load"),
        ({"target_load": -0.5}, "target_load"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"elastic_share": 1.5}, "elastic_share"),
        ({"multi_node_share": -0.1}, "multi_node_share"),
    ],
)
def test_synthetic_jobs_rejects_bad_arguments(kwargs: dict[str, float], bad: str) -> None:
    args: dict[str, float] = {"horizon_s": DAY_S, "capacity_gpus": 8, "target_load": 0.5}
    with pytest.raises(ValueError, match=bad):
        synthetic_jobs(**{**args, **kwargs})  # type: ignore[arg-type]


def test_alibaba_jobs_rejects_bad_arguments(alibaba_sample: Path) -> None:
    with pytest.raises(ValueError, match="max_duration_s"):
        alibaba_jobs(alibaba_sample, DAY_S, 8, 0.5, max_duration_s=0.0)
    with pytest.raises(ValueError, match="capacity_gpus"):
        alibaba_jobs(alibaba_sample, DAY_S, -8, 0.5)


def test_ramp_series_has_steep_ramps_and_sudden_steps() -> None:
    day = 86_400.0
    series = workload.ramp_series(
        {"m": 100.0}, 2 * day, 5.0, ramps_per_day=4, steps_per_day=4, noise=0.0, seed=3
    )
    rates = np.asarray(series.rates["m"])
    assert rates.min() == pytest.approx(100.0)  # the base, between events
    assert rates.max() == pytest.approx(500.0)  # a ramp's plateau: 5x
    # the steepest rise over one minute is a step's (2x the base in 60 s), and over 30
    # minutes a ramp's (4x the base)
    per_min = 12
    assert (rates[per_min:] - rates[:-per_min]).max() == pytest.approx(200.0, rel=0.02)
    half_hour = 360
    assert (rates[half_hour:] - rates[:-half_hour]).max() == pytest.approx(400.0, rel=0.02)
    with pytest.raises(ValueError, match="ramp_factor"):
        workload.ramp_series({"m": 1.0}, day, ramp_factor=0.5)
    with pytest.raises(ValueError, match="step_hold_s"):
        workload.ramp_series({"m": 1.0}, day, step_hold_s=0)


def test_bursty_series_has_bursts_silences_a_shifting_mix_and_growing_surges() -> None:
    day = 86_400.0
    step = 5.0
    models = {"a": 100.0, "b": 100.0}
    series = workload.bursty_series(models, 3 * day, step, spike_sigma=0.0, seed=4)
    a, b = (np.asarray(series.rates[m]) for m in models)
    for rates, mean in ((a, 100.0), (b, 100.0)):
        assert rates.mean() == pytest.approx(mean)  # scaled to the model's rate
    # bursts and near-silences: the level is either "on" or at most quiet x it, with
    # silences of minutes between the bursts
    level = np.asarray(workload.bursty_series({"a": 100.0}, day, step, spike_sigma=0.0,
                                              mix_amplitude=0.0, surges_per_day=0.0,
                                              seed=4).rates["a"])  # fmt: skip
    on = level > level.max() / 2
    assert set(np.round(level / level.max(), 6)) == {1.0, 0.05}
    edges = np.flatnonzero(np.diff(on.astype(int)))
    runs = np.diff(edges) * step
    assert 120.0 < float(np.median(runs)) < 600.0  # bursts and gaps of minutes
    assert len(edges) > 100  # many a day
    # the mix shifts within the hour: the heavier model changes
    hourly = [(a[i : i + 120].mean() > b[i : i + 120].mean()) for i in range(0, 17280, 120)]
    assert 0 < sum(hourly) < len(hourly) and any(x != y for x, y in itertools.pairwise(hourly))
    # surges grow with the day: each day's highest minute above the days before
    per_min = a[: len(a) // 12 * 12].reshape(-1, 12).mean(axis=1)
    days = per_min.reshape(3, -1).max(axis=1)
    assert days[1] > days[0] and days[2] > days[1]
    with pytest.raises(ValueError, match="quiet"):
        workload.bursty_series({"m": 1.0}, day, quiet=1.5)
    with pytest.raises(ValueError, match="gap_s"):
        workload.bursty_series({"m": 1.0}, day, gap_s=0)
