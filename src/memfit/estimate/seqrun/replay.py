"""Reserved memory after a run of many step shapes: the caching allocator replayed over a run.

A fixed-shape estimate replays two steps of one shape. On real data each step has its own padded
length; every new length asks the allocator for blocks of new sizes, which it may not find among
the cached ones, so it takes new segments and ``max_memory_reserved`` grows over the run.

Method. The trace engine runs three training steps at a few *anchor* lengths (chosen among the
lengths the run will use, longest and shortest included) and keeps their allocation events. The
events of a step are the same list at every length (same ops, same order; checked), only the
sizes change, so a step at any length in between takes each event's size piecewise-linearly
between the anchors and rounds it up to 512 B. Sizes are affine in the length (activations) or
convex (eager attention's S x S scores), and the tracker already rounded them up, so the chord is
never below the true size. The run is then replayed through
:class:`memfit.estimate.allocator.caching.CachingAllocatorSim`: the first traced step, the second,
then the third (the steady step: checked to repeat the second) once per remaining step, each at
its sampled length, with frees that reach back a step resolved to the previous step's blocks.
The same replay with every step at the longest length is the fixed-shape figure it is compared
with, and both run with ``expandable_segments`` off (torch's default) and on.

Not modelled: a new batch's input tensors (the trace reuses one batch; a few KiB per step), the
DataLoader's pinned host memory, and ``empty_cache`` calls a training loop may make.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from memfit.errors import NotModelledError
from memfit.estimate.allocator.caching import MIN_BLOCK_BYTES, CachingAllocatorSim
from memfit.estimate.allocator.fast import (
    compiled_replay,
    count_python_replay,
    simulate_default_arrays,
)

Event = tuple[str, int, int]
#: Traced steps per anchor: the first (optimizer states created), the second, the steady third.
N_TRACED_STEPS = 3
#: Anchor lengths traced at most (each is one trace of N_TRACED_STEPS steps).
MAX_ANCHORS = 4
_STEP_KEY = 1 << 32  # replay key = step * _STEP_KEY + position of the allocation in its step


@dataclass(frozen=True, kw_only=True)
class _Segment:
    """One traced step (or the events before the first): per event, kind, reference, size."""

    kinds: tuple[str, ...]
    refs: tuple[tuple[int, int], ...]  # (traced step, position) of the block an event touches
    sizes: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class StepTemplates:
    """The traced steps of a job at its anchor lengths, ready to be replayed at any length."""

    anchors: tuple[int, ...]
    segments: tuple[tuple[_Segment, ...], ...]  # [anchor][0: init, 1..3: traced steps]
    workspace_bytes: tuple[int, ...] = ()
    _cache: dict[tuple[int, int], list[int]] = field(default_factory=dict, compare=False)
    _arrays: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, compare=False)

    def sizes_at(self, seg: int, length: int) -> list[int]:
        """Event sizes of segment ``seg`` at ``length`` tokens (interpolated, rounded up)."""
        key = (seg, length)
        if key in self._cache:
            return self._cache[key]
        a = self.anchors
        if length <= a[0] or len(a) == 1:
            out = list(self.segments[0][seg].sizes)
        elif length >= a[-1]:
            out = list(self.segments[-1][seg].sizes)
        else:
            i = max(j for j in range(len(a)) if a[j] <= length)
            lo, hi = self.segments[i][seg].sizes, self.segments[i + 1][seg].sizes
            w = (length - a[i]) / (a[i + 1] - a[i])
            r = MIN_BLOCK_BYTES
            out = [x if x == y else -(-math.ceil(x + (y - x) * w) // r) * r for x, y in zip(lo, hi)]
        self._cache[key] = out
        return out

    def sizes_array(self, seg: int, length: int) -> np.ndarray:
        """:meth:`sizes_at` as an int64 array, computed with numpy in the same IEEE-754 steps
        (the same integers: ``tests/estimate/seqrun/test_replay.py`` compares them): what
        :func:`run_events` lays out, without a Python loop over the events."""
        key = (seg, length)
        got = self._arrays.get(key)
        if got is not None:
            return got
        a = self.anchors
        if length <= a[0] or len(a) == 1:
            out = self._anchor_sizes(0, seg)
        elif length >= a[-1]:
            out = self._anchor_sizes(len(a) - 1, seg)
        else:
            i = max(j for j in range(len(a)) if a[j] <= length)
            lo, hi = self._anchor_sizes(i, seg), self._anchor_sizes(i + 1, seg)
            w = (length - a[i]) / (a[i + 1] - a[i])
            r = MIN_BLOCK_BYTES
            # int - int, then as float (exact below 2**53) times w, plus x: math.ceil's input
            up = np.ceil(lo + (hi - lo).astype(np.float64) * w).astype(np.int64)
            out = np.where(lo == hi, lo, -(-up // r) * r)
        self._arrays[key] = out
        return out

    def _anchor_sizes(self, anchor: int, seg: int) -> np.ndarray:
        key = (-1 - anchor, seg)  # anchors' own sizes, beside the lengths' (seg >= 0 keys)
        got = self._arrays.get(key)
        if got is None:
            got = np.asarray(self.segments[anchor][seg].sizes, dtype=np.int64)
            self._arrays[key] = got
        return got


def templates_from_traces(
    traces: dict[int, tuple[list[Event], list[tuple[str, int]]]],
    workspace_bytes: Sequence[int] = (),
) -> StepTemplates:
    """Anchor length -> (events, phase marks) of :func:`trace_step_events` as templates."""
    anchors = tuple(sorted(traces))
    per_anchor = tuple(_segments(*traces[n]) for n in anchors)
    first = per_anchor[0]
    for n, segs in zip(anchors, per_anchor):
        if any(s.kinds != f.kinds or s.refs != f.refs for s, f in zip(segs, first)):
            raise NotModelledError(
                f"the traced step at {n} tokens runs different allocations than at {anchors[0]} "
                "(the model changes kernels with the length); --seq-dist cannot interpolate it, "
                "use --pad-to-multiple-of to trace fewer lengths or --packing",
                engine="trace",
            )
    for n, segs in zip(anchors, per_anchor):
        if segs[2].kinds != segs[3].kinds or segs[2].sizes != segs[3].sizes:
            raise NotModelledError(
                f"at {n} tokens the third traced step does not repeat the second; "
                "the run cannot be replayed from a steady step",
                engine="trace",
            )
    return StepTemplates(
        anchors=anchors, segments=per_anchor, workspace_bytes=tuple(workspace_bytes)
    )


def same_steps(
    a: tuple[list[Event], list[tuple[str, int]]], b: tuple[list[Event], list[tuple[str, int]]]
) -> bool:
    """Whether two traces (events, marks) run the same allocations, sizes aside."""
    sa, sb = _segments(*a), _segments(*b)
    return all(x.kinds == y.kinds and x.refs == y.refs for x, y in zip(sa, sb))


def _segments(events: list[Event], marks: list[tuple[str, int]]) -> tuple[_Segment, ...]:
    starts = [i for phase, i in marks if phase == "forward"]
    ends = [i for phase, i in marks if phase == "end"]
    if len(starts) != N_TRACED_STEPS or not ends:
        raise NotModelledError(
            f"--seq-dist needs {N_TRACED_STEPS} traced training steps, the trace has {len(starts)}",
            engine="trace",
        )
    bounds = [0, *starts, ends[-1]]
    site: dict[int, tuple[int, int]] = {}
    segs = []
    for step in range(len(bounds) - 1):
        kinds, refs, sizes = [], [], []
        for pos, (kind, key, n_bytes) in enumerate(events[bounds[step] : bounds[step + 1]]):
            if kind == "a":
                site[key] = (step, pos)
            kinds.append(kind)
            refs.append(site.get(key, (-1, -1)))
            sizes.append(n_bytes)
        _sort_free_runs(kinds, refs)
        segs.append(_Segment(kinds=tuple(kinds), refs=tuple(refs), sizes=tuple(sizes)))
    return tuple(segs)


def _sort_free_runs(kinds: list[str], refs: list[tuple[int, int]]) -> None:
    """Put each run of consecutive frees in one order (by allocation site), in place.

    The order of frees with no allocation between them is arbitrary in torch itself: autocast's
    weight-cast cache (``cached_casts`` in ``aten/src/ATen/autocast_mode.cpp``, a
    ``ska::flat_hash_map`` keyed by ``TensorImpl*``) frees its entries at the exit of the
    outermost ``torch.autocast`` in the map's iteration order, i.e. by pointer hash, which
    changes from run to run and, in the trace, from one length to another. It is also
    irrelevant to the allocator: a free merges the block with its free neighbours and files it
    by (size, address), so after a run of frees the free blocks are the maximal free ranges of
    each segment whatever the order, and allocated only falls. Frees carry no size (0 in the
    events), so ``sizes`` needs no reordering."""
    i, n = 0, len(kinds)
    while i < n:
        if kinds[i] != "f":
            i += 1
            continue
        j = i
        while j < n and kinds[j] == "f":
            j += 1
        refs[i:j] = sorted(refs[i:j])
        i = j


@dataclass(frozen=True, kw_only=True)
class RunReplay:
    """Peaks of one replayed run. ``unmatched_frees``: frees of blocks the replay could not
    place (kept allocated: the safe direction)."""

    peak_reserved_bytes: int
    peak_allocated_bytes: int
    unmatched_frees: int
    n_ooms: int = 0
    #: torch's default settings: the run's reserved peak replayed without a capacity (equal to
    #: ``peak_reserved_bytes`` where the capacity was never reached); None for expandable
    #: segments, replayed capped only
    unbounded_peak_reserved_bytes: int | None = None


def replay_run(
    templates: StepTemplates,
    lengths: Sequence[int],
    *,
    expandable_segments: bool = False,
    capacity_bytes: int | None = None,
    events: RunEvents | None = None,
) -> RunReplay:
    """Replay a run whose step ``k`` is ``lengths[k]`` tokens long. ``capacity_bytes``: what the
    allocator may reserve (the GPU's memory less the CUDA context); at the limit it frees its
    cached segments and retries, as torch does, and a request that still fails is an OOM.

    The run's events are laid out once as arrays (:func:`run_events`). With torch's default
    settings they go through the default-configuration replay
    (:func:`memfit.estimate.allocator.fast.simulate_default_arrays`: the compiled kernel where it
    is loaded, else its Python loop; the same rules and integers as
    :class:`~memfit.estimate.allocator.caching.CachingAllocatorSim`); a capacity changes nothing
    where that unbounded replay never reserves more than it (every new segment was asked for
    below it), else the run is replayed again with the capacity: by the compiled kernel where it
    is loaded (the capped rules of the sim, same integers), else by
    :class:`~memfit.estimate.allocator.caching.CachingAllocatorSim`. Expandable segments replay
    through the compiled expandable-segments kernel where it is loaded
    (:mod:`memfit.estimate.allocator.kernel_expandable`: the sim's rules, same integers), else
    through :class:`~memfit.estimate.allocator.caching.CachingAllocatorSim`.

    ``events``: the run's :func:`run_events` where the caller laid them out already (one run
    replayed with both allocator settings)."""
    if events is None:
        events = run_events(templates, lengths)
    if not expandable_segments:
        free = simulate_default_arrays(events.is_alloc, events.keys, events.n_bytes, events.n_keys)
        if capacity_bytes is None or free.peak_reserved_bytes <= capacity_bytes:
            return RunReplay(
                peak_reserved_bytes=free.peak_reserved_bytes,
                peak_allocated_bytes=free.peak_allocated_bytes,
                unmatched_frees=events.unmatched_frees,
                unbounded_peak_reserved_bytes=free.peak_reserved_bytes,
            )
        capped = compiled_replay(
            events.is_alloc, events.keys, events.n_bytes, events.n_keys,
            capacity_bytes=capacity_bytes,
        )  # fmt: skip
        if capped is not None:
            return RunReplay(
                peak_reserved_bytes=capped.peak_reserved_bytes,
                peak_allocated_bytes=capped.peak_allocated_bytes,
                unmatched_frees=events.unmatched_frees,
                n_ooms=capped.n_ooms,
                unbounded_peak_reserved_bytes=free.peak_reserved_bytes,
            )
        count_python_replay(len(events.keys))
    else:
        compiled = compiled_replay(
            events.is_alloc, events.keys, events.n_bytes, events.n_keys,
            capacity_bytes=capacity_bytes, expandable_segments=True,
        )  # fmt: skip
        if compiled is not None:
            return RunReplay(
                peak_reserved_bytes=compiled.peak_reserved_bytes,
                peak_allocated_bytes=compiled.peak_allocated_bytes,
                unmatched_frees=events.unmatched_frees,
                n_ooms=compiled.n_ooms,
            )
        count_python_replay(len(events.keys))
    sim = CachingAllocatorSim(
        expandable_segments=expandable_segments, capacity_bytes=capacity_bytes
    )
    malloc, free_key = sim.malloc, sim.free
    for start in range(0, len(events.keys), _CHUNK):  # Python ints a chunk at a time
        end = start + _CHUNK
        for born, key, n_bytes in zip(
            events.is_alloc[start:end].tolist(),
            events.keys[start:end].tolist(),
            events.n_bytes[start:end].tolist(),
            strict=True,
        ):
            if born:
                malloc(key, n_bytes)
            else:
                free_key(key)
    res = sim.result()
    return RunReplay(
        peak_reserved_bytes=res.peak_reserved_bytes,
        peak_allocated_bytes=res.peak_allocated_bytes,
        unmatched_frees=events.unmatched_frees,
        n_ooms=res.n_ooms,
        unbounded_peak_reserved_bytes=None if expandable_segments else free.peak_reserved_bytes,
    )


@dataclass(frozen=True, kw_only=True)
class RunEvents:
    """A run's allocator events as arrays: event ``i`` allocates ``n_bytes[i]`` under ``keys[i]``
    where ``is_alloc[i]``, else frees ``keys[i]``; keys are dense (``0..n_keys-1``: the
    workspaces, the blocks made before the first step, then three rotating key ranges of one
    step each, as no block outlives the step after the one that made it). Frees of blocks the
    replay cannot place are left out and counted (``unmatched_frees``)."""

    is_alloc: np.ndarray
    keys: np.ndarray
    n_bytes: np.ndarray
    n_keys: int
    unmatched_frees: int


#: Events turned into Python ints at a time by the replay through CachingAllocatorSim (the whole
#: run at once would hold three lists of millions of ints: ~0.6 GiB for 1,000 steps of a 1B model).
_CHUNK = 1 << 16
#: Steps laid out one by one before the steady step's pattern is repeated (:func:`run_events`).
_LEAD_STEPS = N_TRACED_STEPS + 3
#: Key ranges the steady steps take in turn: a steady step's block lives at most into the next
#: step (:func:`_replay_key`), so a range is free again two steps later (checked).
_ROTATION = 3


def run_events(templates: StepTemplates, lengths: Sequence[int]) -> RunEvents:
    """The events of the run ``lengths`` as :func:`replay_run` replays them: the workspaces, the
    events before the first step, the first traced step, the second, then the steady third once
    per remaining step at its length; a free reaching back a step names the previous step's
    block, and a free of a block that is not live is left out (counted).

    The first :data:`_LEAD_STEPS` steps are matched event by event; every later step repeats
    the last lead step's pattern (which events are kept, the blocks they name relative to the
    step), checked to be the one before it too, with its sizes at the step's length."""
    n_steps = len(lengths)
    segs = templates.segments[0]
    width = max(len(s.kinds) for s in segs)
    n_ws = len(templates.workspace_bytes)
    base = n_ws + len(segs[0].kinds)  # the first step's keys; before: workspaces, model state
    lead = min(n_steps, _LEAD_STEPS)
    alloc_parts: list[np.ndarray] = [np.ones(n_ws, dtype=np.uint8)]
    key_parts: list[np.ndarray] = [np.arange(n_ws, dtype=np.int64)]
    byte_parts: list[np.ndarray] = [np.asarray(templates.workspace_bytes, dtype=np.int64)]
    live: dict[int, int] = {}  # replay key -> the step that made it
    unmatched = 0
    rows: list[tuple[np.ndarray, ...]] = []  # per lead step: alloc, index, back, pos
    for k in range(lead + 1):  # 0: the events before the first step
        seg = min(k, N_TRACED_STEPS)
        segment = segs[seg]
        alloc, index, back, pos_row = [], [], [], []
        for i, (kind, (ref_step, pos)) in enumerate(zip(segment.kinds, segment.refs)):
            if ref_step < 0:
                unmatched += kind == "f"
                continue
            key = _replay_key(k, seg, ref_step, pos)
            if kind == "a":
                live[key] = k
            elif key in live:
                del live[key]
            else:
                unmatched += 1
                continue
            alloc.append(kind == "a")
            index.append(i)
            back.append(-1 if key < _STEP_KEY else k - key // _STEP_KEY)
            pos_row.append(pos)
        rows.append(tuple(np.asarray(r, dtype=np.int64) for r in (alloc, index, back, pos_row)))
    # a steady step's block outliving the step after it would share a key range (a leak): keys
    # of their own per step then
    rotate = not any(N_TRACED_STEPS <= made < lead for made in live.values())
    if n_steps > lead:
        last, before = rows[-1], rows[-2]
        if not all(np.array_equal(x, y) for x, y in zip(last, before)):
            raise NotModelledError(
                "the steady step's allocations do not repeat from one step to the next; "
                "--seq-dist cannot replay the run from it",
                engine="trace",
            )
        per_step_unmatched = sum(kind == "f" for kind in segs[N_TRACED_STEPS].kinds) - int(
            np.count_nonzero(last[0] == 0)
        )
        unmatched += per_step_unmatched * (n_steps - lead)

    def keys_of(k: int, back: np.ndarray, pos: np.ndarray) -> np.ndarray:
        target = k - back
        if rotate:
            slot = np.where(target < N_TRACED_STEPS, target - 1,
                            N_TRACED_STEPS - 1 + (target - N_TRACED_STEPS) % _ROTATION)  # fmt: skip
        else:
            slot = target - 1
        return np.where(back < 0, n_ws + pos, base + slot * width + pos)

    # the steps from the last lead step on share its row: their bytes depend on the length
    # only, their keys (in rotation, no block older than the step before) on k % _ROTATION only
    steady_alloc = rows[lead][0].astype(np.uint8)
    steady_bytes: dict[int, np.ndarray] = {}
    steady_keys: dict[int, np.ndarray] = {}
    steady_back = rows[lead][2]
    keys_repeat = rotate and (
        len(steady_back) == 0 or int(steady_back.max()) <= lead - N_TRACED_STEPS
    )
    for k in range(n_steps + 1):
        row_alloc, row_index, row_back, row_pos = rows[min(k, lead)]
        length = lengths[max(k - 1, 0)]
        if k < max(lead, N_TRACED_STEPS):
            sizes = templates.sizes_array(min(k, N_TRACED_STEPS), length)
            alloc_parts.append(row_alloc.astype(np.uint8))
            key_parts.append(keys_of(k, row_back, row_pos))
            byte_parts.append(sizes[row_index] * row_alloc)
            continue
        step_bytes = steady_bytes.get(length)
        if step_bytes is None:
            sizes = templates.sizes_array(N_TRACED_STEPS, length)
            step_bytes = steady_bytes[length] = sizes[row_index] * row_alloc
        if keys_repeat:
            step_keys = steady_keys.get(k % _ROTATION)
            if step_keys is None:
                step_keys = steady_keys[k % _ROTATION] = keys_of(k, row_back, row_pos)
        else:
            step_keys = keys_of(k, row_back, row_pos)
        alloc_parts.append(steady_alloc)
        key_parts.append(step_keys)
        byte_parts.append(step_bytes)
    n_slots = N_TRACED_STEPS - 1 + _ROTATION if rotate else n_steps
    return RunEvents(
        is_alloc=np.concatenate(alloc_parts),
        keys=np.concatenate(key_parts),
        n_bytes=np.concatenate(byte_parts),
        n_keys=base + n_slots * width,
        unmatched_frees=unmatched,
    )


def _replay_key(step: int, traced: int, ref_step: int, pos: int) -> int:
    """The replay key of the block allocated at (``ref_step``, ``pos``) of the traced steps, seen
    from replay step ``step`` (which replays traced step ``traced``)."""
    if ref_step == 0:
        return pos  # before the first step: model state, once
    target = step - (traced - ref_step)
    target_traced = min(target, N_TRACED_STEPS)
    if target_traced != ref_step and not (target_traced >= 2 and ref_step >= 2):
        return -1  # a block of the first step freed later than one step on: not repeatable
    return target * _STEP_KEY + pos
