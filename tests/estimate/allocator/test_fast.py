"""The default-configuration replay gives the general simulator's result, field for field."""

from __future__ import annotations

import random

import pytest

from memfit.errors import SpecError
from memfit.estimate.allocator.caching import CachingAllocatorSim
from memfit.estimate.allocator.fast import simulate_default
from memfit.units import MiB


def _events(seed: int, n: int = 4000) -> list[tuple[str, int, int]]:
    """Random births and frees, 0 B to 64 MiB (both pools, own segments, 20 MiB segments,
    zero-byte requests), frees of random live keys."""
    rng = random.Random(seed)
    live: list[int] = []
    events: list[tuple[str, int, int]] = []
    for key in range(n):
        if live and rng.random() < 0.45:
            events.append(("f", live.pop(rng.randrange(len(live))), 0))
        else:
            size = 0 if rng.random() < 0.02 else int(2 ** rng.uniform(4, 26))
            events.append(("a", key, size))
            live.append(key)
    return events


def _general(events: list[tuple[str, int, int]]) -> object:
    sim = CachingAllocatorSim()
    for kind, key, n in events:
        if kind == "a":
            sim.malloc(key, n)
        else:
            sim.free(key)
    return sim.result()


@pytest.mark.parametrize("seed", range(8))
def test_the_fast_replay_matches_the_general_simulator_on_random_events(seed: int) -> None:
    events = _events(seed)
    assert simulate_default(events) == _general(events)


def test_reusing_a_block_of_the_same_size_reserves_nothing_new() -> None:
    events = [("a", 1, 30 * MiB), ("f", 1, 0), ("a", 2, 30 * MiB)]
    result = simulate_default(events)
    assert (result.peak_reserved_bytes, result.n_segments) == (30 * MiB, 1)


def test_the_fast_replay_rejects_what_the_simulator_rejects() -> None:
    with pytest.raises(SpecError, match=r"malloc of key 1 at event 1: the key is still allocated"):
        simulate_default([("a", 1, 10), ("a", 1, 10)])
    with pytest.raises(SpecError, match=r"free of key 3 at event 0: the key is not allocated"):
        simulate_default([("f", 3, 0)])
    with pytest.raises(SpecError, match=r"event 0 has kind 'x': use 'a' \(allocate\) or 'f'"):
        simulate_default([("x", 1, 10)])
    with pytest.raises(SpecError, match=r"allocation size \(-1\) must be >= 0 bytes"):
        simulate_default([("a", 1, -1)])
