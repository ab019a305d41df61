"""The compiled kernel of :mod:`memfit.estimate.allocator.jit` (numba; imported only by
:func:`memfit.estimate.allocator.jit.load_kernel`, never on ``import memfit``).

Every function here is numba-compiled with ``cache=True``: the machine code is kept on disk in
a folder only memfit writes, checked before numba reads it (numba's cache is pickle:
:mod:`memfit.estimate.allocator.kernel_cache`). Compiling takes ~17 s of CPU once; loading it
~0.9 s per process. Where no such folder passes the checks, importing this module raises
:class:`NoCacheError` and the Python replay runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from memfit.estimate.allocator import kernel_cache

#: Status codes of the kernel (``out[0]``).
OK, KEY_LIVE, KEY_NOT_LIVE, NEGATIVE_SIZE, TOO_LARGE = 0, 1, 2, 3, 4
#: Reserved bytes (and any request) stay below this, else the kernel stops (TOO_LARGE).
LIMIT_BYTES = 1 << 40  # 1 TiB: the free lists' packed keys hold addresses below it


class NoCacheError(RuntimeError):
    """No private, writable place for numba's cache: compiling in every process (~17 s of CPU) would
    cost more than the Python replay saves, so the caller keeps the Python replay."""


#: The one folder numba reads and writes the kernel's machine code in: memfit's own, checked
#: (:mod:`memfit.estimate.allocator.kernel_cache`); none, and this module is not loaded.
_FOLDER, _WHY_NOT = kernel_cache.folder()
if _FOLDER is None:
    raise NoCacheError(_WHY_NOT)


def _jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    def wrap(fn: Callable[..., Any]) -> Any:
        # numba's locators try ``config.CACHE_DIR`` first and read it when the function is
        # decorated (numba.core.caching.UserProvidedCacheLocator): set here, then put back, so
        # numba's own places (NUMBA_CACHE_DIR, next to this file, ~/.cache/numba) are never read
        config: Any = numba.config
        saved = config.CACHE_DIR
        config.CACHE_DIR = str(_FOLDER)
        try:
            return numba.njit(cache=True, nogil=True, **options)(fn)
        except (RuntimeError, OSError) as e:  # "cannot cache function ...: no locator available"
            raise NoCacheError(str(e)) from e
        finally:
            config.CACHE_DIR = saved

    return wrap if fn is None else wrap(fn)


# Constants: those of memfit.estimate.allocator.caching (numba freezes a global's value when it
# compiles; written out here so the kernel module needs nothing but numpy and numba).
_MIN_BLOCK = 512  # kMinBlockSize
_SMALL_SIZE = 1 << 20  # kSmallSize (1 MiB)
_SMALL_BUFFER = 2 << 20  # kSmallBuffer (2 MiB)
_LARGE_BUFFER = 20 << 20  # kLargeBuffer (20 MiB)
_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc (10 MiB)
_ROUND_LARGE = 2 << 20  # kRoundLarge (2 MiB)


# A block is a row of ``blocks``; its columns:
_ADDR, _SIZE, _PREV, _NEXT, _ALLOC, _SMALL = range(6)
_NONE = -1  # no neighbour (the segment's first or last block)
# A free block's sort key packs (size, address) into one int64: both are whole 512 B units,
# the size above bit 31, the address below (exact while addresses stay below 2**40 B, 1 TiB).
_UNIT_SHIFT = 9  # 512 B units
_ADDR_BITS = 31
_FIRST_CAPACITY = 256  # rows at first; the tables double when full


@_jit(inline="always")
def _key(size: int, addr: int) -> int:
    return ((size >> _UNIT_SHIFT) << _ADDR_BITS) | (addr >> _UNIT_SHIFT)


@_jit(inline="always")
def _lower_bound(fkey: np.ndarray, lo: int, hi: int, key: int) -> int:
    """First index in ``[lo, hi)`` whose key is not below ``key``: branch-free halving (free
    lists are short: tens to hundreds of blocks). Halving to the last key beat halving to 8
    keys and counting those below (3.6 -> 2.9 ms a replay of a derived form's 54k events: LLVM
    made the count a vector gather); both beat counting up to 128 keys 1.5-2x."""
    n = hi - lo
    while n > 1:
        half = n >> 1
        lo = lo + half if fkey[lo + half - 1] < key else lo
        n -= half
    if n == 1 and fkey[lo] < key:
        lo += 1
    return lo


#: Shared with the expandable-segments replay (``kernel_expandable.py``): the same compile
#: options and on-disk cache, and the same free-list keys and search.
compiled = _jit
free_key = _key
lower_bound = _lower_bound


@_jit(inline="always")
def _delete(fkey: np.ndarray, fblk: np.ndarray, lo: int, hi: int, j: int) -> tuple[int, int]:
    """Remove entry ``j`` of the sorted run ``[lo, hi)``, moving the shorter side by one; the
    run's new bounds."""
    if j - lo < hi - 1 - j:
        for m in range(j, lo, -1):
            fkey[m] = fkey[m - 1]
            fblk[m] = fblk[m - 1]
        return lo + 1, hi
    for m in range(j, hi - 1):
        fkey[m] = fkey[m + 1]
        fblk[m] = fblk[m + 1]
    return lo, hi - 1


@_jit(inline="always")
def _insert(fkey: np.ndarray, fblk: np.ndarray, lo: int, hi: int, key: int,
            blk: int) -> tuple[int, int]:  # fmt: skip
    """Insert ``key`` (of block ``blk``) into the sorted run ``[lo, hi)``, moving the shorter
    side by one (the caller made room on both sides); the run's new bounds."""
    j = _lower_bound(fkey, lo, hi, key)
    if j - lo < hi - j:
        for m in range(lo, j):
            fkey[m - 1] = fkey[m]
            fblk[m - 1] = fblk[m]
        fkey[j - 1] = key
        fblk[j - 1] = blk
        return lo - 1, hi
    for m in range(hi, j, -1):
        fkey[m] = fkey[m - 1]
        fblk[m] = fblk[m - 1]
    fkey[j] = key
    fblk[j] = blk
    return lo, hi + 1


@_jit(inline="always")
def _replace(fkey: np.ndarray, fblk: np.ndarray, lo: int, hi: int, j: int, key: int,
             blk: int) -> None:  # fmt: skip
    """Entry ``j`` of the sorted run ``[lo, hi)`` takes ``key`` (of block ``blk``), moved to
    where the order puts it: a split's remainder takes the entry of the block it was cut from (a
    smaller key), a freed block merged with a free neighbour the neighbour's (a larger one).
    One shift of the entries between, none where the key stays in place (most often)."""
    if key > fkey[j]:
        q = j + 1 if j + 1 == hi or fkey[j + 1] > key else _lower_bound(fkey, j + 2, hi, key)
        for m in range(j, q - 1):
            fkey[m] = fkey[m + 1]
            fblk[m] = fblk[m + 1]
        fkey[q - 1] = key
        fblk[q - 1] = blk
    else:
        q = j if j == lo or fkey[j - 1] < key else _lower_bound(fkey, lo, j - 1, key)
        for m in range(j, q, -1):
            fkey[m] = fkey[m - 1]
            fblk[m] = fblk[m - 1]
        fkey[q] = key
        fblk[q] = blk


@_jit
def _grow_blocks(blocks: np.ndarray) -> np.ndarray:
    out = np.empty((2 * len(blocks), 6), dtype=np.int64)
    out[: len(blocks)] = blocks
    return out


@_jit
def _relayout(fkey: np.ndarray, fblk: np.ndarray, start: np.ndarray,
              stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each pool's free list centred in its half of new tables, at most half full."""
    room = len(fkey) // 2
    longest = max(stop[0] - start[0], stop[1] - start[1])
    while 2 * longest + 4 > room:
        room *= 2
    key_out = np.empty(2 * room, dtype=np.int64)
    blk_out = np.empty(2 * room, dtype=np.int64)
    for p in range(2):
        n = stop[p] - start[p]
        at = p * room + (room - n) // 2
        key_out[at : at + n] = fkey[start[p] : stop[p]]
        blk_out[at : at + n] = fblk[start[p] : stop[p]]
        start[p], stop[p] = at, at + n
    return key_out, blk_out


# The replay's scalar state, kept in one int64 array between the inner loop's calls.
_N_SPARE, _N_BLOCKS, _NEXT_ADDR, _RESERVED, _ALLOCATED, _PEAK_ALLOCATED, _N_SEGMENTS = range(7)
_PEAK_AT, _PEAK_RESERVED, _N_OOMS, _FIRST_OOM, _N_STATE = 7, 8, 9, 10, 11
#: ``out``'s length: status, event of the error, peak allocated, final reserved, segments, event
#: of the reserved peak, peak reserved, OOMs, event of the first OOM (-1: none)
N_OUT = 9
# ``live``: the key's block row, or one of these
_NOT_LIVE, _ZERO_BYTES, _FAILED = -1, -2, -3


@_jit
def replay_default(
    is_alloc: np.ndarray,
    keys: np.ndarray,
    n_bytes: np.ndarray,
    n_keys: int,
    capacity: int,
    out: np.ndarray,
) -> None:
    """Replay the events (see :mod:`memfit.estimate.allocator.jit`); write
    ``out`` = [status, event of the error, peak allocated, final reserved, segments, event of
    the reserved peak, peak reserved, OOMs, event of the first OOM or -1] (:data:`N_OUT`).

    ``capacity``: the bytes the allocator may reserve, or -1 (unlimited). At the limit it does
    what ``CachingAllocatorSim(capacity_bytes=...)`` does: a new segment that would take the
    reserved bytes above it is refused, every free block that is a whole segment (of either
    pool) is given back, and the segment is asked for once more; a request that still fails is
    an OOM (counted, not allocated; a later free of its key does nothing).

    The tables grow here, between calls of :func:`_replay_from`, which stops before an event
    that might not find room: the event loop allocates nothing, so it is compiled without
    numba's reference counting (``_nrt=False``). With it, every call of the free-list helpers
    and every table reassigned in the loop took and dropped references to the tables (atomic
    increments and decrements: two thirds of the loop's time under ``perf`` on a derived
    form's 54k events, 4.9 ms a replay with them, about 3.1 ms without; the same results)."""
    blocks = np.empty((_FIRST_CAPACITY, 6), dtype=np.int64)
    spare = np.empty(_FIRST_CAPACITY, dtype=np.int64)  # rows of merged-away blocks, for reuse
    # the free lists, sorted by key: pool p's entries are [start[p], stop[p]) in its half
    fkey = np.empty(2 * _FIRST_CAPACITY, dtype=np.int64)
    fblk = np.empty(2 * _FIRST_CAPACITY, dtype=np.int64)
    half = _FIRST_CAPACITY // 2
    start = np.array([half, 3 * half], dtype=np.int64)
    stop = start.copy()
    live = np.full(n_keys, _NOT_LIVE, dtype=np.int64)
    state = np.zeros(_N_STATE, dtype=np.int64)
    state[_FIRST_OOM] = -1
    i = 0
    while True:
        i = _replay_from(is_alloc, keys, n_bytes, live, blocks, spare, fkey, fblk, start, stop,
                         state, i, capacity, out)  # fmt: skip
        if i < 0 or i >= len(keys):
            break
        # event i may need two more rows, or an entry on either side of a free list
        if state[_N_BLOCKS] + 2 > len(blocks) and state[_N_SPARE] < 2:
            blocks = _grow_blocks(blocks)
            spare_grown = np.empty(len(blocks), dtype=np.int64)
            spare_grown[: state[_N_SPARE]] = spare[: state[_N_SPARE]]
            spare = spare_grown
        if _cramped(len(fkey) // 2, start[0], stop[0], start[1], stop[1]):
            fkey, fblk = _relayout(fkey, fblk, start, stop)
    if i < 0:
        return
    out[0], out[2], out[3] = OK, state[_PEAK_ALLOCATED], state[_RESERVED]
    out[4], out[5] = state[_N_SEGMENTS], state[_PEAK_AT]
    out[6], out[7], out[8] = state[_PEAK_RESERVED], state[_N_OOMS], state[_FIRST_OOM]


@_jit(inline="always")
def _release_whole_segments(blocks: np.ndarray, spare: np.ndarray, n_spare: int,
                            fkey: np.ndarray, fblk: np.ndarray, lo: int,
                            hi: int) -> tuple[int, int, int, int]:  # fmt: skip
    """``release_cached_blocks`` for one pool's free list ``[lo, hi)``: every free block that
    is a whole segment (no neighbour) leaves the list, its row goes to ``spare``; the list's new
    end, the spare rows, and the bytes and segments given back. The kept entries stay in order
    from ``lo`` (the list only shrinks: no room is needed)."""
    w = lo
    released = 0
    n_released = 0
    for m in range(lo, hi):
        b = fblk[m]
        if blocks[b, _PREV] == _NONE and blocks[b, _NEXT] == _NONE:
            released += blocks[b, _SIZE]
            n_released += 1
            spare[n_spare] = b
            n_spare += 1
        else:
            fkey[w] = fkey[m]
            fblk[w] = fblk[m]
            w += 1
    return w, n_spare, released, n_released


@_jit(inline="always")
def _cramped(room: int, lo0: int, hi0: int, lo1: int, hi1: int) -> bool:
    """Whether a pool's free list (``[lo0, hi0)`` in the first half of tables of ``2 * room``
    entries, ``[lo1, hi1)`` in the second) touches an end of its half: an insert might find
    no room."""
    return lo0 == 0 or hi0 == room or lo1 == room or hi1 == 2 * room


@_jit(_nrt=False)  # allocates nothing: no reference counting (see replay_default)
def _replay_from(is_alloc: np.ndarray, keys: np.ndarray, n_bytes: np.ndarray, live: np.ndarray,
                 blocks: np.ndarray, spare: np.ndarray, fkey: np.ndarray, fblk: np.ndarray,
                 start: np.ndarray, stop: np.ndarray, state: np.ndarray, first: int,
                 capacity: int, out: np.ndarray) -> int:  # fmt: skip
    """Events ``first..`` until the end (its length returned), an event for which a table
    may be too small (its index returned, nothing of it done: the caller grows the tables and
    calls again from there), or an error (-1; ``out[0]`` and ``out[1]`` say which and where)."""
    n_spare, n_blocks = state[_N_SPARE], state[_N_BLOCKS]
    next_addr, reserved, allocated = state[_NEXT_ADDR], state[_RESERVED], state[_ALLOCATED]
    peak_allocated, n_segments, peak_at = (
        state[_PEAK_ALLOCATED],
        state[_N_SEGMENTS],
        state[_PEAK_AT],
    )
    peak_reserved, n_ooms, first_oom = state[_PEAK_RESERVED], state[_N_OOMS], state[_FIRST_OOM]
    # the free lists' bounds as locals (stores to the tables cannot then change them)
    room = len(fkey) // 2
    lo0, hi0, lo1, hi1 = start[0], stop[0], start[1], stop[1]
    stopped = len(keys)
    for i in range(first, len(keys)):
        if (n_blocks + 2 > len(blocks) and n_spare < 2) or _cramped(room, lo0, hi0, lo1, hi1):
            stopped = i
            break
        k = keys[i]
        if is_alloc[i]:
            if live[k] != _NOT_LIVE and live[k] != _FAILED:
                out[0], out[1] = KEY_LIVE, i
                return -1
            req = n_bytes[i]
            if req <= 0:
                if req < 0:
                    out[0], out[1] = NEGATIVE_SIZE, i
                    return -1
                live[k] = _ZERO_BYTES
                continue
            if req >= LIMIT_BYTES:
                out[0], out[1] = TOO_LARGE, i
                return -1
            size = (max(req, _MIN_BLOCK) + _MIN_BLOCK - 1) // _MIN_BLOCK * _MIN_BLOCK
            p = 1 if size <= _SMALL_SIZE else 0
            lo, hi = (lo1, hi1) if p == 1 else (lo0, hi0)
            j = _lower_bound(fkey, lo, hi, _key(size, 0))
            found = j < hi
            if found:
                blk = fblk[j]
            else:
                if p == 1:
                    seg = _SMALL_BUFFER
                elif size < _MIN_LARGE_ALLOC:
                    seg = _LARGE_BUFFER
                else:
                    seg = (size + _ROUND_LARGE - 1) // _ROUND_LARGE * _ROUND_LARGE
                if capacity >= 0 and reserved + seg > capacity:
                    # refused: give back every whole free segment of both pools, ask again
                    hi0, n_spare, freed, n_freed = _release_whole_segments(
                        blocks, spare, n_spare, fkey, fblk, lo0, hi0
                    )
                    reserved -= freed
                    n_segments -= n_freed
                    hi1, n_spare, freed, n_freed = _release_whole_segments(
                        blocks, spare, n_spare, fkey, fblk, lo1, hi1
                    )
                    reserved -= freed
                    n_segments -= n_freed
                    lo, hi = (lo1, hi1) if p == 1 else (lo0, hi0)
                    if reserved + seg > capacity:  # an OOM: nothing allocated
                        n_ooms += 1
                        if first_oom < 0:
                            first_oom = i
                        live[k] = _FAILED
                        continue
                if next_addr + seg >= LIMIT_BYTES:
                    out[0], out[1] = TOO_LARGE, i
                    return -1
                if n_spare > 0:
                    n_spare -= 1
                    blk = spare[n_spare]
                else:
                    blk = n_blocks
                    n_blocks += 1
                blocks[blk, _ADDR], blocks[blk, _SIZE] = next_addr, seg
                blocks[blk, _PREV], blocks[blk, _NEXT], blocks[blk, _SMALL] = _NONE, _NONE, p
                next_addr += seg
                n_segments += 1
                reserved += seg
                if reserved > peak_reserved:
                    peak_reserved = reserved
                    peak_at = i
            remaining = blocks[blk, _SIZE] - size
            split = remaining >= _MIN_BLOCK if p == 1 else remaining > _SMALL_SIZE
            if split:
                if n_spare > 0:
                    n_spare -= 1
                    rest = spare[n_spare]
                else:
                    rest = n_blocks
                    n_blocks += 1
                nxt = blocks[blk, _NEXT]
                rest_addr = blocks[blk, _ADDR] + size
                blocks[rest, _ADDR], blocks[rest, _SIZE] = rest_addr, remaining
                blocks[rest, _PREV], blocks[rest, _NEXT] = blk, nxt
                blocks[rest, _ALLOC], blocks[rest, _SMALL] = 0, p
                if nxt != _NONE:
                    blocks[nxt, _PREV] = rest
                blocks[blk, _NEXT] = rest
                blocks[blk, _SIZE] = size
                if found:  # the remainder takes the chosen block's entry
                    _replace(fkey, fblk, lo, hi, j, _key(remaining, rest_addr), rest)
                else:  # room on both sides: the loop stopped before a cramped list
                    lo, hi = _insert(fkey, fblk, lo, hi, _key(remaining, rest_addr), rest)
            elif found:
                lo, hi = _delete(fkey, fblk, lo, hi, j)
            if p == 1:
                lo1, hi1 = lo, hi
            else:
                lo0, hi0 = lo, hi
            blocks[blk, _ALLOC] = 1
            live[k] = blk
            allocated += blocks[blk, _SIZE]
            if allocated > peak_allocated:
                peak_allocated = allocated
        else:
            blk = live[k]
            if blk == _NOT_LIVE:
                out[0], out[1] = KEY_NOT_LIVE, i
                return -1
            live[k] = _NOT_LIVE
            if blk < 0:  # a zero-byte request, or one that failed (an OOM): nothing to free
                continue
            allocated -= blocks[blk, _SIZE]
            blocks[blk, _ALLOC] = 0
            p = blocks[blk, _SMALL]
            lo, hi = (lo1, hi1) if p == 1 else (lo0, hi0)
            prv, nxt = blocks[blk, _PREV], blocks[blk, _NEXT]
            merge_prev = prv != _NONE and blocks[prv, _ALLOC] == 0
            slot = -1  # the free list entry the merged block takes over
            if nxt != _NONE and blocks[nxt, _ALLOC] == 0:
                key = _key(blocks[nxt, _SIZE], blocks[nxt, _ADDR])
                slot = _lower_bound(fkey, lo, hi, key)
                if merge_prev:  # two entries become one: the next block's goes
                    lo, hi = _delete(fkey, fblk, lo, hi, slot)
                blocks[blk, _SIZE] += blocks[nxt, _SIZE]
                blocks[blk, _NEXT] = blocks[nxt, _NEXT]
                if blocks[blk, _NEXT] != _NONE:
                    blocks[blocks[blk, _NEXT], _PREV] = blk
                spare[n_spare] = nxt
                n_spare += 1
            if merge_prev:
                key = _key(blocks[prv, _SIZE], blocks[prv, _ADDR])
                slot = _lower_bound(fkey, lo, hi, key)
                blocks[blk, _ADDR] = blocks[prv, _ADDR]
                blocks[blk, _SIZE] += blocks[prv, _SIZE]
                blocks[blk, _PREV] = blocks[prv, _PREV]
                if blocks[blk, _PREV] != _NONE:
                    blocks[blocks[blk, _PREV], _NEXT] = blk
                spare[n_spare] = prv
                n_spare += 1
            key = _key(blocks[blk, _SIZE], blocks[blk, _ADDR])
            if slot >= 0:  # merged: a larger key than the neighbour's entry it takes
                _replace(fkey, fblk, lo, hi, slot, key, blk)
            else:
                lo, hi = _insert(fkey, fblk, lo, hi, key, blk)
            if p == 1:
                lo1, hi1 = lo, hi
            else:
                lo0, hi0 = lo, hi
    start[0], stop[0], start[1], stop[1] = lo0, hi0, lo1, hi1
    state[_N_SPARE], state[_N_BLOCKS] = n_spare, n_blocks
    state[_NEXT_ADDR], state[_RESERVED], state[_ALLOCATED] = next_addr, reserved, allocated
    state[_PEAK_ALLOCATED], state[_N_SEGMENTS], state[_PEAK_AT] = (
        peak_allocated,
        n_segments,
        peak_at,
    )
    state[_PEAK_RESERVED], state[_N_OOMS], state[_FIRST_OOM] = peak_reserved, n_ooms, first_oom
    return stopped
