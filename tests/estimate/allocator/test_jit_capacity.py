"""The compiled default replay with a capacity gives ``CachingAllocatorSim(capacity_bytes=...)``'s
result field for field (peak allocated / reserved, final reserved, segments, OOMs, the events of
the reserved peak and of the first OOM): on random event lists with capacities from none to far
below the peak (many OOMs, released segments, frees of keys whose request failed, keys born again
after a failed request), and through ``replay_run``'s capped replay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.estimate.allocator.random_events import Arrays, sim_replay
from tests.estimate.allocator.random_events import random_arrays as _arrays

from memfit.estimate.allocator import fast as allocator_fast
from memfit.estimate.allocator import jit as allocator_jit
from memfit.estimate.allocator.caching import AllocatorResult
from memfit.units import MiB

numba = pytest.importorskip("numba")


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    allocator_jit.load_kernel(wait=True)


def _sim(arrays: Arrays, capacity_bytes: int | None) -> AllocatorResult:
    return sim_replay(arrays, capacity_bytes)


def _kernel(arrays: Arrays, capacity_bytes: int | None) -> AllocatorResult:
    got = allocator_jit.replay_arrays(*arrays, capacity_bytes=capacity_bytes)
    assert got is not None, "the kernel handed the list back"
    return got


SHAPES = {  # name: (n events, log2 size range, free probability, keys)
    "mixed": (6000, (4.0, 26.0), 0.45, 400),
    "small": (6000, (4.0, 20.0), 0.45, 300),
    "large": (4000, (20.0, 28.0), 0.45, 200),
    "churn": (8000, (8.0, 27.0), 0.55, 60),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_capped_kernel_matches_the_sim(shape: str, seed: int) -> None:
    n, (lo, hi), p_free, n_keys = SHAPES[shape]
    arrays = _arrays(seed, n, lo=lo, hi=hi, p_free=p_free, n_keys=n_keys)
    free = _sim(arrays, None)
    assert _kernel(arrays, None) == free
    peak = free.peak_reserved_bytes
    capacities = {
        "above": peak + 64 * MiB,
        "at": peak,
        "between": (peak + free.peak_allocated_bytes) // 2,
        "below_allocated": free.peak_allocated_bytes * 3 // 4,
        "far_below": peak // 8,
        "odd": peak // 3 + 12345,
        "zero": 0,
    }
    n_ooms = {}
    for name, capacity in capacities.items():
        want = _sim(arrays, capacity)
        got = _kernel(arrays, capacity)
        assert dataclasses.asdict(got) == dataclasses.asdict(want), (name, capacity)
        n_ooms[name] = want.n_ooms
    # the levels do what they are named for: none below the peak fails nothing, far below fails
    assert n_ooms["above"] == n_ooms["at"] == 0
    assert n_ooms["far_below"] > 0 and n_ooms["zero"] > 0


def test_releases_happen_and_match() -> None:
    """A capacity between the allocated and the reserved peak makes the allocator give whole
    segments back (final reserved below the peak, fewer segments): the kernel's release path
    runs, not only its OOM path."""
    arrays = _arrays(11, 8000, lo=8.0, hi=27.0, p_free=0.55, n_keys=60)
    free = _sim(arrays, None)
    hits = 0
    for frac in np.linspace(0.3, 1.0, 15):
        capacity = int(free.peak_reserved_bytes * frac)
        want = _sim(arrays, capacity)
        assert _kernel(arrays, capacity) == want, capacity
        hits += want.final_reserved_bytes < want.peak_reserved_bytes
    assert hits > 0


def test_failed_key_freed_then_born_again() -> None:
    """A request that fails is not allocated: its free does nothing, the key may be born again;
    a second free of it is an error the kernel hands back to the Python replay."""
    big = 30 * MiB
    is_alloc = np.asarray([1, 1, 0, 1, 0, 0], dtype=np.uint8)
    keys = np.asarray([0, 1, 1, 1, 1, 0], dtype=np.int64)
    n_bytes = np.asarray([big, big, 0, 1000, 0, 0], dtype=np.int64)
    arrays = (is_alloc, keys, n_bytes, 2)
    want = _sim(arrays, 32 * MiB)
    got = _kernel(arrays, 32 * MiB)
    assert got == want
    assert got.n_ooms == 1 and got.first_oom_at_event == 1
    twice = (
        np.asarray([1, 1, 0, 0], dtype=np.uint8),
        np.asarray([0, 1, 1, 1], dtype=np.int64),
        np.asarray([big, big, 0, 0], dtype=np.int64),
        2,
    )
    assert allocator_jit.replay_arrays(*twice, capacity_bytes=32 * MiB) is None


def test_no_capacity_and_huge_capacity_are_the_unbounded_replay() -> None:
    arrays = _arrays(3, 5000, lo=4.0, hi=26.0, p_free=0.45, n_keys=300)
    free = allocator_jit.replay_arrays(*arrays)
    assert free == allocator_fast.simulate_default_arrays(*arrays, compiled=False)
    assert allocator_jit.replay_arrays(*arrays, capacity_bytes=1 << 50) == free
    assert allocator_jit.replay_arrays(*arrays, capacity_bytes=-1) is None


def test_the_jit_modules_copies_of_the_kernels_constants_match() -> None:
    """jit.py writes out kernel.N_OUT and kernel.LIMIT_BYTES (importing kernel.py loads numba):
    the copies must not drift from the kernel they describe."""
    from memfit.estimate.allocator import kernel

    assert allocator_jit._N_OUT == kernel.N_OUT
    assert allocator_jit._LIMIT_BYTES == kernel.LIMIT_BYTES
