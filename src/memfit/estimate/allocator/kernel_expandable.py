"""The compiled replay of ``CachingAllocatorSim(expandable_segments=True[, capacity_bytes=])``
(numba; imported only by :func:`memfit.estimate.allocator.jit.load_kernel`, with
:mod:`memfit.estimate.allocator.kernel`, whose cached ``compiled`` and folder it shares).

Same rules as the sim's expandable path (:mod:`memfit.estimate.allocator.caching`, read from
``c10/cuda/CUDACachingAllocator.cpp``), same integers:

- each pool (small: requests up to 1 MiB, 2 MiB pages; large: 20 MiB pages) is one segment, a
  chain of blocks in address order: mapped blocks (allocated or free) and unmapped ranges; the
  last is the endless unmapped tail. Addresses here are offsets in the pool's segment;
- best fit among the pool's free mapped blocks by (size, address), a block that can grow into
  an unmapped range just after it taken last (the sim's ``_get_free_block``); a block splits
  whenever 512 B or more remain;
- no fitting free block: the lowest unmapped range (with the free block before it) whose free
  run holds the request is mapped, whole pages at a time, until the run covers it
  (``_alloc_expandable``); with a capacity, torch's check (reserved + the request's segment
  size) and the physical one (reserved + the pages mapped) apply, and where either fails every
  free block gives its whole pages back (``_release_cached_blocks`` / ``_unmap_block``) and the
  request is tried once more; a request that still fails is an OOM (counted; its key's free
  does nothing).

Layout: blocks are rows of an int64 table (offset, size, previous / next block, allocated,
pool, mapped; a merged-away row is reused); each pool's free blocks are a sorted run of int64
keys packing (size, offset) as in ``kernel.py`` (offsets and mapped sizes below 1 TiB, else the
kernel stops and the Python replay answers); each pool's unmapped ranges are a list of rows in
address order (one, the tail, until memory is given back). The tables grow between events, to
a bound the next event cannot pass. Unlike the default kernel this one is compiled with numba's
reference counting (a table may grow mid-loop); it replays the same ~1 M events of a
``--seq-dist`` run in well under a second, against ~9 s for the sim.

``tests/estimate/allocator/test_jit_expandable.py`` compares every field of the result with the
sim on random event lists (with and without a capacity: OOMs, pages given back, holes mapped
again) and on the run of a traced model.
"""

from __future__ import annotations

import numpy as np

from memfit.estimate.allocator.kernel import (
    KEY_LIVE,
    KEY_NOT_LIVE,
    LIMIT_BYTES,
    NEGATIVE_SIZE,
    OK,
    TOO_LARGE,
    compiled,
    free_key,
    lower_bound,
)

#: A broken invariant (a bug): the caller replays the events in Python.
INTERNAL = 5

_MIN_BLOCK = 512  # kMinBlockSize
_SMALL_SIZE = 1 << 20  # kSmallSize: requests up to it use the small pool
_SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool's page
_LARGE_BUFFER = 20 << 20  # kLargeBuffer: the large pool's page
_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
_ROUND_LARGE = 2 << 20  # kRoundLarge
_ADDRESS_SPACE = 1 << 50  # the unmapped tail's size (the sim's _EXPANDABLE_ADDRESS_SPACE_BYTES)

# Block columns, and pools (index 0: large, 1: small, the sim's release order)
_ADDR, _SIZE, _PREV, _NEXT, _ALLOC, _POOL, _MAPPED = range(7)
_N_COLS = 7
_NONE = -1
_NOT_LIVE, _ZERO_BYTES, _FAILED = -1, -2, -3
# the replay's scalar state (one int64 array, shared with the helpers)
_N_BLOCKS, _N_SPARE, _RESERVED, _PEAK_RESERVED, _PEAK_AT, _EVENT, _STATUS = range(7)
_ALLOCATED, _PEAK_ALLOCATED, _N_OOMS, _FIRST_OOM, _N_STATE = 7, 8, 9, 10, 11
_FIRST_ROWS = 256


@compiled(inline="always")
def _new_row(blocks: np.ndarray, spare: np.ndarray, st: np.ndarray, addr: int, size: int,
             pool: int, mapped: int) -> int:  # fmt: skip
    """A row for a new block (a reused one where a merge freed one); the caller links it."""
    if st[_N_SPARE] > 0:
        st[_N_SPARE] -= 1
        b = spare[st[_N_SPARE]]
    else:
        b = st[_N_BLOCKS]
        st[_N_BLOCKS] += 1
    blocks[b, _ADDR], blocks[b, _SIZE], blocks[b, _PREV], blocks[b, _NEXT] = addr, size, -1, -1
    blocks[b, _ALLOC], blocks[b, _POOL], blocks[b, _MAPPED] = 0, pool, mapped
    return b


@compiled(inline="always")
def _fl_insert(fkey: np.ndarray, fblk: np.ndarray, nfree: np.ndarray, blocks: np.ndarray,
               b: int) -> None:  # fmt: skip
    p = blocks[b, _POOL]
    key = free_key(blocks[b, _SIZE], blocks[b, _ADDR])
    n = nfree[p]
    j = lower_bound(fkey[p], 0, n, key)
    for m in range(n, j, -1):
        fkey[p, m] = fkey[p, m - 1]
        fblk[p, m] = fblk[p, m - 1]
    fkey[p, j] = key
    fblk[p, j] = b
    nfree[p] = n + 1


@compiled(inline="always")
def _fl_delete_at(fkey: np.ndarray, fblk: np.ndarray, nfree: np.ndarray, p: int, j: int) -> None:
    n = nfree[p] - 1
    for m in range(j, n):
        fkey[p, m] = fkey[p, m + 1]
        fblk[p, m] = fblk[p, m + 1]
    nfree[p] = n


@compiled(inline="always")
def _fl_remove(fkey: np.ndarray, fblk: np.ndarray, nfree: np.ndarray, blocks: np.ndarray,
               b: int, st: np.ndarray) -> None:  # fmt: skip
    p = blocks[b, _POOL]
    j = lower_bound(fkey[p], 0, nfree[p], free_key(blocks[b, _SIZE], blocks[b, _ADDR]))
    if j >= nfree[p] or fblk[p, j] != b:
        st[_STATUS] = INTERNAL
        return
    _fl_delete_at(fkey, fblk, nfree, p, j)


@compiled(inline="always")
def _ul_find(ulist: np.ndarray, ulen: np.ndarray, blocks: np.ndarray, p: int, b: int) -> int:
    """Index of unmapped row ``b`` in pool ``p``'s list (in address order), or -1."""
    lo, hi = 0, ulen[p]
    addr = blocks[b, _ADDR]
    while lo < hi:
        mid = (lo + hi) >> 1
        if blocks[ulist[p, mid], _ADDR] < addr:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < ulen[p] and ulist[p, lo] == b else -1


@compiled(inline="always")
def _ul_remove(ulist: np.ndarray, ulen: np.ndarray, blocks: np.ndarray, p: int, b: int,
               st: np.ndarray) -> None:  # fmt: skip
    j = _ul_find(ulist, ulen, blocks, p, b)
    if j < 0:
        st[_STATUS] = INTERNAL
        return
    for m in range(j, ulen[p] - 1):
        ulist[p, m] = ulist[p, m + 1]
    ulen[p] -= 1


@compiled(inline="always")
def _ul_insert(ulist: np.ndarray, ulen: np.ndarray, blocks: np.ndarray, p: int, b: int) -> None:
    addr = blocks[b, _ADDR]
    lo, hi = 0, ulen[p]
    while lo < hi:
        mid = (lo + hi) >> 1
        if blocks[ulist[p, mid], _ADDR] < addr:
            lo = mid + 1
        else:
            hi = mid
    for m in range(ulen[p], lo, -1):
        ulist[p, m] = ulist[p, m - 1]
    ulist[p, lo] = b
    ulen[p] += 1


@compiled(_nrt=False)  # allocates nothing: no reference counting
def _merge(blocks: np.ndarray, spare: np.ndarray, fkey: np.ndarray, fblk: np.ndarray,
           nfree: np.ndarray, ulist: np.ndarray, ulen: np.ndarray, st: np.ndarray, dst: int,
           src: int) -> None:  # fmt: skip
    """The sim's ``_merge``: ``dst`` absorbs ``src`` where it is a free neighbour of the same
    mapping state (leaving its free list or its pool's unmapped list)."""
    if src == _NONE or blocks[src, _ALLOC] != 0 or blocks[src, _MAPPED] != blocks[dst, _MAPPED]:
        return
    p = blocks[src, _POOL]
    if blocks[src, _MAPPED] != 0:
        _fl_remove(fkey, fblk, nfree, blocks, src, st)
    else:
        _ul_remove(ulist, ulen, blocks, p, src, st)
    if src == blocks[dst, _PREV]:
        blocks[dst, _ADDR] = blocks[src, _ADDR]
        blocks[dst, _PREV] = blocks[src, _PREV]
        if blocks[dst, _PREV] != _NONE:
            blocks[blocks[dst, _PREV], _NEXT] = dst
    else:
        blocks[dst, _NEXT] = blocks[src, _NEXT]
        if blocks[dst, _NEXT] != _NONE:
            blocks[blocks[dst, _NEXT], _PREV] = dst
    blocks[dst, _SIZE] += blocks[src, _SIZE]
    spare[st[_N_SPARE]] = src
    st[_N_SPARE] += 1


@compiled(_nrt=False)  # allocates nothing: no reference counting
def _map_block(blocks: np.ndarray, spare: np.ndarray, fkey: np.ndarray, fblk: np.ndarray,
               nfree: np.ndarray, ulist: np.ndarray, ulen: np.ndarray, mapped_bytes: np.ndarray,
               st: np.ndarray, b: int, n_bytes: int, capacity: int) -> bool:  # fmt: skip
    """The sim's ``_map_block``: map the pages covering the first ``n_bytes`` of unmapped
    range ``b``; False where the capacity refuses them."""
    p = blocks[b, _POOL]
    page = _SMALL_BUFFER if p == 1 else _LARGE_BUFFER
    offset = blocks[b, _ADDR]
    mapped = (offset + n_bytes + page - 1) // page * page - offset
    if capacity >= 0 and st[_RESERVED] + mapped > capacity:
        return False
    if offset + mapped >= LIMIT_BYTES:
        st[_STATUS] = TOO_LARGE
        return False
    if mapped < blocks[b, _SIZE]:  # the rest stays unmapped: it takes b's place in the list
        j = _ul_find(ulist, ulen, blocks, p, b)
        rest = _new_row(blocks, spare, st, offset + mapped, blocks[b, _SIZE] - mapped, p, 0)
        nxt = blocks[b, _NEXT]
        blocks[rest, _PREV], blocks[rest, _NEXT] = b, nxt
        if nxt != _NONE:
            blocks[nxt, _PREV] = rest
        blocks[b, _NEXT] = rest
        blocks[b, _SIZE] = mapped
        if j < 0:
            st[_STATUS] = INTERNAL
            return False
        ulist[p, j] = rest
    else:
        _ul_remove(ulist, ulen, blocks, p, b, st)
    blocks[b, _MAPPED] = 1
    _merge(blocks, spare, fkey, fblk, nfree, ulist, ulen, st, b, blocks[b, _PREV])
    _merge(blocks, spare, fkey, fblk, nfree, ulist, ulen, st, b, blocks[b, _NEXT])
    _fl_insert(fkey, fblk, nfree, blocks, b)
    mapped_bytes[p] += mapped
    st[_RESERVED] += mapped
    if st[_RESERVED] > st[_PEAK_RESERVED]:
        st[_PEAK_RESERVED] = st[_RESERVED]
        st[_PEAK_AT] = st[_EVENT]
    return True


@compiled(_nrt=False)  # allocates nothing: no reference counting
def _alloc_expandable(blocks: np.ndarray, spare: np.ndarray, fkey: np.ndarray, fblk: np.ndarray,
                      nfree: np.ndarray, ulist: np.ndarray, ulen: np.ndarray,
                      mapped_bytes: np.ndarray, st: np.ndarray, p: int, size: int,
                      capacity: int) -> int:  # fmt: skip
    """The sim's ``_alloc_block`` + ``_alloc_expandable``: a free block of at least ``size``
    made by mapping pages (taken off the free list), or -1."""
    seg = _SMALL_BUFFER if size <= _SMALL_SIZE else (
        _LARGE_BUFFER if size < _MIN_LARGE_ALLOC
        else (size + _ROUND_LARGE - 1) // _ROUND_LARGE * _ROUND_LARGE
    )  # fmt: skip
    if capacity >= 0 and st[_RESERVED] + seg > capacity:
        return _NONE
    if ulen[p] == 0:  # the pool's segment: one endless unmapped range
        b = _new_row(blocks, spare, st, 0, _ADDRESS_SPACE, p, 0)
        ulist[p, 0] = b
        ulen[p] = 1
    # the lowest unmapped range (with the free block before it) whose free run holds the size
    cand = _NONE
    for m in range(ulen[p]):
        start = ulist[p, m]
        prv = blocks[start, _PREV]
        if prv != _NONE and blocks[prv, _ALLOC] == 0:
            start = prv
        run = 0
        w = start
        while w != _NONE and run < size and blocks[w, _ALLOC] == 0:
            run += blocks[w, _SIZE]
            w = blocks[w, _NEXT]
        if run >= size:
            cand = start
            break
    if cand == _NONE:
        st[_STATUS] = INTERNAL
        return _NONE
    if blocks[cand, _MAPPED] == 0 and not _map_block(
        blocks, spare, fkey, fblk, nfree, ulist, ulen, mapped_bytes, st, cand,
        min(blocks[cand, _SIZE], size), capacity,
    ):  # fmt: skip
        return _NONE
    while blocks[cand, _SIZE] < size:
        nxt = blocks[cand, _NEXT]
        if nxt == _NONE or blocks[nxt, _MAPPED] != 0:
            st[_STATUS] = INTERNAL
            return _NONE
        if not _map_block(blocks, spare, fkey, fblk, nfree, ulist, ulen, mapped_bytes, st, nxt,
                          min(size - blocks[cand, _SIZE], blocks[nxt, _SIZE]),
                          capacity):  # fmt: skip
            return _NONE
        cand = nxt
    _fl_remove(fkey, fblk, nfree, blocks, cand, st)
    return cand


@compiled(_nrt=False)  # allocates nothing: no reference counting
def _release_cached_blocks(blocks: np.ndarray, spare: np.ndarray, fkey: np.ndarray,
                           fblk: np.ndarray, nfree: np.ndarray, ulist: np.ndarray,
                           ulen: np.ndarray, mapped_bytes: np.ndarray, st: np.ndarray,
                           todo: np.ndarray) -> None:  # fmt: skip
    """The sim's ``_release_cached_blocks`` with expandable segments: every free block gives
    back the whole pages inside it (``_unmap_block``); the pieces before and after stay mapped
    and free. Each block's outcome does not depend on the others' (no two free mapped blocks
    are neighbours), so the order they are visited in does not matter."""
    for p in range(2):
        page = _SMALL_BUFFER if p == 1 else _LARGE_BUFFER
        n_todo = nfree[p]
        for m in range(n_todo):  # the free blocks before any is cut (``todo``: scratch room)
            todo[m] = fblk[p, m]
        for m in range(n_todo):
            b = todo[m]
            addr, size = blocks[b, _ADDR], blocks[b, _SIZE]
            first = (addr + page - 1) // page * page
            end = (addr + size) // page * page
            if first >= end:
                continue
            _fl_remove(fkey, fblk, nfree, blocks, b, st)
            if first > addr:  # a mapped piece before the pages
                piece = _new_row(blocks, spare, st, addr, first - addr, p, 1)
                prv = blocks[b, _PREV]
                blocks[piece, _PREV], blocks[piece, _NEXT] = prv, b
                if prv != _NONE:
                    blocks[prv, _NEXT] = piece
                blocks[b, _PREV] = piece
                _fl_insert(fkey, fblk, nfree, blocks, piece)
            if addr + size > end:  # and after
                piece = _new_row(blocks, spare, st, end, addr + size - end, p, 1)
                nxt = blocks[b, _NEXT]
                blocks[piece, _PREV], blocks[piece, _NEXT] = b, nxt
                if nxt != _NONE:
                    blocks[nxt, _PREV] = piece
                blocks[b, _NEXT] = piece
                _fl_insert(fkey, fblk, nfree, blocks, piece)
            blocks[b, _ADDR], blocks[b, _SIZE], blocks[b, _MAPPED] = first, end - first, 0
            _merge(blocks, spare, fkey, fblk, nfree, ulist, ulen, st, b, blocks[b, _PREV])
            _merge(blocks, spare, fkey, fblk, nfree, ulist, ulen, st, b, blocks[b, _NEXT])
            _ul_insert(ulist, ulen, blocks, p, b)
            mapped_bytes[p] -= end - first
            st[_RESERVED] -= end - first


@compiled
def _room(blocks: np.ndarray, spare: np.ndarray, fkey: np.ndarray, fblk: np.ndarray,
          ulist: np.ndarray, need_rows: int, need_free: int,
          need_unmapped: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                       np.ndarray]:  # fmt: skip
    """The tables, grown (doubled until they fit) where the next event might overrun them."""
    if need_rows > len(blocks):
        n = len(blocks)
        while n < need_rows:
            n *= 2
        grown = np.empty((n, _N_COLS), dtype=np.int64)
        grown[: len(blocks)] = blocks
        blocks = grown
        spare_grown = np.empty(n, dtype=np.int64)
        spare_grown[: len(spare)] = spare
        spare = spare_grown
    if need_free > fkey.shape[1]:
        n = fkey.shape[1]
        while n < need_free:
            n *= 2
        key_grown = np.empty((2, n), dtype=np.int64)
        blk_grown = np.empty((2, n), dtype=np.int64)
        key_grown[:, : fkey.shape[1]] = fkey
        blk_grown[:, : fkey.shape[1]] = fblk
        fkey, fblk = key_grown, blk_grown
    if need_unmapped > ulist.shape[1]:
        n = ulist.shape[1]
        while n < need_unmapped:
            n *= 2
        grown_u = np.empty((2, n), dtype=np.int64)
        grown_u[:, : ulist.shape[1]] = ulist
        ulist = grown_u
    return blocks, spare, fkey, fblk, ulist


@compiled
def replay_expandable(
    is_alloc: np.ndarray,
    keys: np.ndarray,
    n_bytes: np.ndarray,
    n_keys: int,
    capacity: int,
    out: np.ndarray,
) -> None:
    """Replay the events with expandable segments (module docstring); ``out`` as the default
    kernel's (``kernel.N_OUT``): [status, event of the error, peak allocated, final reserved,
    pools holding mapped pages, event of the reserved peak, peak reserved, OOMs, event of the
    first OOM or -1]. ``capacity``: the bytes the allocator may reserve, or -1 (unlimited).

    The tables grow here, between calls of :func:`_replay_from` (compiled without reference
    counting, as the default kernel's loop), which stops before an event that might not find
    room in them."""
    blocks = np.empty((_FIRST_ROWS, _N_COLS), dtype=np.int64)
    spare = np.empty(_FIRST_ROWS, dtype=np.int64)
    fkey = np.empty((2, _FIRST_ROWS), dtype=np.int64)
    fblk = np.empty((2, _FIRST_ROWS), dtype=np.int64)
    ulist = np.empty((2, 16), dtype=np.int64)
    todo = np.empty(_FIRST_ROWS, dtype=np.int64)
    nfree = np.zeros(2, dtype=np.int64)
    ulen = np.zeros(2, dtype=np.int64)
    mapped_bytes = np.zeros(2, dtype=np.int64)
    live = np.full(n_keys, _NOT_LIVE, dtype=np.int64)
    st = np.zeros(_N_STATE, dtype=np.int64)
    st[_FIRST_OOM] = -1
    i = 0
    while True:
        i = _replay_from(is_alloc, keys, n_bytes, live, blocks, spare, fkey, fblk, nfree, ulist,
                         ulen, mapped_bytes, todo, st, i, capacity, out)  # fmt: skip
        if i < 0 or i >= len(keys):
            break
        need_rows, need_free, need_unmapped = _need(st, nfree, ulen)
        blocks, spare, fkey, fblk, ulist = _room(blocks, spare, fkey, fblk, ulist, need_rows,
                                                 need_free, need_unmapped)  # fmt: skip
        if len(todo) < fkey.shape[1]:
            todo = np.empty(fkey.shape[1], dtype=np.int64)
    if i < 0:
        return
    out[0], out[1], out[2], out[3] = OK, 0, st[_PEAK_ALLOCATED], st[_RESERVED]
    out[4] = int(mapped_bytes[0] > 0) + int(mapped_bytes[1] > 0)  # pools holding pages
    out[5], out[6], out[7], out[8] = st[_PEAK_AT], st[_PEAK_RESERVED], st[_N_OOMS], st[_FIRST_OOM]


@compiled(inline="always")
def _need(st: np.ndarray, nfree: np.ndarray, ulen: np.ndarray) -> tuple[int, int, int]:
    """The table sizes the next event may need: a release cuts every free block in three (two
    new rows, one more unmapped range each); then a new row per unmapped range mapped, the
    pool's first row and a split; as many free-list entries."""
    n_free = nfree[0] + nfree[1]
    n_unmapped = ulen[0] + ulen[1] + n_free
    need_rows = st[_N_BLOCKS] + 2 * n_free + n_unmapped + 8
    need_free = 2 * max(nfree[0], nfree[1]) + n_unmapped + 8
    return need_rows, need_free, n_unmapped + 4


@compiled(_nrt=False)  # allocates nothing: no reference counting (see replay_expandable)
def _replay_from(is_alloc: np.ndarray, keys: np.ndarray, n_bytes: np.ndarray, live: np.ndarray,
                 blocks: np.ndarray, spare: np.ndarray, fkey: np.ndarray, fblk: np.ndarray,
                 nfree: np.ndarray, ulist: np.ndarray, ulen: np.ndarray,
                 mapped_bytes: np.ndarray, todo: np.ndarray, st: np.ndarray, first: int,
                 capacity: int, out: np.ndarray) -> int:  # fmt: skip
    """Events ``first..`` until the end (its length returned), an event the tables may be too
    small for (its index returned, nothing of it done: the caller grows them and calls again
    from there), or an error (-1; ``out[0]`` and ``out[1]`` say which and where)."""
    allocated, peak_allocated = st[_ALLOCATED], st[_PEAK_ALLOCATED]
    n_ooms, first_oom = st[_N_OOMS], st[_FIRST_OOM]
    stopped = len(keys)
    for i in range(first, len(keys)):
        need_rows, need_free, need_unmapped = _need(st, nfree, ulen)
        if (need_rows > len(blocks) or need_free > fkey.shape[1]
                or need_unmapped > ulist.shape[1]):  # fmt: skip
            stopped = i
            break
        st[_EVENT] = i
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
            b = _get_free_block(blocks, fkey, fblk, nfree, p, size)
            if b == _NONE:
                b = _alloc_expandable(blocks, spare, fkey, fblk, nfree, ulist, ulen,
                                      mapped_bytes, st, p, size, capacity)  # fmt: skip
                if b == _NONE and capacity >= 0 and st[_STATUS] == OK:
                    _release_cached_blocks(blocks, spare, fkey, fblk, nfree, ulist, ulen,
                                           mapped_bytes, st, todo)  # fmt: skip
                    b = _alloc_expandable(blocks, spare, fkey, fblk, nfree, ulist, ulen,
                                          mapped_bytes, st, p, size, capacity)  # fmt: skip
            if st[_STATUS] != OK:
                out[0], out[1] = st[_STATUS], i
                return -1
            if b == _NONE:  # an OOM: nothing allocated
                n_ooms += 1
                if first_oom < 0:
                    first_oom = i
                live[k] = _FAILED
                continue
            remaining = blocks[b, _SIZE] - size
            if remaining >= _MIN_BLOCK:  # split: the rest is a free block after it
                rest = _new_row(blocks, spare, st, blocks[b, _ADDR] + size, remaining, p, 1)
                nxt = blocks[b, _NEXT]
                blocks[rest, _PREV], blocks[rest, _NEXT] = b, nxt
                if nxt != _NONE:
                    blocks[nxt, _PREV] = rest
                blocks[b, _NEXT] = rest
                blocks[b, _SIZE] = size
                _fl_insert(fkey, fblk, nfree, blocks, rest)
            blocks[b, _ALLOC] = 1
            live[k] = b
            allocated += blocks[b, _SIZE]
            if allocated > peak_allocated:
                peak_allocated = allocated
        else:
            b = live[k]
            if b == _NOT_LIVE:
                out[0], out[1] = KEY_NOT_LIVE, i
                return -1
            live[k] = _NOT_LIVE
            if b < 0:  # a zero-byte request, or one that failed: nothing to free
                continue
            allocated -= blocks[b, _SIZE]
            blocks[b, _ALLOC] = 0
            _merge(blocks, spare, fkey, fblk, nfree, ulist, ulen, st, b, blocks[b, _PREV])
            _merge(blocks, spare, fkey, fblk, nfree, ulist, ulen, st, b, blocks[b, _NEXT])
            _fl_insert(fkey, fblk, nfree, blocks, b)
            if st[_STATUS] != OK:
                out[0], out[1] = st[_STATUS], i
                return -1
    st[_ALLOCATED], st[_PEAK_ALLOCATED] = allocated, peak_allocated
    st[_N_OOMS], st[_FIRST_OOM] = n_ooms, first_oom
    return stopped


@compiled(inline="always")
def _get_free_block(blocks: np.ndarray, fkey: np.ndarray, fblk: np.ndarray, nfree: np.ndarray,
                    p: int, size: int) -> int:  # fmt: skip
    """Best fit by (size, offset), taken off the free list; a block that can grow into an
    unmapped range after it is taken last (the sim's ``_get_free_block``); or -1."""
    n = nfree[p]
    i = lower_bound(fkey[p], 0, n, free_key(size, 0))
    if i == n:
        return _NONE
    while i + 1 < n and _grow_size(blocks, fblk[p, i + 1]) < _grow_size(blocks, fblk[p, i]):
        i += 1
    b = fblk[p, i]
    _fl_delete_at(fkey, fblk, nfree, p, i)
    return b


@compiled(inline="always")
def _grow_size(blocks: np.ndarray, b: int) -> int:
    """The block's size with the unmapped range after it (the sim's ``_expandable_size``)."""
    nxt = blocks[b, _NEXT]
    if nxt != _NONE and blocks[nxt, _MAPPED] == 0:
        return blocks[b, _SIZE] + blocks[nxt, _SIZE]
    return blocks[b, _SIZE]
