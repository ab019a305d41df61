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

from memfit.errors import NotModelledError
from memfit.estimate.allocator.caching import MIN_BLOCK_BYTES, CachingAllocatorSim

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


def replay_run(
    templates: StepTemplates,
    lengths: Sequence[int],
    *,
    expandable_segments: bool = False,
    capacity_bytes: int | None = None,
) -> RunReplay:
    """Replay a run whose step ``k`` is ``lengths[k]`` tokens long. ``capacity_bytes``: what the
    allocator may reserve (the GPU's memory less the CUDA context); at the limit it frees its
    cached segments and retries, as torch does, and a request that still fails is an OOM."""
    sim = CachingAllocatorSim(
        expandable_segments=expandable_segments, capacity_bytes=capacity_bytes
    )
    for i, n_bytes in enumerate(templates.workspace_bytes):
        sim.malloc(-1 - i, n_bytes)
    live: set[int] = set()
    unmatched = 0
    init = templates.segments[0][0]
    unmatched += _replay_segment(sim, live, init, 0, 0, templates.sizes_at(0, lengths[0]))
    for k, length in enumerate(lengths, start=1):
        seg = min(k, N_TRACED_STEPS)
        segment = templates.segments[0][seg]
        unmatched += _replay_segment(sim, live, segment, k, seg, templates.sizes_at(seg, length))
    res = sim.result()
    return RunReplay(
        peak_reserved_bytes=res.peak_reserved_bytes,
        peak_allocated_bytes=res.peak_allocated_bytes,
        unmatched_frees=unmatched,
        n_ooms=res.n_ooms,
    )


def _replay_segment(
    sim: CachingAllocatorSim,
    live: set[int],
    segment: _Segment,
    step: int,
    traced: int,
    sizes: list[int],
) -> int:
    unmatched = 0
    for kind, (ref_step, pos), n_bytes in zip(segment.kinds, segment.refs, sizes):
        if ref_step < 0:
            unmatched += kind == "f"
            continue
        key = _replay_key(step, traced, ref_step, pos)
        if kind == "a":
            sim.malloc(key, n_bytes)
            live.add(key)
        elif key is not None and key in live:
            sim.free(key)
            live.discard(key)
        else:
            unmatched += 1
    return unmatched


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
