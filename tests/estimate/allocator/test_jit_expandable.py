"""The compiled expandable-segments replay (``kernel_expandable.py``) gives
``CachingAllocatorSim(expandable_segments=True, capacity_bytes=...)``'s result field for field
(peak allocated / reserved, final reserved, pools holding pages, OOMs, the events of the
reserved peak and of the first OOM): on random event lists with capacities from none to none at
all (OOMs, pages given back, holes mapped again), on lists it must hand back to the Python
replay, and on the run of a traced model (``slow``)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from tests.estimate.allocator.random_events import Arrays, sim_replay
from tests.estimate.allocator.random_events import random_arrays as _arrays

from memfit.estimate.allocator import fast as allocator_fast
from memfit.estimate.allocator import jit as allocator_jit
from memfit.estimate.allocator.caching import AllocatorResult, CachingAllocatorSim
from memfit.units import MiB

numba = pytest.importorskip("numba")


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    allocator_jit.load_kernel(wait=True)


def _sim(arrays: Arrays, capacity_bytes: int | None) -> AllocatorResult:
    return sim_replay(arrays, capacity_bytes, expandable_segments=True)


def _kernel(arrays: Arrays, capacity_bytes: int | None) -> AllocatorResult:
    got = allocator_jit.replay_arrays(
        *arrays, capacity_bytes=capacity_bytes, expandable_segments=True
    )
    assert got is not None, "the kernel handed the list back"
    return got


SHAPES = {  # name: (n events, log2 size range, free probability, keys)
    "mixed": (6000, (4.0, 26.0), 0.45, 400),  # both pools
    "small": (6000, (4.0, 20.0), 0.45, 300),  # the small pool only (2 MiB pages)
    "large": (4000, (20.0, 28.0), 0.45, 200),  # the large pool only (20 MiB pages)
    "churn": (8000, (8.0, 27.0), 0.55, 60),  # few live blocks, much freeing
    "growing": (5000, (9.0, 25.0), 0.3, 2000),  # a live set that keeps growing
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_compiled_expandable_replay_matches_the_sim(shape: str, seed: int) -> None:
    n, (lo, hi), p_free, n_keys = SHAPES[shape]
    arrays = _arrays(seed, n, lo=lo, hi=hi, p_free=p_free, n_keys=n_keys)
    free = _sim(arrays, None)
    assert dataclasses.asdict(_kernel(arrays, None)) == dataclasses.asdict(free)
    peak, allocated = free.peak_reserved_bytes, free.peak_allocated_bytes
    capacities = {
        "above": peak + 64 * MiB,
        "at": peak,
        "between": (peak + allocated) // 2,
        "below_allocated": allocated * 3 // 4,
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
    assert n_ooms["above"] == n_ooms["at"] == 0
    assert n_ooms["far_below"] > 0 and n_ooms["zero"] > 0


def test_pages_given_back_and_mapped_again_match() -> None:
    """Capacities between the allocated and the reserved peak: the allocator unmaps free pages
    (final reserved below the peak) and later maps holes again; OOMs and no OOMs both occur."""
    arrays = _arrays(11, 8000, lo=8.0, hi=27.0, p_free=0.55, n_keys=60)
    free = _sim(arrays, None)
    released = failed = clean = 0
    for frac in np.linspace(0.3, 1.0, 15):
        capacity = int(free.peak_reserved_bytes * frac)
        want = _sim(arrays, capacity)
        assert _kernel(arrays, capacity) == want, capacity
        released += want.final_reserved_bytes < want.peak_reserved_bytes
        failed += want.n_ooms > 0
        clean += want.n_ooms == 0
    assert released > 0 and failed > 0 and clean > 0


def test_the_lowest_hole_that_holds_a_request_is_mapped_first() -> None:
    """Two 20 MiB pages given back leave holes in the large pool's segment; the next request
    maps the lowest hole that holds it, as the sim: the same reserved bytes at every step."""
    big = 20 * MiB
    pattern = [(1, 0, big), (1, 1, big), (1, 2, big), (1, 3, big), (0, 0, 0), (0, 2, 0),
               (1, 4, 30 * MiB), (1, 5, 5 * MiB), (1, 6, big), (0, 4, 0),
               (1, 7, 2 * big)]  # fmt: skip
    is_alloc, keys, n_bytes = (np.asarray(c, dtype=np.int64) for c in zip(*pattern))
    arrays = (is_alloc.astype(np.uint8), keys, n_bytes, 8)
    most_holes = 0
    for capacity in (None, 4 * big, 5 * big, 3 * big + big // 2):
        assert _kernel(arrays, capacity) == _sim(arrays, capacity), capacity
        sim = CachingAllocatorSim(capacity_bytes=capacity, expandable_segments=True)
        for born, key, size in pattern:
            sim.malloc(key, size) if born else sim.free(key)
            most_holes = max(most_holes, len(sim._large.unmapped))  # the tail and the holes
    assert most_holes >= 3  # more than one hole at once: the lowest-first rule was exercised


def test_malformed_lists_are_handed_back_to_the_python_replay() -> None:
    big = 30 * MiB
    twice = (np.asarray([1, 1], dtype=np.uint8), np.asarray([0, 0], dtype=np.int64),
             np.asarray([big, big], dtype=np.int64), 1)  # fmt: skip
    not_live = (np.asarray([0], dtype=np.uint8), np.asarray([0], dtype=np.int64),
                np.asarray([0], dtype=np.int64), 1)  # fmt: skip
    negative = (np.asarray([1], dtype=np.uint8), np.asarray([0], dtype=np.int64),
                np.asarray([-5], dtype=np.int64), 1)  # fmt: skip
    huge = (np.asarray([1], dtype=np.uint8), np.asarray([0], dtype=np.int64),
            np.asarray([1 << 41], dtype=np.int64), 1)  # fmt: skip
    for arrays in (twice, not_live, negative, huge):
        assert allocator_jit.replay_arrays(*arrays, expandable_segments=True) is None


def test_a_failed_request_is_not_allocated_and_its_key_may_be_born_again() -> None:
    big = 30 * MiB
    is_alloc = np.asarray([1, 1, 0, 1, 0, 0], dtype=np.uint8)
    keys = np.asarray([0, 1, 1, 1, 1, 0], dtype=np.int64)
    n_bytes = np.asarray([big, big, 0, 1000, 0, 0], dtype=np.int64)
    arrays = (is_alloc, keys, n_bytes, 2)
    want = _sim(arrays, 45 * MiB)
    assert _kernel(arrays, 45 * MiB) == want
    assert want.n_ooms == 1 and want.first_oom_at_event == 1


@pytest.mark.slow
def test_the_compiled_expandable_replay_matches_the_sim_on_a_traced_run() -> None:
    """A real event stream: the run of ``tests/estimate/seqrun/test_run.py``'s small Llama
    (traced at three lengths, 300 steps laid out by ``run_events``), replayed by the kernel and
    by the sim, without a capacity and at capacities that give pages back and fail requests."""
    from tests.estimate.seqrun.test_run import CONFIG, WORKLOAD

    from memfit.estimate.device import allocator_workspaces
    from memfit.estimate.seqrun.replay import run_events, templates_from_traces
    from memfit.estimate.trace.engine import trace_step_events

    traces = {
        n: trace_step_events(dict(CONFIG), dataclasses.replace(WORKLOAD, seq_len=n))
        for n in (64, 256, 512)
    }
    templates = templates_from_traces(traces, allocator_workspaces(None, training=True))
    rng = random.Random(5)
    events = run_events(templates, [rng.randint(64, 512) for _ in range(300)])
    arrays = (events.is_alloc, events.keys, events.n_bytes, events.n_keys)
    free = _sim(arrays, None)
    assert _kernel(arrays, None) == free
    allocated = free.peak_allocated_bytes
    results = []
    for capacity in (free.peak_reserved_bytes - 1, (free.peak_reserved_bytes + allocated) // 2,
                     allocated, allocated * 2 // 3):  # fmt: skip
        want = _sim(arrays, capacity)
        assert _kernel(arrays, capacity) == want, capacity
        results.append(want)
    assert results[-1].n_ooms > 0  # the OOM path ran on the real stream


def test_no_capacity_means_no_release_and_the_python_replay_is_used_without_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    arrays = _arrays(2, 3000, lo=4.0, hi=26.0, p_free=0.45, n_keys=200)
    got = _kernel(arrays, None)
    assert got.final_reserved_bytes == got.peak_reserved_bytes and got.n_ooms == 0
    assert allocator_jit.replay_arrays(*arrays, capacity_bytes=1 << 50,
                                       expandable_segments=True) == got  # fmt: skip
    monkeypatch.setenv("MEMFIT_NO_JIT", "1")
    assert allocator_fast.compiled_replay(*arrays, expandable_segments=True) is None
