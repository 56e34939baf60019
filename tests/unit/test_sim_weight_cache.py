"""The simulator's node-local weight cache (`bridge.sim.setup.Timing`: `cache_models`,
`local_load_s`): a model a node served lately loads from its cache, the rest from the
shared repository; the cache keeps the most recently served models, and none when off."""

from __future__ import annotations

from bridge.sim.setup import Timing


def test_a_cached_model_loads_at_its_local_time_and_the_slowest_decides() -> None:
    t = Timing(model_load_s={"a": 300.0, "b": 200.0}, cache_models=2, local_load_s={"a": 10.0})
    assert t.load_s(["a"], cached=["a"]) == 10.0
    assert t.load_s(["a"], cached=[]) == 300.0
    assert t.load_s(["a", "b"], cached=["a", "b"]) == 200.0  # b has no local time
    assert t.load_s(["c"], cached=["c"]) == 0.0  # no load time known: none added


def test_the_cache_keeps_the_most_recently_served_models() -> None:
    t = Timing(model_load_s={"a": 300.0}, cache_models=2, local_load_s={"a": 10.0})
    cached: list[str] = []
    t.remember(cached, ["a"])
    t.remember(cached, ["b"])
    t.remember(cached, ["a"])  # a again: most recent
    t.remember(cached, ["c"])  # b, the least recent, goes
    assert cached == ["a", "c"]


def test_without_a_cache_every_load_is_from_the_shared_repository() -> None:
    t = Timing(model_load_s={"a": 300.0}, local_load_s={"a": 10.0})  # cache_models 0
    cached: list[str] = []
    t.remember(cached, ["a"])
    assert cached == [] and t.load_s(["a"], cached=["a"]) == 300.0
