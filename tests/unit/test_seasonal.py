"""The seasonal forecast (issue 29): the rule on literal multi-day series
(`bridge.policy.seasonal.growth`), its memory (`SeasonLog`), the forecast it raises
(`bridge.policy.forecast.forecast_rate`), the rate history's store (`bridge.leases.rates`)
and the daemon writing it as buckets close and reading it back after a restart, and the
simulator: a surge at the same hour each day is lent for before it starts, the quiet
proof never hides a seasonal lend."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.config import PolicyConfig
from bridge.daemon.reconciler import LendMemory
from bridge.daemon.seasons import SeasonKeeper
from bridge.leases.rates import RateStore
from bridge.leases.store import create_schema, make_engine
from bridge.policy import ModelSample
from bridge.policy.forecast import forecast_rate
from bridge.policy.seasonal import BUCKET_S, DAY_BUCKETS, SeasonLog, bucket_of, growth
from bridge.sim.build import build_scenario, model_rates
from bridge.sim.engine import Engine, Timing
from bridge.sim.policies import compare, setup_for, size
from tests.unit.fakes import Harness, at, make_harness

DAY = 86400.0
#: a bucket on day 10, 09:00 (bucket-aligned)
NOW_BUCKET = 10 * DAY_BUCKETS + 108


def day_shape(surge_at: int | None, factor: float = 4.0, base: float = 100.0) -> dict[int, float]:
    """One day's bucket means around NOW_BUCKET's time of day on each earlier day d: flat
    `base`, `factor` x from bucket offset `surge_at` (relative to this time) on."""
    return {
        k: base * (factor if surge_at is not None and k >= surge_at else 1.0) for k in range(-3, 6)
    }


def history(days: dict[int, dict[int, float]]) -> dict[int, float]:
    """Bucket index -> mean for the given earlier days (d -> offset -> mean)."""
    out: dict[int, float] = {}
    for d, shape in days.items():
        for k, v in shape.items():
            out[NOW_BUCKET - d * DAY_BUCKETS + k] = v
    return out


NOW = NOW_BUCKET * BUCKET_S + 10.0  # 10 s into the bucket


# ---- the rule on literal multi-day series ------------------------------------------------


def test_a_surge_every_day_within_the_lead_is_a_growth() -> None:
    rates = history({1: day_shape(1), 2: day_shape(1)})
    assert growth(rates, NOW, 300.0, days=7) == pytest.approx(4.0)


def test_one_day_without_the_surge_makes_no_season() -> None:
    # min over the days: one day's random burst at this hour is not a season
    assert growth(history({1: day_shape(1), 2: day_shape(None)}), NOW, 300.0, days=7) is None
    # two surges of different sizes: the smaller
    both = history({1: day_shape(1, 4.0), 2: day_shape(1, 2.5)})
    assert growth(both, NOW, 300.0, days=7) == pytest.approx(2.5)


def test_fewer_than_two_days_remembered_make_no_season() -> None:
    assert growth(history({1: day_shape(1)}), NOW, 300.0, days=7) is None
    # and days beyond `days` are not read
    assert growth(history({2: day_shape(1), 3: day_shape(1)}), NOW, 300.0, days=1) is None


def test_a_surge_beyond_the_lead_is_not_seen_yet() -> None:
    rates = history({1: day_shape(4), 2: day_shape(4)})  # 20 minutes after this time
    assert growth(rates, NOW, 300.0, days=7) is None  # the lead reaches the next bucket
    assert growth(rates, NOW, 1200.0, days=7) == pytest.approx(4.0)


def test_the_base_is_the_rate_before_the_rise() -> None:
    # the surge starts inside this bucket on each day: its mean holds part of the rise, the
    # bucket before is the level the rate is at now
    shape = {-1: 100.0, 0: 250.0, 1: 400.0, 2: 400.0}
    rates = history({1: shape, 2: shape})
    assert growth(rates, NOW, 300.0, days=7) == pytest.approx(4.0)


def test_a_fall_or_silence_is_no_growth() -> None:
    falling = {k: 400.0 if k < 1 else 100.0 for k in range(-3, 6)}
    assert growth(history({1: falling, 2: falling}), NOW, 300.0, days=7) is None
    silent = {k: 0.0 if k < 1 else 50.0 for k in range(-3, 6)}  # from silence: no proportion
    assert growth(history({1: silent, 2: silent}), NOW, 300.0, days=7) is None


# ---- the forecast it raises --------------------------------------------------------------


def samples(rate: float, n: int = 12) -> tuple[ModelSample, ...]:
    return tuple(
        ModelSample(p99_ms=None, at=NOW - 5.0 * (n - 1 - i), request_rate=rate) for i in range(n)
    )


class Fixed:
    def __init__(self, g: float | None) -> None:
        self.g = g

    def growth(self, model: str, now: float, horizon_s: float) -> float | None:
        return self.g


def test_the_forecast_is_the_level_times_the_growth_when_higher() -> None:
    flat = samples(100.0)
    assert forecast_rate(flat, NOW, 60.0, 300.0) == pytest.approx(100.0)
    assert forecast_rate(flat, NOW, 60.0, 300.0, Fixed(3.0), "m") == pytest.approx(300.0)
    assert forecast_rate(flat, NOW, 60.0, 300.0, Fixed(None), "m") == pytest.approx(100.0)
    # a steeper trend wins over a smaller season
    rising = tuple(
        ModelSample(p99_ms=None, at=NOW - 5.0 * (11 - i), request_rate=100.0 + 10 * i)
        for i in range(12)
    )
    trend_only = forecast_rate(rising, NOW, 60.0, 300.0)
    assert trend_only is not None and trend_only > 300.0
    assert forecast_rate(rising, NOW, 60.0, 300.0, Fixed(1.1), "m") == pytest.approx(trend_only)


# ---- the memory --------------------------------------------------------------------------


def test_the_log_keeps_bucket_means_and_hands_closed_ones_to_the_store() -> None:
    log = SeasonLog(days=2)
    t0 = 1000 * BUCKET_S
    for i, rate in enumerate((10.0, 20.0, 30.0)):  # one bucket
        log.add("m", t0 + 5.0 * i, rate)
    log.add("m", t0 + 5.0, None)  # no rate: left out
    assert log.drain() == []  # still open
    log.add("m", t0 + BUCKET_S, 7.0)  # the next bucket closes the first
    assert log.drain() == [("m", 1000, 20.0)]
    assert log.drain() == []
    assert dict(log.rates("m")) == {1000: 20.0}


def test_the_log_forgets_buckets_and_models_past_its_days() -> None:
    log = SeasonLog(days=1)
    t0 = 1000 * BUCKET_S
    for k in range(DAY_BUCKETS + 5):
        log.add("m", t0 + k * BUCKET_S, 1.0)
        log.add("old", t0, 1.0) if k == 0 else None
    log.add("old", t0 + BUCKET_S, 1.0)  # closes "old"'s only bucket
    assert min(log.rates("m")) > 1000  # the first buckets are gone
    assert len(log.rates("m")) <= DAY_BUCKETS + 1
    log.expire(t0 + (DAY_BUCKETS + 5) * BUCKET_S)
    assert "old" not in set(log.models()) and "m" in set(log.models())


def test_the_memo_gives_what_the_rule_gives() -> None:
    log = SeasonLog(days=7)
    rates = history({1: day_shape(1), 2: day_shape(1, 3.0), 3: day_shape(2)})
    log.load(("m", b, r) for b, r in rates.items())
    for t in (NOW, NOW + 100, NOW + BUCKET_S, NOW + 2 * BUCKET_S):
        for h in (30.0, 300.0, 900.0):
            assert log.growth("m", t, h) == growth(log.rates("m"), t, h, 7)
    assert log.growth("unknown", NOW, 300.0) is None


# ---- the store and the daemon ------------------------------------------------------------


def test_the_rate_store_records_reads_back_and_prunes(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    store = RateStore(engine)
    start = 1_800_000_000.0 - 1_800_000_000.0 % BUCKET_S
    store.record([("m", start, 10.0), ("m", start + BUCKET_S, 12.0), ("n", start, 3.0)])
    store.record([("m", start, 11.0)])  # written again (a failover): the newer mean
    since = datetime.fromtimestamp(start, UTC)
    assert sorted(store.since(since)) == [
        ("m", start, 11.0),
        ("m", start + BUCKET_S, 12.0),
        ("n", start, 3.0),
    ]
    store.prune(datetime.fromtimestamp(start + BUCKET_S, UTC))
    assert store.since(since) == [("m", start + BUCKET_S, 12.0)]


def test_the_keeper_writes_closed_buckets_and_a_new_one_reads_them_back(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    memory = LendMemory(season_days=3)
    keeper = SeasonKeeper(memory.seasons, RateStore(engine))
    t0 = NOW_BUCKET * BUCKET_S - 2 * DAY  # two days of a daily surge, one sample a minute
    for k in range(int(2 * DAY / 60) + 20):
        t = t0 + 60.0 * k
        offset = (t - t0) % DAY
        rate = 400.0 if BUCKET_S <= offset < BUCKET_S + 1800 else 100.0
        memory.track({"m": (ModelSample(p99_ms=None, at=t, request_rate=rate),)})
        if k % 30 == 0:
            keeper.write(datetime.fromtimestamp(t, UTC))
    keeper.write(datetime.fromtimestamp(t0 + 2 * DAY + 1200, UTC))
    assert memory.seasons is not None
    before = memory.seasons.growth("m", NOW, 300.0)
    assert before == pytest.approx(4.0)

    again = LendMemory(season_days=3)
    SeasonKeeper(again.seasons, RateStore(engine)).recall(datetime.fromtimestamp(NOW, UTC))
    assert again.seasons is not None
    assert again.seasons.growth("m", NOW, 300.0) == before
    assert dict(again.seasons.rates("m")) == dict(memory.seasons.rates("m"))


def test_seasonal_days_0_keeps_nothing() -> None:
    memory = LendMemory(season_days=0)
    memory.track({"m": (ModelSample(p99_ms=None, at=NOW, request_rate=5.0),)})
    assert memory.seasons is None
    SeasonKeeper(None, None).write(datetime.fromtimestamp(NOW, UTC))  # nothing to do


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def test_the_daemon_stores_its_rate_history_and_reads_it_back_after_a_restart(h: Harness) -> None:
    rec = h.reconciler
    seasons = rec.memory.seasons
    assert seasons is not None and h.config.policy.seasonal_days == 7  # the default
    t0 = at(0).timestamp()
    first = bucket_of(t0)
    seasons.add("busy", t0, 40.0)
    seasons.add("busy", t0 + BUCKET_S, 60.0)  # closes the first bucket
    h.tick(BUCKET_S + 1)  # the pass writes what closed
    stored = RateStore.beside(h.store).since(at(-3600))
    assert ("busy", first * BUCKET_S, 40.0) in stored

    again = h.restarted()
    assert again.memory.seasons is not None
    assert not again.memory.seasons.rates("busy")
    again.run_once(at(BUCKET_S + 2))  # its first active pass recalls
    assert again.memory.seasons.rates("busy")[first] == 40.0


# ---- the simulator -----------------------------------------------------------------------


def daily_setup(days: float, seasonal_days: int, *, check: bool = False) -> Engine:
    rates = model_rates(2, 400.0)
    scenario = build_scenario(
        days=days, nodes=24, gpus_per_node=8, rates=rates, slo_ms=100.0, service_ms=20.0,
        arrivals="daily", arrivals_trace=None, jobs="synthetic", jobs_trace=None, load=0.8,
        policies=["bridge"], timing=Timing(model_load_s=dict.fromkeys(rates, 300.0)),
        policy=PolicyConfig(seasonal_days=seasonal_days), models=None, lend_cap="peak",
    )  # fmt: skip
    setup = setup_for("bridge", scenario, size(scenario))
    return Engine(replace(setup, check_quiet=check))


def test_the_simulated_bridge_lends_before_a_daily_surge_and_the_proof_never_hides_it() -> None:
    # check_quiet: every tick the quiet proof skips is checked by assess (an assertion)
    # (to 10:00 of the third day: m0's surge at 09:00 and its first half hour)
    on = daily_setup(2.42, 7, check=True).run()
    off = daily_setup(2.42, 0).run()
    on_lends = [d.at_s for d in on.decisions if d.kind == "lend"]
    off_lends = [d.at_s for d in off.decisions if d.kind == "lend"]
    # on the third day (two days remembered), m0's surge (09:00) is lent for before it
    surge = 2 * DAY + 9 * 3600.0
    early_on = [t for t in on_lends if surge - 900 <= t < surge - 60]
    early_off = [t for t in off_lends if surge - 900 <= t < surge - 60]
    assert early_on and not early_off, (early_on, early_off)
    assert on.within_share > off.within_share
    # the first two days decide alike (no season yet)
    assert [t for t in on_lends if t < 2 * DAY] == [t for t in off_lends if t < 2 * DAY]


def test_compare_runs_with_and_without_seasons_on_a_random_trace_alike() -> None:
    # ramps (Poisson-timed events): no event recurs at the same hour on both earlier days,
    # so the seasonal forecast never fires and the run is the same decision for decision
    rates = model_rates(2, 400.0)

    def run(days: int) -> list[tuple[float, str]]:
        scenario = build_scenario(
            days=2.5, nodes=24, gpus_per_node=8, rates=rates, slo_ms=100.0, service_ms=20.0,
            arrivals="ramps", arrivals_trace=None, jobs="synthetic", jobs_trace=None, load=0.8,
            policies=["bridge"], timing=None, policy=PolicyConfig(seasonal_days=days),
            models=None, lend_cap="peak",
        )  # fmt: skip
        result = compare(scenario, ["bridge"]).results[-1]
        return [(d.at_s, d.kind) for d in result.decisions]

    assert run(7) == run(0)
