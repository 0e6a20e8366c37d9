"""Eviction policies on small tables, Belady's optimality, and pin safety."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.eviction import (
    CacheEntry,
    EvictionContext,
    EvictionPolicy,
    EvictionSettings,
    choose_victim,
    replay_cache,
)

NOW = 1000.0

# a: used long ago but very often; b: recent, rarely; c: recent burst in the window, big.
TABLE = [
    CacheEntry(adapter="a", last_used_s=100.0, uses=500, recent_uses_s=(), size_bytes=50),
    CacheEntry(adapter="b", last_used_s=990.0, uses=2, recent_uses_s=(980.0, 990.0), size_bytes=50),
    CacheEntry(
        adapter="c",
        last_used_s=900.0,
        uses=6,
        recent_uses_s=(850.0, 860.0, 870.0, 880.0, 890.0, 900.0),
        size_bytes=200,
    ),
]


@pytest.mark.parametrize(
    ("policy", "victim"),
    [
        (EvictionPolicy.LRU, "a"),  # oldest use
        (EvictionPolicy.LFU, "b"),  # fewest uses ever: LFU keeps the stale "a"
        (EvictionPolicy.TIME_WEIGHTED_LRU, "a"),  # nothing in the window, idle long
        (EvictionPolicy.CHAMELEON, "a"),  # no recent frequency, small, oldest
        (EvictionPolicy.FORECAST, "a"),  # no forecast, idle longest
    ],
    ids=["lru", "lfu", "tw-lru", "chameleon", "forecast"],
)
def test_victim_on_a_small_table(policy: EvictionPolicy, victim: str) -> None:
    assert choose_victim(EvictionContext(entries=TABLE, now_s=NOW, policy=policy)) == victim


def test_chameleon_size_term_keeps_large_adapters() -> None:
    small = CacheEntry(adapter="small", last_used_s=990.0, recent_uses_s=(990.0,), size_bytes=10)
    large = CacheEntry(adapter="large", last_used_s=980.0, recent_uses_s=(980.0,), size_bytes=400)
    ctx = EvictionContext(entries=[small, large], now_s=NOW, policy=EvictionPolicy.CHAMELEON)
    assert choose_victim(ctx) == "small"
    assert choose_victim(EvictionContext(entries=[small, large], now_s=NOW)) == "large"


def test_belady_evicts_the_furthest_next_use() -> None:
    ctx = EvictionContext(
        entries=TABLE,
        now_s=NOW,
        policy=EvictionPolicy.BELADY,
        next_use_s={"a": 1001.0, "b": 2000.0},
    )
    assert choose_victim(ctx) == "c"  # never used again


@pytest.mark.parametrize("policy", list(EvictionPolicy), ids=str)
def test_pinned_never_chosen_and_in_use_last(policy: EvictionPolicy) -> None:
    pinned = CacheEntry(adapter="p", last_used_s=0.0, pinned=True)
    busy = CacheEntry(adapter="busy", last_used_s=1.0, in_use=True)
    idle = CacheEntry(adapter="idle", last_used_s=999.0, uses=99, size_bytes=10**9)
    ctx = EvictionContext(entries=[pinned, busy, idle], now_s=NOW, policy=policy)
    assert choose_victim(ctx) == "idle"
    only_pinned = EvictionContext(entries=[pinned], now_s=NOW, policy=policy)
    assert choose_victim(only_pinned) is None


def test_pin_unaware_variant_may_evict_pins() -> None:
    pinned = CacheEntry(adapter="p", last_used_s=0.0, pinned=True)
    other = CacheEntry(adapter="o", last_used_s=5.0)
    unaware = EvictionSettings(pinned_aware=False)
    assert (
        choose_victim(EvictionContext(entries=[pinned, other], now_s=NOW, settings=unaware)) == "p"
    )


def optimal_misses(trace: tuple[str, ...], capacity: int) -> int:
    """Fewest misses of any demand-paging policy, by exhaustive search."""

    @functools.cache
    def best(step: int, cache: frozenset[str]) -> int:
        if step == len(trace):
            return 0
        adapter = trace[step]
        if adapter in cache:
            return best(step + 1, cache)
        if len(cache) < capacity:
            return 1 + best(step + 1, cache | {adapter})
        return 1 + min(best(step + 1, (cache - {victim}) | {adapter}) for victim in cache)

    return best(0, frozenset())


def total_misses(trace: tuple[str, ...], capacity: int, policy: EvictionPolicy) -> int:
    return sum(replay_cache(trace, capacity=capacity, policy=policy).values())


TRACES = st.lists(st.sampled_from("abcde"), min_size=1, max_size=14).map(tuple)


@settings(max_examples=150, deadline=None)
@given(TRACES, st.integers(min_value=1, max_value=3))
def test_belady_is_optimal_and_beats_lru(trace: tuple[str, ...], capacity: int) -> None:
    belady = total_misses(trace, capacity, EvictionPolicy.BELADY)
    assert belady == optimal_misses(trace, capacity)
    for policy in (EvictionPolicy.LRU, EvictionPolicy.LFU, EvictionPolicy.CHAMELEON):
        assert belady <= total_misses(trace, capacity, policy)


def test_belady_strictly_beats_lru_on_a_cyclic_trace() -> None:
    trace = tuple("abcabcabcabc")
    assert total_misses(trace, 2, EvictionPolicy.LRU) == 12
    assert total_misses(trace, 2, EvictionPolicy.BELADY) < 12


@settings(max_examples=100, deadline=None)
@given(TRACES, st.integers(min_value=1, max_value=3), st.sampled_from(list(EvictionPolicy)))
def test_pinned_adapters_never_miss_after_first_load(
    trace: tuple[str, ...], capacity: int, policy: EvictionPolicy
) -> None:
    # "a" pinned: once cached it stays, so it misses exactly once.
    with_a = ("a", *trace, "a")
    misses = replay_cache(with_a, capacity=capacity, policy=policy, pinned=frozenset({"a"}))
    assert misses["a"] == 1


def test_forecast_eviction_keeps_the_popular_over_a_finished_session() -> None:
    popular = CacheEntry(adapter="popular", last_used_s=NOW - 90, forecast_rps=0.5)
    finished = CacheEntry(adapter="tail", last_used_s=NOW - 60, forecast_rps=0.001)
    ongoing = CacheEntry(adapter="session", last_used_s=NOW - 2, forecast_rps=0.001)
    entries = [popular, finished, ongoing]
    assert choose_victim(EvictionContext(entries=entries, now_s=NOW)) == "popular"  # LRU
    forecast = EvictionContext(entries=entries, now_s=NOW, policy=EvictionPolicy.FORECAST)
    assert choose_victim(forecast) == "tail"
