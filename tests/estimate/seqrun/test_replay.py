"""The run replay over interpolated step events, on synthetic traces (torch-free)."""

from __future__ import annotations

import itertools
import random

import pytest

from memfit.errors import NotModelledError
from memfit.estimate.allocator.caching import simulate
from memfit.estimate.seqrun.replay import replay_run, templates_from_traces
from memfit.units import KiB, MiB


def fake_trace(
    length: int, *, n_steps: int = 3, extra: bool = False, fifo: bool = False, leak: bool = False
):
    """A training-like event list: weights, then steps of length-sized activations freed in
    reverse, optimizer states born in the first step, a loss kept until the next step."""
    keys = itertools.count()
    events: list[tuple[str, int, int]] = []
    marks: list[tuple[str, int]] = []

    def alloc(n_bytes: int) -> int:
        k = next(keys)
        events.append(("a", k, n_bytes))
        return k

    for _ in range(3):
        alloc(30 * MiB)
    carry = None
    for step in range(n_steps):
        marks.append(("forward", len(events)))
        acts = [alloc(length * 16 * KiB * (i + 1)) for i in range(5)]
        if extra:
            acts.append(alloc(4 * KiB))
        marks.append(("backward", len(events)))
        grads = [alloc(8 * MiB) for _ in range(3)]
        if leak:  # a block no later step frees
            alloc(64 * KiB)
        for k in acts if fifo else reversed(acts):
            events.append(("f", k, 0))
        marks.append(("optimizer", len(events)))
        if step == 0:
            for _ in range(6):
                alloc(16 * MiB)
        for k in grads:
            events.append(("f", k, 0))
        if carry is not None:
            events.append(("f", carry, 0))
        carry = alloc(512)
    marks.append(("end", len(events)))
    return events, marks


def test_a_run_of_one_shape_replays_exactly_the_traced_steps() -> None:
    events, marks = fake_trace(700)
    templates = templates_from_traces({700: (events, marks)})
    end = marks[-1][1]
    for expandable in (False, True):
        run = replay_run(templates, [700] * 3, expandable_segments=expandable)
        direct = simulate(events[:end], expandable_segments=expandable)
        assert run.peak_reserved_bytes == direct.peak_reserved_bytes
        assert run.peak_allocated_bytes == direct.peak_allocated_bytes
        assert run.unmatched_frees == 0


def test_repeating_the_steady_step_does_not_grow_reserved() -> None:
    templates = templates_from_traces({700: fake_trace(700)})
    assert (
        replay_run(templates, [700] * 3).peak_reserved_bytes
        == replay_run(templates, [700] * 200).peak_reserved_bytes
    )


def test_sizes_between_anchors_are_interpolated_exactly_when_linear() -> None:
    templates = templates_from_traces({256: fake_trace(256), 1024: fake_trace(1024)})
    middle = templates_from_traces({640: fake_trace(640)})
    for seg in range(4):
        assert templates.sizes_at(seg, 640) == middle.sizes_at(seg, 640)
    assert replay_run(templates, [640] * 3) == replay_run(middle, [640] * 3)


def test_sizes_between_anchors_are_never_below_a_convex_size() -> None:
    def convex(length: int):
        events, marks = fake_trace(length)
        return [(k, key, n * length // 256 if n > 30 * MiB else n) for k, key, n in events], marks

    templates = templates_from_traces({256: convex(256), 1024: convex(1024)})
    exact = templates_from_traces({512: convex(512)})
    for seg in range(4):
        assert all(a >= b for a, b in zip(templates.sizes_at(seg, 512), exact.sizes_at(seg, 512)))


def test_growing_lengths_reserve_at_least_the_longest_shape_alone() -> None:
    templates = templates_from_traces({n: fake_trace(n) for n in (128, 512, 2048)})
    growing = list(range(128, 2049, 64))
    fixed = replay_run(templates, [2048] * 3).peak_reserved_bytes
    assert replay_run(templates, growing).peak_reserved_bytes > fixed


@pytest.mark.parametrize("seed", range(5))
def test_expandable_segments_reserve_no_more_than_the_default(seed: int) -> None:
    templates = templates_from_traces({n: fake_trace(n) for n in (128, 1024, 2048)})
    rng = random.Random(seed)
    lengths = [rng.randint(128, 2048) for _ in range(60)]
    default = replay_run(templates, lengths).peak_reserved_bytes
    expandable = replay_run(templates, lengths, expandable_segments=True).peak_reserved_bytes
    assert expandable <= default


def test_steps_that_allocate_differently_at_another_length_are_refused() -> None:
    with pytest.raises(NotModelledError, match="at 512 tokens runs different allocations"):
        templates_from_traces({256: fake_trace(256), 512: fake_trace(512, extra=True)})


def test_frees_in_another_order_between_allocations_replay_as_traced() -> None:
    # autocast frees its weight-cast cache in hash-map order, which changes with the length
    templates = templates_from_traces({256: fake_trace(256), 1024: fake_trace(1024, fifo=True)})
    events, marks = fake_trace(1024, fifo=True)
    for expandable in (False, True):
        direct = simulate(events[: marks[-1][1]], expandable_segments=expandable)
        run = replay_run(templates, [1024] * 3, expandable_segments=expandable)
        assert run.peak_reserved_bytes == direct.peak_reserved_bytes
        assert run.unmatched_frees == 0


def test_a_trace_without_three_steps_is_refused() -> None:
    with pytest.raises(NotModelledError, match="needs 3 traced training steps, the trace has 2"):
        templates_from_traces({256: fake_trace(256, n_steps=2)})


def test_a_capacity_caps_the_growth_without_an_oom_while_the_steps_fit() -> None:
    templates = templates_from_traces({n: fake_trace(n) for n in (128, 512, 2048)})
    growing = list(range(128, 2049, 64))
    unlimited = replay_run(templates, growing)
    fixed = replay_run(templates, [2048] * 3)
    capacity = (fixed.peak_reserved_bytes + unlimited.peak_reserved_bytes) // 2
    capped = replay_run(templates, growing, capacity_bytes=capacity)
    assert capped.n_ooms == 0 and capped.peak_reserved_bytes <= capacity
    too_small = replay_run(templates, growing, capacity_bytes=fixed.peak_allocated_bytes // 2)
    assert too_small.n_ooms > 0


def test_a_capped_replay_keeps_what_the_run_reserves_without_a_cap() -> None:
    """The run's need where the capped replay runs out of memory: the unbounded replay's peak
    (above the capacity: the replay is capped only then); uncapped, it is the peak itself."""
    templates = templates_from_traces({n: fake_trace(n) for n in (128, 512, 2048)})
    growing = list(range(128, 2049, 64))
    unlimited = replay_run(templates, growing)
    assert unlimited.unbounded_peak_reserved_bytes == unlimited.peak_reserved_bytes
    fixed = replay_run(templates, [2048] * 3)
    too_small = replay_run(templates, growing, capacity_bytes=fixed.peak_allocated_bytes // 2)
    assert too_small.n_ooms > 0
    assert too_small.peak_reserved_bytes <= fixed.peak_allocated_bytes // 2
    assert too_small.unbounded_peak_reserved_bytes == unlimited.peak_reserved_bytes
    expandable = replay_run(
        templates, growing, expandable_segments=True, capacity_bytes=fixed.peak_allocated_bytes
    )
    assert expandable.unbounded_peak_reserved_bytes is None


def _reference_replay(templates, lengths, *, expandable_segments=False, capacity_bytes=None):
    """The replay event by event through CachingAllocatorSim, as replay_run made it before its
    events were laid out as arrays (the step keys of every step its own, frees matched against
    the live set one by one)."""
    from memfit.estimate.allocator.caching import CachingAllocatorSim
    from memfit.estimate.seqrun.replay import N_TRACED_STEPS, _replay_key

    sim = CachingAllocatorSim(
        expandable_segments=expandable_segments, capacity_bytes=capacity_bytes
    )
    for i, n_bytes in enumerate(templates.workspace_bytes):
        sim.malloc(-1 - i, n_bytes)
    live: set[int] = set()
    unmatched = 0
    steps = [(0, 0, lengths[0])] + [
        (k, min(k, N_TRACED_STEPS), n) for k, n in enumerate(lengths, start=1)
    ]
    for step, seg, length in steps:
        segment = templates.segments[0][seg]
        for kind, (ref_step, pos), n_bytes in zip(
            segment.kinds, segment.refs, templates.sizes_at(seg, length)
        ):
            if ref_step < 0:
                unmatched += kind == "f"
                continue
            key = _replay_key(step, seg, ref_step, pos)
            if kind == "a":
                sim.malloc(key, n_bytes)
                live.add(key)
            elif key in live:
                sim.free(key)
                live.discard(key)
            else:
                unmatched += 1
    res = sim.result()
    return (res.peak_reserved_bytes, res.peak_allocated_bytes, unmatched, res.n_ooms)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("expandable", [False, True])
def test_the_array_replay_equals_the_event_by_event_replay(seed: int, expandable: bool) -> None:
    """replay_run lays the run out as arrays (the steady step's pattern repeated, step keys in
    rotation) and replays the default settings with the default-configuration loop: every
    figure equals the event-by-event replay, with and without a capacity (below the run's
    growth: the capped replay; above it: the unbounded one stands)."""
    templates = templates_from_traces({n: fake_trace(n, leak=seed == 3) for n in (128, 1024, 2048)})
    rng = random.Random(seed)
    lengths = [rng.randint(128, 2048) for _ in range(40)]
    unbounded = _reference_replay(templates, lengths, expandable_segments=expandable)
    fixed = replay_run(templates, [2048] * 3, expandable_segments=expandable)
    for capacity in (None, unbounded[0], (fixed.peak_reserved_bytes + unbounded[0]) // 2,
                     fixed.peak_allocated_bytes // 2):  # fmt: skip
        got = replay_run(templates, lengths, expandable_segments=expandable,
                         capacity_bytes=capacity)  # fmt: skip
        want = _reference_replay(templates, lengths, expandable_segments=expandable,
                                 capacity_bytes=capacity)  # fmt: skip
        assert (got.peak_reserved_bytes, got.peak_allocated_bytes, got.unmatched_frees,
                got.n_ooms) == want, capacity  # fmt: skip
    for short in ([512], [512, 2048], lengths[:6], lengths[:7]):  # around the lead steps
        got = replay_run(templates, short, expandable_segments=expandable)
        assert (got.peak_reserved_bytes, got.peak_allocated_bytes, got.unmatched_frees,
                got.n_ooms) == _reference_replay(templates, short,
                                                 expandable_segments=expandable)  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_the_capped_replay_runs_compiled_and_equals_the_event_by_event_replay(seed: int) -> None:
    """With the kernel loaded, the capped default replay (a capacity below the run's unbounded
    peak) runs compiled, not through CachingAllocatorSim: the same figures as the event-by-event
    replay, OOMs included."""
    pytest.importorskip("numba")
    from memfit.estimate.allocator import fast as allocator_fast
    from memfit.estimate.allocator import jit as allocator_jit

    if allocator_jit.load_kernel(wait=True) is None:
        pytest.skip(f"no compiled replay here: {allocator_jit.describe()}")
    templates = templates_from_traces({n: fake_trace(n, leak=seed == 2) for n in (128, 1024, 2048)})
    rng = random.Random(seed)
    lengths = [rng.randint(128, 2048) for _ in range(60)]
    unbounded = _reference_replay(templates, lengths)
    fixed = replay_run(templates, [2048] * 3)
    for capacity in ((fixed.peak_reserved_bytes + unbounded[0]) // 2,
                     fixed.peak_allocated_bytes // 2, unbounded[0] - 1):  # fmt: skip
        compiled_before = allocator_fast.REPLAYS["compiled"]
        got = replay_run(templates, lengths, capacity_bytes=capacity)
        assert allocator_fast.REPLAYS["compiled"] == compiled_before + 2  # unbounded, capped
        assert (got.peak_reserved_bytes, got.peak_allocated_bytes, got.unmatched_frees,
                got.n_ooms) == _reference_replay(templates, lengths,
                                                 capacity_bytes=capacity), capacity  # fmt: skip
        assert got.unbounded_peak_reserved_bytes == unbounded[0]


def test_without_the_kernel_the_capped_replay_runs_in_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``MEMFIT_NO_JIT``: the capped default replay goes through CachingAllocatorSim (counted
    as a Python replay), with the event-by-event replay's figures."""
    from memfit.estimate.allocator import fast as allocator_fast

    monkeypatch.setenv("MEMFIT_NO_JIT", "1")
    templates = templates_from_traces({n: fake_trace(n) for n in (128, 1024, 2048)})
    lengths = list(range(128, 2049, 64))
    unbounded = _reference_replay(templates, lengths)
    fixed = replay_run(templates, [2048] * 3)
    capacity = fixed.peak_allocated_bytes // 2
    before = dict(allocator_fast.REPLAYS)
    got = replay_run(templates, lengths, capacity_bytes=capacity)
    assert allocator_fast.REPLAYS["compiled"] == before["compiled"]
    assert allocator_fast.REPLAYS["python"] == before["python"] + 2  # unbounded, capped
    assert (got.peak_reserved_bytes, got.peak_allocated_bytes, got.unmatched_frees,
            got.n_ooms) == _reference_replay(templates, lengths,
                                             capacity_bytes=capacity)  # fmt: skip
    assert got.n_ooms > 0 and got.unbounded_peak_reserved_bytes == unbounded[0]


@pytest.mark.parametrize("seed", range(3))
def test_the_expandable_replay_runs_compiled_and_equals_the_event_by_event_replay(
    seed: int,
) -> None:
    """With the kernel loaded, the expandable-segments replay runs compiled, not through
    CachingAllocatorSim: the same figures as the event-by-event replay, with no capacity, one
    that gives pages back and one that fails requests."""
    pytest.importorskip("numba")
    from memfit.estimate.allocator import fast as allocator_fast
    from memfit.estimate.allocator import jit as allocator_jit

    if allocator_jit.load_kernel(wait=True) is None:
        pytest.skip(f"no compiled replay here: {allocator_jit.describe()}")
    templates = templates_from_traces({n: fake_trace(n, leak=seed == 2) for n in (128, 1024, 2048)})
    rng = random.Random(seed)
    lengths = [rng.randint(128, 2048) for _ in range(60)]
    unbounded = _reference_replay(templates, lengths, expandable_segments=True)
    n_ooms = []
    for capacity in (None, unbounded[0] - 1, unbounded[1] // 2):
        compiled_before = allocator_fast.REPLAYS["compiled"]
        got = replay_run(templates, lengths, expandable_segments=True, capacity_bytes=capacity)
        assert allocator_fast.REPLAYS["compiled"] == compiled_before + 1
        want = _reference_replay(templates, lengths, expandable_segments=True,
                                 capacity_bytes=capacity)  # fmt: skip
        assert (got.peak_reserved_bytes, got.peak_allocated_bytes, got.unmatched_frees,
                got.n_ooms) == want, capacity  # fmt: skip
        assert got.unbounded_peak_reserved_bytes is None
        n_ooms.append(got.n_ooms)
    assert n_ooms[0] == 0 and n_ooms[-1] > 0


def test_the_numpy_sizes_are_the_python_interpolations_integers() -> None:
    """``sizes_array`` (what run_events lays out) equals ``sizes_at`` (the Python chord, rounded
    up to 512 B) at every length between, below and above the anchors, for affine, convex and
    unrounded sizes."""
    import numpy as np

    def odd_trace(length: int):
        events, marks = fake_trace(length)
        # convex (S x S) and unrounded sizes in place of some allocations
        odd = [(kind, key, length * length * 3 + 7 if kind == "a" and i % 3 == 0 else n)
               for i, (kind, key, n) in enumerate(events)]  # fmt: skip
        return odd, marks

    for make in (fake_trace, odd_trace):
        templates = templates_from_traces({n: make(n) for n in (128, 1000, 1024, 2048)})
        for seg in range(4):
            for length in (*range(1, 2100, 37), 127, 128, 129, 1000, 1023, 1024, 2047, 2048):
                want = templates.sizes_at(seg, length)
                got = templates.sizes_array(seg, length)
                assert got.dtype == np.int64 and got.tolist() == want, (seg, length)
