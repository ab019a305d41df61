"""The caching-allocator replay follows c10/cuda/CUDACachingAllocator.cpp.

Expected numbers are worked out from the allocator's rules by hand; the randomized replay at the
end checks the bookkeeping invariants instead. (On an H200 with torch 2.11, replays of 100k random
events gave the same peak allocated, peak reserved, final reserved and segment count as torch.)
"""

from __future__ import annotations

import random

import pytest

from memfit.errors import SpecError
from memfit.estimate.allocator.caching import (
    AllocatorResult,
    CachingAllocatorSim,
    round_size,
    segment_size,
    simulate,
)
from memfit.units import KiB, MiB


def _free_bytes(sim: CachingAllocatorSim) -> int:
    pools = (sim._small, sim._large)
    return sum(block.size for pool in pools for block in pool.by_addr.values())


def test_round_size_uses_512_byte_minimum_and_multiples():
    assert round_size(0) == 512
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(1000 * KiB + 1) == 1000 * KiB + 512


def test_round_size_rejects_negative_sizes():
    with pytest.raises(SpecError, match=r"allocation size \(-1\) must be >= 0"):
        round_size(-1)


def test_segment_size_follows_the_small_medium_and_large_rules():
    assert segment_size(512) == 2 * MiB
    assert segment_size(1 * MiB) == 2 * MiB
    assert segment_size(1 * MiB + 512) == 20 * MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(11 * MiB) == 12 * MiB


def test_freed_block_is_reused_so_reserved_does_not_grow():
    result = simulate([("a", 1, 30 * MiB), ("f", 1, 0), ("a", 2, 30 * MiB), ("f", 2, 0)])
    assert result.peak_reserved_bytes == 30 * MiB
    assert result.n_segments == 1


def test_small_and_large_pools_never_share_a_segment():
    sim = CachingAllocatorSim()
    sim.malloc(1, 512 * KiB)  # small pool: a 2 MiB segment
    sim.free(1)
    sim.malloc(2, 2 * MiB)  # large pool: the free 2 MiB small block is not eligible
    assert sim.reserved_bytes == 2 * MiB + 20 * MiB
    sim.free(2)
    sim.malloc(3, 1 * MiB)  # small again: fits the cached small segment, no new memory
    assert sim.reserved_bytes == 22 * MiB
    assert sim.result().n_segments == 2


def test_five_mib_request_gets_a_20_mib_segment_that_a_second_one_splits():
    sim = CachingAllocatorSim()
    sim.malloc(1, 5 * MiB)
    assert (sim.reserved_bytes, sim.allocated_bytes) == (20 * MiB, 5 * MiB)
    sim.malloc(2, 5 * MiB)
    assert (sim.reserved_bytes, sim.allocated_bytes) == (20 * MiB, 10 * MiB)
    assert sim.result().n_segments == 1


def test_large_requests_round_up_to_2_mib_and_keep_a_remainder_under_1_mib():
    sim = CachingAllocatorSim()
    sim.malloc(1, 11 * MiB)  # 12 MiB segment; the 1 MiB remainder is not > 1 MiB: not split
    assert sim.reserved_bytes == 12 * MiB
    assert sim.allocated_bytes == 12 * MiB
    sim.malloc(2, 10 * MiB + 512)  # 12 MiB segment, 1.5 MiB remainder is split off
    assert sim.reserved_bytes == 24 * MiB
    assert sim.allocated_bytes == 12 * MiB + 10 * MiB + 512


def test_small_pool_splits_remainders_of_512_bytes():
    sim = CachingAllocatorSim()
    sim.malloc(1, 1 * MiB)
    sim.malloc(2, 1 * MiB - 512)  # the 512 B left over is still split off
    sim.malloc(3, 512)  # and serves this request
    assert sim.reserved_bytes == 2 * MiB
    assert sim.allocated_bytes == 2 * MiB


def test_best_fit_prefers_the_smallest_free_block():
    sim = CachingAllocatorSim()
    for key, size in ((1, 40 * MiB), (2, 30 * MiB), (3, 12 * MiB)):
        sim.malloc(key, size)
    sim.free(1)
    sim.free(2)
    sim.malloc(4, 25 * MiB)  # takes the 30 MiB block, leaving the 40 MiB one whole
    sim.malloc(5, 40 * MiB)
    assert sim.reserved_bytes == 82 * MiB


def test_fragmentation_leaves_reserved_above_allocated():
    # Three 12 MiB tensors in their own segments; freeing the outer two cannot serve a 20 MiB one.
    events = [("a", 1, 12 * MiB), ("a", 2, 12 * MiB), ("a", 3, 12 * MiB)]
    events += [("f", 1, 0), ("f", 3, 0), ("a", 4, 20 * MiB)]
    result = simulate(events)
    assert result.peak_reserved_bytes == 56 * MiB
    assert result.peak_allocated_bytes == 36 * MiB
    assert result.peak_reserved_bytes > result.peak_allocated_bytes


def test_freed_neighbours_merge_back_into_one_block():
    sim = CachingAllocatorSim()
    for key in (1, 2, 3, 4):  # four 5 MiB blocks split from one 20 MiB segment
        sim.malloc(key, 5 * MiB)
    for key in (2, 1, 4, 3):  # out of order: merges happen on both sides
        sim.free(key)
    sim.malloc(5, 20 * MiB)  # needs the whole segment back in one piece
    assert sim.reserved_bytes == 20 * MiB
    assert sim.result().n_segments == 1


def test_unmerged_neighbours_are_not_reused_for_a_larger_request():
    sim = CachingAllocatorSim()
    for key in (1, 2, 3):
        sim.malloc(key, 5 * MiB)
    sim.free(1)
    sim.free(3)  # 5 MiB + 10 MiB free, separated by block 2
    sim.malloc(4, 12 * MiB)
    assert sim.reserved_bytes == 20 * MiB + 12 * MiB


def test_oom_releases_cached_segments_and_retries():
    sim = CachingAllocatorSim(capacity_bytes=64 * MiB)
    sim.malloc(1, 40 * MiB)
    sim.free(1)  # a cached, unsplit 40 MiB segment
    sim.malloc(2, 50 * MiB)  # 40 + 50 > 64: release the cached segment, then it fits
    result = sim.result()
    assert (result.n_ooms, result.final_reserved_bytes, result.n_segments) == (0, 50 * MiB, 1)


def test_oom_that_release_cannot_fix_is_recorded_not_raised():
    sim = CachingAllocatorSim(capacity_bytes=64 * MiB)
    sim.malloc(1, 40 * MiB)
    sim.malloc(2, 30 * MiB)  # 40 MiB live: nothing cached to release
    sim.free(2)  # freeing the failed allocation is ignored, as in torch after the OOM
    result = sim.result()
    assert result.n_ooms == 1
    assert result.first_oom_at_event == 1
    assert result.peak_reserved_bytes == 40 * MiB
    assert sim.allocated_bytes == 40 * MiB


def test_oom_release_keeps_segments_that_are_partly_in_use():
    sim = CachingAllocatorSim(capacity_bytes=40 * MiB)
    sim.malloc(1, 5 * MiB)  # 20 MiB segment, split
    sim.malloc(2, 5 * MiB)
    sim.free(2)  # segment still holds block 1, so it cannot be released
    sim.malloc(3, 22 * MiB)  # 20 + 22 > 40
    assert sim.result().n_ooms == 1
    assert sim.reserved_bytes == 20 * MiB


def test_max_split_size_keeps_oversize_blocks_for_similar_requests():
    sim = CachingAllocatorSim(max_split_size_bytes=64 * MiB)
    sim.malloc(1, 100 * MiB)
    sim.free(1)
    sim.malloc(2, 30 * MiB)  # below max_split_size: may not take the 100 MiB block
    assert sim.reserved_bytes == 130 * MiB
    sim.malloc(3, 90 * MiB)  # above it and within 20 MiB of 100 MiB: reuses it whole
    assert sim.reserved_bytes == 130 * MiB
    assert sim.allocated_bytes == 130 * MiB


def test_max_split_size_must_exceed_20_mib():
    with pytest.raises(SpecError, match=r"max_split_size_bytes \(1048576\) must be > 20971520"):
        CachingAllocatorSim(max_split_size_bytes=1 * MiB)


def test_expandable_segments_pack_tensors_into_20_mib_pages():
    events = [("a", key, 12 * MiB) for key in range(5)]
    assert simulate(events).peak_reserved_bytes == 60 * MiB
    assert simulate(events, expandable_segments=True).peak_reserved_bytes == 60 * MiB
    events = [("a", key, 11 * MiB) for key in range(5)]
    assert simulate(events).peak_reserved_bytes == 60 * MiB  # 5 segments of 12 MiB
    assert simulate(events, expandable_segments=True).peak_reserved_bytes == 60 * MiB  # 55 -> 60


def test_expandable_segments_merge_freed_neighbours_that_segments_keep_apart():
    events = [("a", 1, 12 * MiB), ("a", 2, 12 * MiB), ("f", 1, 0), ("f", 2, 0)]
    events += [("a", 3, 20 * MiB)]
    assert simulate(events).peak_reserved_bytes == 12 * MiB + 12 * MiB + 20 * MiB
    result = simulate(events, expandable_segments=True)
    assert result.peak_reserved_bytes == 40 * MiB  # two 20 MiB pages hold all three in turn
    assert result.n_segments == 1


def test_expandable_oom_unmaps_free_pages_and_retries():
    sim = CachingAllocatorSim(capacity_bytes=64 * MiB, expandable_segments=True)
    sim.malloc(1, 40 * MiB)  # two 20 MiB pages
    sim.free(1)
    sim.malloc(2, 1 * MiB)  # small pool: one 2 MiB page
    sim.malloc(3, 30 * MiB)  # fits the 40 MiB of free large pages
    assert sim.reserved_bytes == 42 * MiB
    sim.free(3)
    sim.malloc(4, 50 * MiB)  # 42 + 50 > 64: unmap the free large pages, then map three pages
    result = sim.result()
    assert result.n_ooms == 0
    assert result.final_reserved_bytes == 2 * MiB + 60 * MiB


def test_zero_byte_allocations_reserve_nothing():
    result = simulate([("a", 1, 0), ("f", 1, 0)])
    assert result == AllocatorResult(
        peak_allocated_bytes=0,
        peak_reserved_bytes=0,
        final_reserved_bytes=0,
        n_segments=0,
        n_ooms=0,
        peak_reserved_at_event=0,
    )


def test_peak_reserved_event_is_the_first_event_at_the_peak():
    events = [("a", 1, 1 * MiB), ("a", 2, 30 * MiB), ("f", 2, 0), ("a", 3, 30 * MiB)]
    assert simulate(events).peak_reserved_at_event == 1


def test_freeing_an_unknown_key_names_the_key_and_event():
    with pytest.raises(SpecError, match=r"free of key 7 at event 1: the key is not allocated"):
        simulate([("a", 1, 10), ("f", 7, 0)])


def test_allocating_a_live_key_twice_is_rejected():
    with pytest.raises(SpecError, match=r"malloc of key 1 at event 1: the key is still allocated"):
        simulate([("a", 1, 10), ("a", 1, 10)])


def test_unknown_event_kind_is_rejected_with_the_accepted_kinds():
    with pytest.raises(SpecError, match=r"event 0 has kind 'x': use 'a' \(allocate\) or 'f'"):
        simulate([("x", 1, 10)])


def test_negative_capacity_is_rejected():
    with pytest.raises(SpecError, match=r"capacity_bytes \(-1\) must be >= 0"):
        CachingAllocatorSim(capacity_bytes=-1)


@pytest.mark.parametrize("expandable", [False, True])
def test_random_replay_keeps_reserved_equal_to_allocated_plus_cached(expandable):
    rng = random.Random(7)
    sim = CachingAllocatorSim(expandable_segments=expandable)
    live: list[int] = []
    expected_allocated = 0
    sizes: dict[int, int] = {}
    for key in range(3000):
        if live and rng.random() < 0.45:
            victim = live.pop(rng.randrange(len(live)))
            sim.free(victim)
            expected_allocated -= sizes.pop(victim)
        else:
            before = sim.allocated_bytes
            sim.malloc(key, int(2 ** rng.uniform(6, 25)))
            sizes[key] = sim.allocated_bytes - before
            live.append(key)
            expected_allocated += sizes[key]
        assert sim.allocated_bytes == expected_allocated
        assert sim.reserved_bytes == sim.allocated_bytes + _free_bytes(sim)
    result = sim.result()
    assert result.peak_reserved_bytes >= result.final_reserved_bytes >= sim.allocated_bytes
    if not expandable:
        assert result.peak_reserved_bytes % (2 * MiB) == 0
