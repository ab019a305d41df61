"""The caching-allocator replay of :mod:`memfit.estimate.allocator.caching` in its default
configuration (no capacity, no expandable segments, no ``max_split_size``), written for speed.

Same rules, same results (``tests/estimate/allocator/test_fast.py`` compares every field of
:class:`~memfit.estimate.allocator.caching.AllocatorResult` with :class:`CachingAllocatorSim` on
random event lists): best fit by (size, address) in each pool, the split rules, merging with
free neighbours on free, a new segment when nothing fits. In this configuration nothing is ever
given back to the driver (that needs a capacity or ``empty_cache``), so reserved bytes only grow
and no request fails. The replay is one loop with the blocks as small lists and the free lists
as sorted integers, without the general simulator's per-event method calls: 2-3x faster, which
matters where one estimate replays tens of thousands of events (the derived engine).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import numpy as np

from memfit.errors import SpecError
from memfit.estimate.allocator import jit as allocator_jit
from memfit.estimate.allocator.caching import AllocatorResult
from memfit.hardware.cuda_allocator import (
    LARGE_BUFFER_BYTES,
    MIN_BLOCK_BYTES,
    MIN_LARGE_ALLOC_BYTES,
    ROUND_LARGE_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
)

_SHIFT = 64  # free-list key = size << 64 | address
_MASK = (1 << _SHIFT) - 1
# a block: [addr, size, allocated, prev, next, is_small]
_ADDR, _SIZE, _ALLOC, _PREV, _NEXT, _SMALL = range(6)


#: When the compiled replay (the ``fast`` extra's numba) runs: loading it costs ~1 s of CPU once
#: per process (~17 s the first time after an install, compiling into numba's cache), a Python
#: replay of a derived form ~0.1 s. So a process replays its first ``JIT_AFTER_LONG_REPLAYS``
#: lists of at least ``JIT_MIN_EVENTS`` events in Python (a `fit` of one or two estimates never
#: loads numba) and loads the kernel for the next; once loaded, every list takes it.
JIT_MIN_EVENTS = 2000
JIT_AFTER_LONG_REPLAYS = 3
#: How many default-configuration replays ran compiled / in Python in this process, and how many
#: of the Python ones were long (benchmarks and tests read it to say which replay answered).
REPLAYS = {"compiled": 0, "python": 0, "python_long": 0}


def _wants_kernel(n_events: int) -> bool:
    if allocator_jit.kernel_loaded():
        return True
    return n_events >= JIT_MIN_EVENTS and REPLAYS["python_long"] >= JIT_AFTER_LONG_REPLAYS


def count_python_replay(n_events: int) -> None:
    REPLAYS["python"] += 1
    if n_events >= JIT_MIN_EVENTS:
        REPLAYS["python_long"] += 1


def simulate_default(events: Iterable[tuple]) -> AllocatorResult:
    """``simulate(events)`` with the default configuration (see the module docstring): the
    compiled replay of :mod:`memfit.estimate.allocator.jit` where numba is installed (and
    ``MEMFIT_NO_JIT`` unset), else this module's loop; both give the same result."""
    events = events if isinstance(events, list) else list(events)
    if _wants_kernel(len(events)):
        got = allocator_jit.replay_events(events)
        if got is not None:
            REPLAYS["compiled"] += 1
            return got
    count_python_replay(len(events))
    return simulate_default_python(events)


def simulate_default_arrays(
    is_alloc: np.ndarray,
    keys: np.ndarray,
    n_bytes: np.ndarray,
    n_keys: int,
    *,
    compiled: bool = True,
) -> AllocatorResult:
    """:func:`simulate_default` of events given as arrays: event i allocates ``n_bytes[i]``
    under ``keys[i]`` where ``is_alloc[i]``, else frees ``keys[i]``; keys are in
    ``0..n_keys-1``. The compiled replay where it can answer, else the Python loop (only the
    Python loop, not counted in ``REPLAYS``, with ``compiled=False``)."""
    if compiled:
        got = compiled_replay(is_alloc, keys, n_bytes, n_keys)
        if got is not None:
            return got
        count_python_replay(len(keys))
    born = np.asarray(is_alloc, dtype=bool)
    kinds = np.where(born, "a", "f").tolist()
    sizes = np.where(born, n_bytes, 0).tolist()
    return simulate_default_python(zip(kinds, np.asarray(keys).tolist(), sizes, strict=True))


def compiled_replay(
    is_alloc: np.ndarray,
    keys: np.ndarray,
    n_bytes: np.ndarray,
    n_keys: int,
    *,
    capacity_bytes: int | None = None,
    expandable_segments: bool = False,
) -> AllocatorResult | None:
    """:func:`simulate_default_arrays` by the compiled replay, or None where it does not run
    (no numba, ``MEMFIT_NO_JIT``, not yet loaded in this process: see ``JIT_AFTER_LONG_REPLAYS``,
    or a list it hands back: see :func:`memfit.estimate.allocator.jit.replay_arrays`).
    ``capacity_bytes``, ``expandable_segments``: as ``CachingAllocatorSim(capacity_bytes=...,
    expandable_segments=...)``, the same result field for field. The caller counts a Python
    replay it makes instead."""
    if not _wants_kernel(len(keys)):
        return None
    got = allocator_jit.replay_arrays(
        is_alloc, keys, n_bytes, n_keys, capacity_bytes=capacity_bytes,
        expandable_segments=expandable_segments,
    )  # fmt: skip
    if got is not None:
        REPLAYS["compiled"] += 1
    return got


def simulate_default_python(events: Iterable[tuple]) -> AllocatorResult:
    """The Python loop of :func:`simulate_default` (also where the compiled replay cannot
    answer: it raises the errors of a malformed list)."""
    keys_of: tuple[list[int], list[int]] = ([], [])  # sorted free-list keys: large, small pool
    by_addr: tuple[dict[int, list[Any]], dict[int, list[Any]]] = ({}, {})
    live: dict[int, list[Any] | None] = {}
    next_addr = reserved = allocated = peak_allocated = n_segments = peak_at = 0
    insort, bisect_left = bisect.insort, bisect.bisect_left
    for index, event in enumerate(events):
        kind = event[0]
        if kind == "a":
            key, n_bytes = event[1], event[2]
            if key in live:
                raise SpecError(
                    f"malloc of key {key} at event {index}: the key is still allocated; "
                    "free it first or give each live storage its own key"
                )
            if n_bytes <= 0:
                if n_bytes < 0:
                    raise SpecError(f"allocation size ({n_bytes}) must be >= 0 bytes")
                live[key] = None
                continue
            size = (
                MIN_BLOCK_BYTES
                if n_bytes < MIN_BLOCK_BYTES
                else -(-n_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
            )
            small = size <= SMALL_SIZE_BYTES
            keys, addrs = keys_of[small], by_addr[small]
            i = bisect_left(keys, size << _SHIFT)
            if i < len(keys):
                block = addrs.pop(keys.pop(i) & _MASK)
            else:
                if small:
                    seg = SMALL_BUFFER_BYTES
                elif size < MIN_LARGE_ALLOC_BYTES:
                    seg = LARGE_BUFFER_BYTES
                else:
                    seg = -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
                block = [next_addr, seg, False, None, None, small]
                next_addr += seg
                n_segments += 1
                reserved += seg
                peak_at = index
            remaining = block[_SIZE] - size
            if (remaining >= MIN_BLOCK_BYTES) if small else (remaining > SMALL_SIZE_BYTES):
                nxt = block[_NEXT]
                rest = [block[_ADDR] + size, remaining, False, block, nxt, small]
                if nxt is not None:
                    nxt[_PREV] = rest
                block[_NEXT] = rest
                block[_SIZE] = size
                insort(keys, (remaining << _SHIFT) | rest[_ADDR])
                addrs[rest[_ADDR]] = rest
            block[_ALLOC] = True
            live[key] = block
            allocated += block[_SIZE]
            if allocated > peak_allocated:
                peak_allocated = allocated
        elif kind == "f":
            key = event[1]
            try:
                freed = live.pop(key)
            except KeyError:
                raise SpecError(
                    f"free of key {key} at event {index}: the key is not allocated "
                    "(freed twice, or never allocated); check the event list"
                ) from None
            if freed is None:
                continue
            block = freed
            allocated -= block[_SIZE]
            block[_ALLOC] = False
            small = block[_SMALL]
            keys, addrs = keys_of[small], by_addr[small]
            prev = block[_PREV]
            if prev is not None and not prev[_ALLOC]:
                del keys[bisect_left(keys, (prev[_SIZE] << _SHIFT) | prev[_ADDR])]
                del addrs[prev[_ADDR]]
                block[_ADDR] = prev[_ADDR]
                block[_SIZE] += prev[_SIZE]
                block[_PREV] = prev[_PREV]
                if block[_PREV] is not None:
                    block[_PREV][_NEXT] = block
            nxt = block[_NEXT]
            if nxt is not None and not nxt[_ALLOC]:
                del keys[bisect_left(keys, (nxt[_SIZE] << _SHIFT) | nxt[_ADDR])]
                del addrs[nxt[_ADDR]]
                block[_SIZE] += nxt[_SIZE]
                block[_NEXT] = nxt[_NEXT]
                if block[_NEXT] is not None:
                    block[_NEXT][_PREV] = block
            insort(keys, (block[_SIZE] << _SHIFT) | block[_ADDR])
            addrs[block[_ADDR]] = block
        else:
            raise SpecError(
                f"event {index} has kind {kind!r}: use 'a' (allocate) or 'f' (free), "
                "as in ('a', key, n_bytes) / ('f', key, 0)"
            )
    return AllocatorResult.unbounded(
        peak_allocated=peak_allocated, reserved=reserved, n_segments=n_segments, peak_at=peak_at
    )
