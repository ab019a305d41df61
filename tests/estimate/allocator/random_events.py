"""Random allocator event lists and their replay by the Python allocator, shared by the tests
of the compiled replays (test_jit_capacity.py: the default allocator; test_jit_expandable.py:
expandable segments)."""

from __future__ import annotations

import random

import numpy as np

from memfit.estimate.allocator.caching import AllocatorResult, CachingAllocatorSim

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, int]


def random_arrays(seed: int, n: int, *, lo: float, hi: float, p_free: float, n_keys: int) -> Arrays:
    """Random births (sizes 2**uniform(lo, hi) bytes, a few 0 B) and frees over a small key
    range, so keys are born again after a free; a key is freed only when it was born (the sim
    ignores the free of a key whose request failed, as the kernel must)."""
    rng = random.Random(seed)
    live: list[int] = []
    idle = list(range(n_keys))
    is_alloc, keys, n_bytes = [], [], []
    for _ in range(n):
        if live and (not idle or rng.random() < p_free):
            key = live.pop(rng.randrange(len(live)))
            idle.append(key)
            is_alloc.append(0), keys.append(key), n_bytes.append(0)
            continue
        key = idle.pop(rng.randrange(len(idle)))
        live.append(key)
        size = 0 if rng.random() < 0.02 else int(2 ** rng.uniform(lo, hi))
        is_alloc.append(1), keys.append(key), n_bytes.append(size)
    return (
        np.asarray(is_alloc, dtype=np.uint8),
        np.asarray(keys, dtype=np.int64),
        np.asarray(n_bytes, dtype=np.int64),
        n_keys,
    )


def sim_replay(
    arrays: Arrays, capacity_bytes: int | None, *, expandable_segments: bool = False
) -> AllocatorResult:
    """``arrays`` replayed event by event by :class:`CachingAllocatorSim` (the oracle)."""
    sim = CachingAllocatorSim(
        capacity_bytes=capacity_bytes, expandable_segments=expandable_segments
    )
    is_alloc, keys, n_bytes, _ = arrays
    for born, key, size in zip(is_alloc.tolist(), keys.tolist(), n_bytes.tolist(), strict=True):
        if born:
            sim.malloc(key, size)
        else:
            sim.free(key)
    return sim.result()
