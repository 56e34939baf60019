"""Arrival schedules: Poisson statistics, trace parsing on literal rows in the real
schemas of ../shared/traces, replay options (start, speed-up, duration, caps), bad input."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bridge.load.arrivals import (
    MAX_ARRIVALS,
    ArrivalError,
    parse_trace,
    poisson,
    read_trace,
    replay,
)
from bridge.paths import traces_dir

# --- Poisson ------------------------------------------------------------------------
# The count of a Poisson process over T seconds at rate r is Poisson(rT): sd sqrt(rT).
# Bounds are 5 sd (a correct generator fails one with probability < 1e-6 per seed).

RATE, DURATION = 40.0, 100.0
EXPECTED = RATE * DURATION  # 4000 arrivals, sd 63


def _within_5_sd(count: int, expected: float) -> bool:
    return abs(count - expected) <= 5 * math.sqrt(expected)


def test_poisson_mean_rate_for_a_fixed_seed() -> None:
    s = poisson(RATE, DURATION, seed=0)
    assert _within_5_sd(len(s.offsets), EXPECTED), len(s.offsets)
    assert s.window_s == DURATION
    assert s.offered_rate == pytest.approx(len(s.offsets) / DURATION)


def test_poisson_mean_rate_over_several_seeds() -> None:
    counts = [len(poisson(RATE, DURATION, seed=seed).offsets) for seed in range(20)]
    assert all(_within_5_sd(c, EXPECTED) for c in counts), counts
    # The sum of 20 independent Poisson(4000) counts is Poisson(80000): sd 283.
    assert _within_5_sd(sum(counts), 20 * EXPECTED), sum(counts)
    # And the counts do vary between seeds, with a spread of the Poisson kind: their
    # sample variance estimates 4000 (chi-square, 19 dof: 5x below or above is absurd).
    assert EXPECTED / 5 < float(np.var(counts, ddof=1)) < EXPECTED * 5


def test_poisson_inter_arrival_cv_is_near_one() -> None:
    # Exponential gaps have CV 1 (a regular schedule has 0). With n = 4000 gaps the CV
    # estimate has a standard error near sqrt(8 / (4n)) ~ 0.022; 0.12 is over 5 of them.
    for seed in (0, 1, 2):
        gaps = np.diff((0.0, *poisson(RATE, DURATION, seed=seed).offsets))
        cv = float(gaps.std() / gaps.mean())
        assert abs(cv - 1.0) < 0.12, (seed, cv)
        # Mean gap is 1/rate; same 5-standard-error reasoning (se = 1/(rate sqrt n)).
        assert abs(gaps.mean() - 1 / RATE) < 5 / (RATE * math.sqrt(len(gaps)))


def test_poisson_offsets_are_sorted_in_window_and_reproducible() -> None:
    a = poisson(25.0, 10.0, seed=7)
    assert list(a.offsets) == sorted(a.offsets)
    assert all(0 <= t < 10.0 for t in a.offsets)
    assert a == poisson(25.0, 10.0, seed=7)
    assert a.offsets != poisson(25.0, 10.0, seed=8).offsets


def test_poisson_cap_cuts_the_schedule_and_the_window() -> None:
    full = poisson(100.0, 10.0, seed=3)
    capped = poisson(100.0, 10.0, seed=3, max_requests=50)
    assert capped.offsets == full.offsets[:50]
    assert capped.window_s == capped.offsets[-1]
    # A cap above the count changes nothing.
    assert poisson(100.0, 10.0, seed=3, max_requests=10**5) == full


def test_poisson_is_bounded_even_when_asked_for_more() -> None:
    s = poisson(1e6, 10.0, seed=0)  # 10 million asked
    assert len(s.offsets) == MAX_ARRIVALS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate_per_s": -1.0, "duration_s": 10.0}, "rate"),
        ({"rate_per_s": 0.0, "duration_s": 10.0}, "rate"),
        ({"rate_per_s": math.nan, "duration_s": 10.0}, "rate"),
        ({"rate_per_s": 10.0, "duration_s": -5.0}, "duration"),
        ({"rate_per_s": 10.0, "duration_s": math.inf}, "duration"),
        ({"rate_per_s": 10.0, "duration_s": 1.0, "max_requests": 0}, "max_requests"),
    ],
)
def test_poisson_refuses_bad_input(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ArrivalError, match=message):
        poisson(**kwargs)  # type: ignore[arg-type]


# --- traces -------------------------------------------------------------------------
# The first rows of azure_llm_conv_2023.csv (Azure/AzurePublicDataset, CC-BY 4.0;
# Patel et al., "Splitwise", ISCA 2024), byte for byte: CRLF line ends, header first.
AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:51.2224670,879,55\r\n"
    "2023-11-16 18:15:51.3910170,91,16"  # the file has no final newline
)
AZURE_TIMES = (0.0, 4.314579, 4.541877, 4.710427)

# The first rows of alibaba_gpu2023_tasks.csv (alibaba/clusterdata, research use; Weng
# et al., ATC '23): creation_time is seconds from the trace start; gpu_spec is empty.
ALIBABA = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
    "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
    "openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061\n"
)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def test_azure_rows_parse_to_exact_offsets() -> None:
    trace = parse_trace(_lines(AZURE), source="azure")
    assert trace.format == "azure-llm"
    assert trace.times == pytest.approx(AZURE_TIMES, abs=1e-9)
    assert trace.span_s == pytest.approx(4.710427)


def test_alibaba_rows_parse_on_creation_time() -> None:
    trace = parse_trace(_lines(ALIBABA), source="alibaba")
    assert trace.format == "alibaba-gpu"
    assert trace.times == (0.0, 427061.0)


def test_parser_tolerates_bom_blank_lines_and_unsorted_rows() -> None:
    rows = _lines(AZURE)
    text = ["\ufeff" + rows[0], "\r\n", rows[3], rows[1], "\r\n", rows[4] + "\r\n", rows[2]]
    assert parse_trace(text).times == pytest.approx(AZURE_TIMES, abs=1e-9)


def test_replay_speedup_start_duration_and_cap() -> None:
    trace = parse_trace(_lines(AZURE))
    s = replay(trace)
    assert s.offsets == pytest.approx(AZURE_TIMES)
    assert s.window_s == pytest.approx(4.710427)

    fast = replay(trace, speedup=2.0)
    assert fast.offsets == pytest.approx([t / 2 for t in AZURE_TIMES])

    late = replay(trace, start_s=4.4)  # skip the first 4.4 s of trace time
    assert late.offsets == pytest.approx([4.541877 - 4.4, 4.710427 - 4.4])

    short = replay(trace, duration_s=4.5)  # wall seconds: keeps arrivals due before 4.5
    assert short.offsets == pytest.approx(AZURE_TIMES[:2])
    assert short.window_s == 4.5

    capped = replay(trace, max_requests=3)
    assert capped.offsets == pytest.approx(AZURE_TIMES[:3])
    assert capped.window_s == pytest.approx(AZURE_TIMES[2])

    both = replay(trace, speedup=10.0, start_s=4.0, duration_s=0.06)
    assert both.offsets == pytest.approx([0.0314579, 0.0541877])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty trace"),
        ("\r\n\r\n", "empty trace"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n", "header but no rows"),
        ("time,tokens\n1,2\n", r"unknown columns \['time', 'tokens'\]"),
        (
            "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,1\n2023-11-16T18:15:47,2\n",
            r"line 3: unparseable TIMESTAMP '2023-11-16T18:15:47'",
        ),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,1\n,2\n", "line 3: empty TIMESTAMP"),
        ("TIMESTAMP,ContextTokens\nyesterday,1\n", "unparseable TIMESTAMP 'yesterday'"),
        ("TIMESTAMP,ContextTokens\n2023-13-45 18:15:46,1\n", "unparseable TIMESTAMP"),
        ("name,creation_time\na,12\nb,-3\n", "line 3: unparseable creation_time '-3'"),
    ],
)
def test_bad_traces_raise_naming_the_fault(text: str, message: str) -> None:
    with pytest.raises(ArrivalError, match=message):
        parse_trace(_lines(text))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speedup": 0.0}, "speedup"),
        ({"speedup": -2.0}, "speedup"),
        ({"start_s": -1.0}, "start offset"),
        ({"start_s": 100.0}, "past the trace's end"),
        ({"duration_s": 0.0}, "duration"),
        ({"max_requests": 0}, "max_requests"),
        ({"start_s": 0.5, "duration_s": 1.0}, "no arrivals"),
    ],
)
def test_bad_replay_options_raise(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ArrivalError, match=message):
        replay(parse_trace(_lines(AZURE)), **kwargs)  # type: ignore[arg-type]


def test_read_trace_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ArrivalError, match="cannot read trace"):
        read_trace(tmp_path / "nope.csv")


def test_the_real_azure_trace_parses_whole() -> None:
    folder = traces_dir()
    path = (folder or Path("$STB_TRACES_DIR")) / "azure_llm_conv_2023.csv"
    if not path.exists():
        pytest.skip(f"{path} not present in this workspace")
    trace = read_trace(path)
    # SOURCES.md: 19,366 requests from 18:15:46 to 19:14:08, about 58 minutes.
    assert len(trace.times) == 19_366
    assert 57 * 60 < trace.span_s < 59 * 60
    # A minute of it at 60x: about a second of wall time, the trace's own count.
    s = replay(trace, speedup=60.0, duration_s=1.0)
    assert len(s.offsets) == sum(1 for t in trace.times if t < 60.0)
