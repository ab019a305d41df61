"""PyTorch's CUDA caching allocator's size rules, as constants and two functions (torch-free).

Read in ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch main, 2025; their names in
brackets): how a request is rounded (``round_size``) and how large a new segment is
(``get_allocation_size``). One place for both users: the full replay of the allocator
(:mod:`memfit.estimate.allocator.caching`) and the serving start-up models that replay a model's
load (:mod:`memfit.serving.sglang_load`), which sit below the estimate layer.
"""

from __future__ import annotations

from memfit.errors import SpecError
from memfit.units import MiB

__all__ = [
    "LARGE_BUFFER_BYTES",
    "MIN_BLOCK_BYTES",
    "MIN_LARGE_ALLOC_BYTES",
    "ROUND_LARGE_BYTES",
    "SMALL_BUFFER_BYTES",
    "SMALL_SIZE_BYTES",
    "round_size",
    "segment_size",
]

MIN_BLOCK_BYTES = 512  # [kMinBlockSize] every size is rounded up to a multiple of this
SMALL_SIZE_BYTES = 1 * MiB  # [kSmallSize] largest request served by the small pool
SMALL_BUFFER_BYTES = 2 * MiB  # [kSmallBuffer] small-pool segment; small expandable page
LARGE_BUFFER_BYTES = 20 * MiB  # [kLargeBuffer] segment for 1-10 MiB requests; large expandable page
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # [kMinLargeAlloc] from here on a request gets its own segment
ROUND_LARGE_BYTES = 2 * MiB  # [kRoundLarge] own segments are rounded up to this


def round_size(n_bytes: int) -> int:
    """The block size the caching allocator uses for a request of ``n_bytes`` (``round_size``)."""
    if n_bytes < 0:
        raise SpecError(f"allocation size ({n_bytes}) must be >= 0 bytes")
    if n_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-n_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(rounded_bytes: int) -> int:
    """Size of the ``cudaMalloc`` made for a rounded request (``get_allocation_size``)."""
    if rounded_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if rounded_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-rounded_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
