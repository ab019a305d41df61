"""A replay of PyTorch's CUDA caching allocator: from an alloc/free event list to reserved bytes.

A dispatch-level trace sees tensor storages (``memory_allocated``); the GPU sees what the caching
allocator has taken from the driver (``memory_reserved``), which is larger because requests are
rounded, packed into segments and cached. This module replays the events through the allocator's
rules to get the reserved peak, without torch and without a GPU.

Source: ``c10/cuda/CUDACachingAllocator.cpp`` in pytorch/pytorch (read on main, 2025;
``DeviceCachingAllocator::malloc``, ``round_size``, ``get_allocation_size``, ``get_free_block``,
``should_split``, ``free_block``, ``try_merge_blocks``, ``alloc_block``,
``release_available_cached_blocks``, ``release_cached_blocks``, ``try_allocate_expandable_block``,
``map_block``, ``unmap_block``). Default configuration, one stream, no CUDA graphs:

- ``round_size``: below 512 B a request becomes 512 B, otherwise it is rounded up to a multiple of
  512 B (``roundup_power2_divisions`` is off by default, so no power-of-two rounding).
- Requests of at most 1 MiB use the small pool, larger ones the large pool; the pools never share.
- A new segment (one ``cudaMalloc``) is 2 MiB for the small pool, 20 MiB for requests between 1 and
  10 MiB, and the request rounded up to 2 MiB from 10 MiB on.
- Best fit: the free block of the pool with the smallest (size, address) not below the request.
- Split: the remainder becomes a free block if it is at least 512 B (small pool) or more than 1 MiB
  (large pool, and only for requests below ``max_split_size``, which is unlimited by default).
  An unsplit remainder stays inside the block and counts as allocated, as in torch's stats.
- ``max_split_size`` (``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb``): free blocks at or above it
  are not handed to smaller requests and are used for larger ones only within 20 MiB of the size.
- Free: the block merges with free neighbours of its own segment and returns to its pool.
  Segments are never given back, except when a new segment does not fit: then the allocator
  frees cached oversize blocks (only with ``max_split_size``), retries, frees every free block that
  is a whole segment, and retries once more; if that fails too it is an out-of-memory error.
  Here ``capacity_bytes`` plays the driver's role, checked like ``set_per_process_memory_fraction``
  (reserved + new segment > capacity fails). A failed request is counted in ``n_ooms`` and not
  allocated, as in torch after it raises; a later free of its key is ignored.
- ``expandable_segments=True``: one segment per pool that grows by mapping pages at its end (2 MiB
  pages for the small pool, 20 MiB for the large one); blocks inside split at 512 B. The model
  follows the source: a free block that ends at the unmapped tail is chosen last, and an OOM
  unmaps the whole free pages inside free blocks. With a capacity, both torch's check (reserved +
  segment size, as under a memory fraction) and the physical one (reserved + pages to map) apply.

Checked on an H200 (torch 2.11.0+cu130, driver 580.159.04) against ``torch.cuda.memory_stats``
after replaying the same random events (20k-100k events, 16 B to 256 MiB) with real tensors:
default, small-only, large-only and expandable runs, with and without a memory fraction, gave
identical peak allocated, peak reserved, final reserved, OOM count and event of the peak. Two
runs differ slightly after OOM releases (final reserved by one 2 MiB segment; with
``max_split_size_mb:64``, 1861 OOMs against 1902): best fit breaks ties between equal-size
blocks by address, and the driver places new segments at addresses this model does not predict
(ours only increase). Fed the driver's own segment addresses, the replay matched torch exactly
in those runs too.

Not modelled: several streams (``record_stream``), CUDA graph pools,
``garbage_collection_threshold`` and ``roundup_power2_divisions``; zero-byte requests allocate
nothing, as in torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from memfit.errors import SpecError

# The allocator's own constants and size rules: one place for this replay and for the serving
# models' load replays (memfit.hardware.cuda_allocator)
from memfit.hardware.cuda_allocator import (
    LARGE_BUFFER_BYTES,
    MIN_BLOCK_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
    round_size,
    segment_size,
)

_KEY_SHIFT = 64  # free-list key = size << 64 | address: one int sorts by (size, address)
_ADDR_MASK = (1 << _KEY_SHIFT) - 1
# Expandable segments reserve address space, not memory; torch takes 1.125 x the GPU's memory.
# Any size far above a real GPU behaves the same here.
_EXPANDABLE_ADDRESS_SPACE_BYTES = 1 << 50


@dataclass(frozen=True, kw_only=True)
class AllocatorResult:
    """What a replay gives. ``*_at_event`` count malloc and free calls from 0.

    ``peak_allocated_bytes`` sums block sizes (rounded, unsplit remainders included), as
    ``torch.cuda.max_memory_allocated`` does; ``peak_reserved_bytes`` is
    ``torch.cuda.max_memory_reserved``. ``n_segments`` is the number of ``cudaMalloc`` segments
    held at the end (with expandable segments: the pools holding mapped pages).
    ``peak_reserved_at_event`` is the first event after which reserved stood at its peak (0 when
    nothing was reserved); ``first_oom_at_event`` is None when no request failed.
    """

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    final_reserved_bytes: int
    n_segments: int
    n_ooms: int
    peak_reserved_at_event: int
    first_oom_at_event: int | None = None

    @classmethod
    def unbounded(
        cls, *, peak_allocated: int, reserved: int, n_segments: int, peak_at: int
    ) -> AllocatorResult:
        """A default-configuration replay's result: no capacity, so no request fails and no
        segment is released (the final reserved bytes are the peak)."""
        return cls(
            peak_allocated_bytes=peak_allocated,
            peak_reserved_bytes=reserved,
            final_reserved_bytes=reserved,
            n_segments=n_segments,
            n_ooms=0,
            peak_reserved_at_event=peak_at,
            first_oom_at_event=None,
        )


class _Block:
    __slots__ = ("addr", "size", "allocated", "mapped", "prev", "next", "pool")

    def __init__(self, addr: int, size: int, pool: _Pool, *, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.pool = pool


class _Pool:
    """Free blocks of one pool: sorted keys (size << 64 | addr) and the blocks by address."""

    __slots__ = ("is_small", "keys", "by_addr", "page_bytes", "base", "unmapped", "mapped_bytes")

    def __init__(self, *, is_small: bool, base: int) -> None:
        self.is_small = is_small
        self.keys: list[int] = []
        self.by_addr: dict[int, _Block] = {}
        self.page_bytes = SMALL_BUFFER_BYTES if is_small else LARGE_BUFFER_BYTES
        self.base = base  # start of this pool's expandable segment
        self.unmapped: dict[int, _Block] = {}  # expandable only: unmapped ranges by address
        self.mapped_bytes = 0

    def insert(self, block: _Block) -> None:
        bisect.insort(self.keys, (block.size << _KEY_SHIFT) | block.addr)
        self.by_addr[block.addr] = block

    def remove(self, block: _Block) -> None:
        keys = self.keys
        del keys[bisect.bisect_left(keys, (block.size << _KEY_SHIFT) | block.addr)]
        del self.by_addr[block.addr]

    def block_at(self, index: int) -> _Block:
        return self.by_addr[self.keys[index] & _ADDR_MASK]


def _expandable_size(block: _Block) -> int:
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


class CachingAllocatorSim:
    """Replays ``malloc(key, n_bytes)`` / ``free(key)`` calls; ``result()`` gives the peaks.

    ``capacity_bytes``: memory the allocator may reserve (the GPU's free memory, or
    ``set_per_process_memory_fraction``); None means unlimited. ``max_split_size_bytes`` mirrors
    ``max_split_size_mb`` (None: unlimited, torch's default; torch requires more than 20 MiB).
    """

    def __init__(
        self,
        *,
        capacity_bytes: int | None = None,
        expandable_segments: bool = False,
        max_split_size_bytes: int | None = None,
    ) -> None:
        problems = []
        if capacity_bytes is not None and capacity_bytes < 0:
            problems.append(f"capacity_bytes ({capacity_bytes}) must be >= 0 or None (unlimited)")
        if max_split_size_bytes is not None and max_split_size_bytes <= LARGE_BUFFER_BYTES:
            problems.append(
                f"max_split_size_bytes ({max_split_size_bytes}) must be > {LARGE_BUFFER_BYTES} "
                "(20 MiB, torch's lower bound for max_split_size_mb) or None (unlimited)"
            )
        if problems:
            raise SpecError.from_problems(problems)
        self._capacity = capacity_bytes
        self._expandable = expandable_segments
        self._max_split = max_split_size_bytes
        self._small = _Pool(is_small=True, base=1 << 60)
        self._large = _Pool(is_small=False, base=2 << 60)
        self._live: dict[int, _Block | None] = {}
        self._failed: set[int] = set()
        self._next_addr = 0
        self._event = 0
        self._allocated = self._reserved = self._n_segments = self._n_ooms = 0
        self._peak_allocated = self._peak_reserved = self._peak_reserved_at = 0
        self._first_oom_at: int | None = None

    @property
    def allocated_bytes(self) -> int:
        """Bytes in allocated blocks now (``torch.cuda.memory_allocated``)."""
        return self._allocated

    @property
    def reserved_bytes(self) -> int:
        """Bytes held from the driver now (``torch.cuda.memory_reserved``)."""
        return self._reserved

    def malloc(self, key: int, n_bytes: int) -> None:
        """Allocate ``n_bytes`` under ``key`` (a storage id; it must not be live)."""
        if key in self._live:
            raise SpecError(
                f"malloc of key {key} at event {self._event}: the key is still allocated; "
                "free it first or give each live storage its own key"
            )
        size = round_size(n_bytes)
        event = self._event
        self._event += 1
        self._failed.discard(key)
        if n_bytes == 0:
            self._live[key] = None
            return
        pool = self._small if size <= SMALL_SIZE_BYTES else self._large
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._new_block(pool, size)
        if block is None:
            self._n_ooms += 1
            self._failed.add(key)
            if self._first_oom_at is None:
                self._first_oom_at = event
            return
        self._take(block, size)
        self._live[key] = block
        self._allocated += block.size
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated

    def free(self, key: int) -> None:
        """Free the allocation made under ``key``."""
        self._event += 1
        try:
            block = self._live.pop(key)
        except KeyError:
            if key in self._failed:
                self._failed.discard(key)
                return
            raise SpecError(
                f"free of key {key} at event {self._event - 1}: the key is not allocated "
                "(freed twice, or never allocated); check the event list"
            ) from None
        if block is None:
            return
        self._allocated -= block.size
        block.allocated = False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        block.pool.insert(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: give every free whole segment back to the driver."""
        self._release_cached_blocks()

    def result(self) -> AllocatorResult:
        """The peaks so far (the replay can continue afterwards)."""
        if self._expandable:
            n_segments = sum(1 for pool in (self._small, self._large) if pool.mapped_bytes > 0)
        else:
            n_segments = self._n_segments
        return AllocatorResult(
            peak_allocated_bytes=self._peak_allocated,
            peak_reserved_bytes=self._peak_reserved,
            final_reserved_bytes=self._reserved,
            n_segments=n_segments,
            n_ooms=self._n_ooms,
            peak_reserved_at_event=self._peak_reserved_at,
            first_oom_at_event=self._first_oom_at,
        )

    # -- finding and splitting blocks ---------------------------------------------------------

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        """Best fit by (size, address), with the expandable and max_split_size rules."""
        keys = pool.keys
        i = bisect.bisect_left(keys, size << _KEY_SHIFT)
        if i == len(keys):
            return None
        if self._expandable:  # a block that can grow into the unmapped tail is taken last
            while i + 1 < len(keys) and _expandable_size(pool.block_at(i + 1)) < _expandable_size(
                pool.block_at(i)
            ):
                i += 1
        found = keys[i] >> _KEY_SHIFT
        limit = self._max_split
        if limit is not None and (
            (size < limit and found >= limit)
            or (size >= limit and found >= size + LARGE_BUFFER_BYTES)
        ):
            return None
        block = pool.by_addr.pop(keys.pop(i) & _ADDR_MASK)
        return block

    def _take(self, block: _Block, size: int) -> None:
        """Mark ``block`` allocated, splitting off a free remainder when torch would."""
        remaining = block.size - size
        if block.pool.is_small or self._expandable:
            split = remaining >= MIN_BLOCK_BYTES
        else:
            split = remaining > SMALL_SIZE_BYTES and (
                self._max_split is None or size < self._max_split
            )
        if split:
            rest = _Block(block.addr + size, remaining, block.pool)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            block.pool.insert(rest)
        block.allocated = True

    def _merge(self, dst: _Block, src: _Block | None) -> None:
        """Absorb ``src`` into ``dst`` when it is a free neighbour of the same mapping state."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            src.pool.remove(src)
        else:
            del src.pool.unmapped[src.addr]
        if src is dst.prev:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- new memory and the out-of-memory path --------------------------------------------------

    def _new_block(self, pool: _Pool, size: int) -> _Block | None:
        """``alloc_block``, then the two release-and-retry steps of ``malloc``."""
        block = self._alloc_block(pool, size)
        if block is None and self._release_oversize_blocks(pool, size):
            block = self._alloc_block(pool, size)
        if block is None and self._capacity is not None:
            self._release_cached_blocks()
            block = self._alloc_block(pool, size)
        return block

    def _alloc_block(self, pool: _Pool, size: int) -> _Block | None:
        seg_bytes = segment_size(size)
        if self._capacity is not None and self._reserved + seg_bytes > self._capacity:
            return None
        if self._expandable:
            return self._alloc_expandable(pool, size)
        block = _Block(self._next_addr, seg_bytes, pool)
        self._next_addr += seg_bytes
        self._n_segments += 1
        self._grow_reserved(seg_bytes)
        return block

    def _grow_reserved(self, n_bytes: int) -> None:
        self._reserved += n_bytes
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved
            self._peak_reserved_at = self._event - 1

    def _release_segment(self, block: _Block) -> None:
        block.pool.remove(block)
        self._reserved -= block.size
        self._n_segments -= 1

    def _release_oversize_blocks(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks``: only with max_split_size set."""
        limit = self._max_split
        if limit is None or self._expandable or self._capacity is None:
            return False
        target = max(size, limit)
        keys = pool.keys
        i = bisect.bisect_left(keys, target << _KEY_SHIFT)
        if i < len(keys):
            self._release_segment(pool.block_at(i))
            return True
        released = 0
        while keys and released < target and (keys[-1] >> _KEY_SHIFT) >= limit:
            block = pool.block_at(len(keys) - 1)
            released += block.size
            self._release_segment(block)
        return released >= target

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks``: free whole free segments (or unmap free pages)."""
        for pool in (self._large, self._small):
            free_blocks = list(pool.by_addr.values())
            for block in free_blocks:
                if self._expandable:
                    self._unmap_block(block)
                elif block.prev is None and block.next is None:
                    self._release_segment(block)

    # -- expandable segments --------------------------------------------------------------------

    def _alloc_expandable(self, pool: _Pool, size: int) -> _Block | None:
        """``try_allocate_expandable_block``: map pages until a free run covers ``size``."""
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None  # the unmapped tail is effectively endless
            if not self._map_block(nxt, min(size - candidate.size, nxt.size)):
                return None
            candidate = nxt
        candidate.pool.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """Lowest unmapped range (with a free block just before it) that can hold ``size``."""
        if not pool.unmapped and pool.mapped_bytes == 0:
            block = _Block(pool.base, _EXPANDABLE_ADDRESS_SPACE_BYTES, pool, mapped=False)
            pool.unmapped[block.addr] = block
        for addr in sorted(pool.unmapped):
            start = pool.unmapped[addr]
            if start.prev is not None and not start.prev.allocated:
                start = start.prev
            run = 0
            walker: _Block | None = start
            while walker is not None and run < size and not walker.allocated:
                run += walker.size
                walker = walker.next
            if run >= size:
                return start
        raise AssertionError("expandable segment address space exhausted")  # pragma: no cover

    def _map_block(self, block: _Block, n_bytes: int) -> bool:
        """Map the pages covering the first ``n_bytes`` of an unmapped range."""
        page = block.pool.page_bytes
        offset = block.addr - block.pool.base
        mapped = -(-(offset + n_bytes) // page) * page - offset
        if self._capacity is not None and self._reserved + mapped > self._capacity:
            return False
        pool = block.pool
        del pool.unmapped[block.addr]
        if mapped < block.size:
            rest = _Block(block.addr + mapped, block.size - mapped, pool, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            pool.unmapped[rest.addr] = rest
        block.mapped = True
        self._merge(block, block.prev)
        self._merge(block, block.next)
        pool.insert(block)
        pool.mapped_bytes += mapped
        self._grow_reserved(mapped)
        return True

    def _unmap_block(self, block: _Block) -> None:
        """``unmap_block``: give back the whole pages inside a free block."""
        pool = block.pool
        page = pool.page_bytes
        first = -(-(block.addr - pool.base) // page) * page + pool.base
        end = (block.addr + block.size - pool.base) // page * page + pool.base
        if first >= end:
            return
        pool.remove(block)
        if first > block.addr:
            self._splice_free(pool, block.addr, first - block.addr, before=block)
        if block.addr + block.size > end:
            self._splice_free(pool, end, block.addr + block.size - end, after=block)
        block.addr, block.size, block.mapped = first, end - first, False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        pool.unmapped[block.addr] = block
        pool.mapped_bytes -= end - first
        self._reserved -= end - first

    def _splice_free(
        self,
        pool: _Pool,
        addr: int,
        size: int,
        *,
        before: _Block | None = None,
        after: _Block | None = None,
    ) -> None:
        piece = _Block(addr, size, pool)
        if before is not None:
            piece.prev, piece.next = before.prev, before
            if before.prev is not None:
                before.prev.next = piece
            before.prev = piece
        elif after is not None:
            piece.prev, piece.next = after, after.next
            if after.next is not None:
                after.next.prev = piece
            after.next = piece
        pool.insert(piece)


def simulate(
    events: Iterable[tuple[str, int, int]],
    *,
    capacity_bytes: int | None = None,
    expandable_segments: bool = False,
    max_split_size_bytes: int | None = None,
) -> AllocatorResult:
    """Replay ``("a", key, n_bytes)`` / ``("f", key, 0)`` events through the allocator.

    The keyword arguments are those of :class:`CachingAllocatorSim`. The default configuration
    (all three unset) runs :func:`memfit.estimate.allocator.fast.simulate_default`, the
    same rules in one faster loop.
    """
    if capacity_bytes is None and not expandable_segments and max_split_size_bytes is None:
        from memfit.estimate.allocator.fast import simulate_default

        return simulate_default(events)
    sim = CachingAllocatorSim(
        capacity_bytes=capacity_bytes,
        expandable_segments=expandable_segments,
        max_split_size_bytes=max_split_size_bytes,
    )
    malloc, free = sim.malloc, sim.free
    for index, event in enumerate(events):
        kind = event[0]
        if kind == "a":
            malloc(event[1], event[2])
        elif kind == "f":  # ("f", key) without the size is accepted too
            free(event[1])
        else:
            raise SpecError(
                f"event {index} has kind {kind!r}: use 'a' (allocate) or 'f' (free), "
                "as in ('a', key, n_bytes) / ('f', key, 0)"
            )
    return sim.result()
