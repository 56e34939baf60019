"""`stb simulate --cache` and the load times of `--timing leases`: the one `--cache`
parser (`bridge.sim.cache_option`, which bench/elasticity.py reads too) on literal
values, good and bad; the stored load measures mapped to the run's `Timing`
(`bridge.sim.inputs.loads`: literal measures in, literal seconds out: a placement's
measure as it is, a start's bound less Triton's start, never below 0; `--load-s` and
`--cache N:S` overriding the history for their part); and through the CLI: `--cache`
reaches the engine's timing and changes the run, a bad value is refused naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from bridge.cli import app
from bridge.sim.cache_option import OFF, CacheOption, parse_cache, with_cache
from bridge.sim.inputs.common import InputError
from bridge.sim.inputs.loads import LoadFigure, figures, load_timing
from bridge.sim.setup import Timing
from bridge.sim.weights import WeightCache
from tests.unit.helpers import load_bench

RUN = CliRunner()
GB = 1e9

# ---- the --cache parser --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cache"),
    [
        ("off", OFF),
        ("4:10", CacheOption(4, 10.0, False)),
        (" stage:2:0.5 ", CacheOption(2, 0.5, True)),
        ("1:0", CacheOption(1, 0.0, False)),
    ],
)
def test_the_cache_values(text: str, cache: CacheOption) -> None:
    assert parse_cache(text) == cache
    assert parse_cache(text, history=True) == cache


def test_without_s_the_local_loads_come_from_the_history_where_allowed() -> None:
    assert parse_cache("4", history=True) == CacheOption(4, None, False)
    assert parse_cache("stage:3", history=True) == CacheOption(3, None, True)
    assert str(parse_cache("stage:3", history=True)) == "stage:3"
    assert str(parse_cache("stage:3:7.5")) == "stage:3:7.5" and str(OFF) == "off"
    with pytest.raises(ValueError, match=r"--cache '4': give off, N:S or stage:N:S"):
        parse_cache("4")  # the bench has no history to read S from


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("on", "--cache 'on': give off, N:S, stage:N:S"),
        ("", "--cache '': give off"),
        ("4:10:2", "--cache '4:10:2': give off"),
        ("stage:", "--cache 'stage:': give off"),
        ("2.5:10", "--cache '2.5:10': give off"),
        ("0:10", "--cache '0:10': N, the models a node keeps, must be at least 1"),
        ("4:-1", "--cache '4:-1': S, the seconds a load from the cache takes, must be a number"),
        ("4:nan", "--cache '4:nan': S, the seconds"),
        ("stage:4:inf", "--cache 'stage:4:inf': S, the seconds"),
    ],
)
def test_a_bad_cache_value_is_refused_naming_the_option_and_the_value(
    text: str, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        parse_cache(text, history=True)
    assert message in str(caught.value)


def test_with_cache_puts_each_kind_into_the_timing() -> None:
    base = Timing(model_load_s={"a": 300.0}, triton_ready_s=3.0)
    local = {"a": 10.0}
    kept = with_cache(base, CacheOption(4, 10.0), local)
    assert (kept.cache_models, kept.weights, kept.local_load_s) == (4, None, {"a": 10.0})
    assert kept.load_s(["a"], cached=["a"]) == 10.0 and kept.triton_ready_s == 3.0
    staged = with_cache(
        base, CacheOption(2, 10.0, True), local, model_bytes=5 * GB, stage_bytes_s=GB
    )
    assert staged.cache_models == 0
    assert staged.weights == WeightCache(
        default_bytes=5 * GB, budget_bytes=10 * GB, stage_bytes_s=GB
    )
    off = with_cache(kept, OFF, local)
    assert off.cache() is None and off.local_load_s == {} and off.model_load_s == {"a": 300.0}


def test_the_bench_reads_cache_with_the_same_parser() -> None:
    bench = load_bench("elasticity")
    cache = bench._cache("stage:2:10")
    assert cache == CacheOption(2, 10.0, True)
    timing = bench.timing(["m0", "m1"], 300.0, cache, 140.0, 250.0)
    assert timing.model_load_s == {"m0": 300.0, "m1": 300.0}
    assert timing.local_load_s == {"m0": 10.0, "m1": 10.0}
    assert timing.weights.budget_bytes == 2 * 140 * GB
    assert timing.weights.stage_bytes_s == 250e6
    assert bench._cache_label(cache) == ", staged 2:10" and bench._cache_key(cache) == "_stage2_10"
    assert bench.timing(["m0"], 0.0, cache, 140.0, 250.0) is None  # no load: no cache
    with pytest.raises(SystemExit, match=r"--cache '4': give off, N:S or stage:N:S"):
        bench._cache("4")


# ---- the stored measures as load times ----------------------------------------------

#: per model, its stored measures (source, seconds), oldest first
MEASURES = {
    # a placement measure wins over the lends' bounds, and is its own load: kept whole
    "llm": [("lend", 330.0), ("placement", 290.0), ("placement", 300.0), ("local", 40.0)],
    # bounds only: the median of the newest five (the first is older), less Triton's start
    "mid": [
        *[("lend", s) for s in (500.0, 60.0, 70.0, 80.0, 90.0, 100.0)],
        *[("local", 12.0), ("local", 14.0)],
    ],
    # a lend no slower than Triton's own start adds nothing (never below 0)
    "small": [("lend", 4.0)],
    # not simulated: reported, never in the timing
    "gone": [("placement", 9.0)],
}


def test_each_models_figures_a_starts_bound_less_triton_ready() -> None:
    got = figures(MEASURES, triton_ready_s=5.0)
    assert got["llm"] == {
        "shared": LoadFigure("placement", 295.0, 2, 295.0),
        "local": LoadFigure("local", 40.0, 1, 35.0),
    }
    assert got["mid"] == {
        "shared": LoadFigure("lend", 80.0, 5, 75.0),
        "local": LoadFigure("local", 13.0, 2, 8.0),
    }
    assert got["small"] == {"shared": LoadFigure("lend", 4.0, 1, 0.0)}
    assert got["gone"] == {"shared": LoadFigure("placement", 9.0, 1, 9.0)}


HISTORY_TIMING = Timing(triton_ready_s=5.0)
MODELS = ["llm", "mid", "small", "quiet"]


def test_the_history_gives_the_loads_where_nothing_overrides_them() -> None:
    timing, notes = load_timing(HISTORY_TIMING, MODELS, history=MEASURES)
    assert timing.model_load_s == {"llm": 295.0, "mid": 75.0}  # small adds 0, quiet unknown
    assert timing.cache() is None and timing.local_load_s == {}
    assert timing.triton_ready_s == 5.0
    assert notes["model_load_s_from"] == "lease history"
    history = notes["load_history"]
    assert isinstance(history, dict)
    assert history["triton_ready_s_subtracted"] == 5.0
    assert history["not_simulated"] == ["gone"]
    assert history["models"]["mid"] == {
        "shared": {
            "source": "lend", "measured_s": 80.0, "measures": 5, "seconds": 75.0,
            "use": "model_load_s",
        },
        "local": {
            "source": "local", "measured_s": 13.0, "measures": 2, "seconds": 8.0,
            "use": "not used: --cache off",
        },
    }  # fmt: skip
    assert "cache" not in notes


def test_a_cache_without_s_takes_the_historys_local_loads() -> None:
    timing, notes = load_timing(
        HISTORY_TIMING, MODELS, history=MEASURES, cache=parse_cache("4", history=True)
    )
    assert timing.cache_models == 4
    assert timing.local_load_s == {"llm": 35.0, "mid": 8.0}
    assert timing.load_s(["mid"], cached=["mid"]) == 8.0
    assert timing.load_s(["llm", "mid"], cached=["mid"]) == 295.0  # llm not on the node
    assert notes["cache"] == {"value": "4", "local_load_s_from": "lease history"}
    history = notes["load_history"]
    assert isinstance(history, dict)
    assert history["models"]["llm"]["local"]["use"] == "local_load_s"


def test_load_s_and_a_given_s_override_the_history_for_their_part() -> None:
    timing, notes = load_timing(
        HISTORY_TIMING,
        MODELS,
        load_s=(None, {"llm": 120.0}),
        cache=parse_cache("stage:2:3", history=True),
        history=MEASURES,
    )
    assert timing.model_load_s == {"llm": 120.0, "mid": 75.0}  # mid's still the history's
    assert timing.local_load_s == dict.fromkeys(MODELS, 3.0)
    assert timing.weights is not None and timing.weights.stage_bytes_s > 0
    assert notes["model_load_s_from"] == "--load-s, else lease history"
    assert notes["cache"] == {"value": "stage:2:3", "local_load_s_from": "--cache"}
    history = notes["load_history"]
    assert isinstance(history, dict)
    assert history["models"]["llm"]["shared"]["use"] == "not used: --load-s gives it"
    assert history["models"]["mid"]["shared"]["use"] == "model_load_s"
    assert history["models"]["llm"]["local"]["use"] == "not used: --cache gives S"
    # a bare number gives every model: the history's shared loads are not used
    every, _ = load_timing(HISTORY_TIMING, MODELS, load_s=(0.0, {}), history=MEASURES)
    assert every.model_load_s == {}


def test_without_a_history_load_s_and_the_cache_are_the_options_alone() -> None:
    timing, notes = load_timing(
        Timing(), ["a", "b"], load_s=(30.0, {"b": 90.0}), cache=parse_cache("2:10")
    )
    assert timing.model_load_s == {"a": 30.0, "b": 90.0}
    assert (timing.cache_models, timing.local_load_s) == (2, {"a": 10.0, "b": 10.0})
    assert notes == {
        "model_load_s_from": "--load-s",
        "cache": {"value": "2:10", "local_load_s_from": "--cache"},
    }
    plain, said = load_timing(Timing(), ["a"])
    assert plain == Timing() and said == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"cache": CacheOption(4, 10.0)},
            "--cache 4:10: no simulated model has a load time from the shared repository "
            "(--load-s), so a cache has nothing to save",
        ),
        (
            {"cache": CacheOption(4, 10.0), "history": {"a": [("lend", 1.0)]}},
            "(--load-s, or the loads --timing leases read)",
        ),
        (
            {"cache": CacheOption(4), "load_s": (30.0, {})},
            "--cache 4 takes each model's load from a node's cache from the lease history: "
            "give --timing leases, or --cache 4:S",
        ),
        (
            {"cache": CacheOption(2, None, True), "history": {"a": [("placement", 60.0)]}},
            "--cache stage:2: the lease history holds no load from a node's cache (source "
            "local) of a simulated model (a): give --cache stage:2:S",
        ),
    ],
)
def test_a_cache_that_could_do_nothing_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as caught:
        load_timing(Timing(), ["a"], **kwargs)
    assert message in str(caught.value)


# ---- through the CLI ------------------------------------------------------------------

#: a run that lends (ramps past the reserved pool) with slow loads from the shared repository
LENDS = [
    "simulate", "--days", "0.25", "--nodes", "16", "--models", "2", "--mean-rps", "400",
    "--arrivals", "ramps", "--load", "1.1", "--load-s", "300", "--policies", "bridge",
    "--tradeoff", "none", "--format", "json",
]  # fmt: skip


@pytest.mark.timeout(120)
def test_cache_reaches_the_engines_timing_and_changes_the_run() -> None:
    runs = {}
    for value in ("off", "2:10"):
        res = RUN.invoke(app, [*LENDS, "--cache", value])
        assert res.exit_code == 0, res.output
        runs[value] = json.loads(res.stdout)
    off, cached = runs["off"], runs["2:10"]
    assert off["scenario"]["timing"]["cache_models"] == 0
    assert cached["scenario"]["timing"]["cache_models"] == 2
    assert cached["scenario"]["timing"]["local_load_s"] == {"m0": 10.0, "m1": 10.0}
    assert cached["scenario"]["timing_source"]["cache"]["value"] == "2:10"
    a, b = off["results"][0], cached["results"][0]
    assert a["lends"] > 0
    # the lends that found their weights on the node loaded sooner: the fleet moved apart
    assert (a["gpu_hours"], a["preemptions"]) != (b["gpu_hours"], b["preemptions"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache", "4:x"], "--cache '4:x': give off, N:S, stage:N:S"),
        (["--cache", "2:10"], "--cache 2:10: no simulated model has a load time"),
        (["--cache", "2"], "--cache 2 takes each model's load from a node's cache"),
    ],
)
def test_a_bad_cache_exits_2_naming_it(args: list[str], message: str) -> None:
    small = ["simulate", "--days", "0.05", "--nodes", "16", "--models", "2", "--mean-rps", "150"]
    res = RUN.invoke(app, [*small, "--format", "json", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and res.stdout == ""
