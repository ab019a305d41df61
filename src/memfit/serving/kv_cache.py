"""vLLM's KV cache config: blocks, tokens and maximum concurrency from the bytes left for it.

As ``vllm/v1/core/kv_cache_utils.py`` computes them. Layers are grouped by kind (the hybrid KV
cache manager) when the model mixes full and sliding-window layers (vLLM 0.10+; earlier versions
size sliding layers as full attention): every group holds ``group_size`` layers — the smallest
kind's count (Gemma-3-4B's 5 full layers: its 29 sliding ones form 6 groups, padded), or the largest
when the counts are close (gpt-oss: 12 + 12) — and the pool is ``group_size`` tensors of
``num_blocks`` pages that every group shares, so ``num_blocks = available // (page_bytes x
group_size)``. A request of ``max_model_len`` tokens needs ``cdiv(L, block_size)`` blocks in a
full group and ``cdiv(min(window - 1 + max_num_batched_tokens, L), block_size) + 1`` in a sliding
one (``SlidingWindowSpec.
max_memory_usage_bytes``); MLA layers keep one latent vector per token (``MLAAttentionSpec``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from memfit.serving.layout import LayerKV

__all__ = ["KVPlan", "plan_kv"]


@dataclass(frozen=True, kw_only=True)
class KVPlan:
    """The KV cache vLLM allocates from ``available_bytes`` (negative: none)."""

    available_bytes: int
    page_bytes: int  # one block of one layer
    group_size: int  # layers per group (the pool's tensor count)
    n_groups: int
    num_blocks: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    blocks_per_request: int  # for one max_model_len request, all groups together
    max_concurrency: float
    needed_bytes: int  # KV bytes one max_model_len request needs
    kinds: tuple[str, ...]


#: ``_get_kv_cache_groups_uniform_page_size`` (vllm/v1/core/kv_cache_utils.py): the group size
#: is the smallest layer count of the kinds, or the largest when it is below this many times the
#: smallest (the default; per release in memfit.serving.vllm_matrix: 1.5 from 0.18, 1.25 in
#: 0.12-0.17, none in 0.11).
GROUP_SIZE_RATIO = 1.5


def _groups(
    layers: list[LayerKV], hybrid: bool, ratio: float = GROUP_SIZE_RATIO
) -> tuple[dict[str, int], int]:
    """(number of KV groups per layer kind, layers per group)."""
    kinds = Counter("full" if (x.kind == "sliding" and not hybrid) else x.kind for x in layers)
    if not (hybrid and len(kinds) > 1):
        return {next(iter(kinds)) if len(kinds) == 1 else "full": 1}, len(layers)
    smallest, largest = min(kinds.values()), max(kinds.values())
    size = largest if largest < smallest * ratio else smallest
    return {kind: -(-n // size) for kind, n in kinds.items()}, size


def _tokens_needed(kind: str, window: int | None, max_model_len: int, batched: int) -> int:
    if kind == "sliding" and window is not None:
        return min(window - 1 + batched, max_model_len)
    return max_model_len


def plan_kv(
    layers: list[LayerKV],
    *,
    available_bytes: int,
    block_size: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    hybrid_allocator: bool,
    tokens_from_concurrency: bool,
    group_ratio: float = GROUP_SIZE_RATIO,
) -> KVPlan:
    """The KV cache config for ``layers`` (one rank) in ``available_bytes``."""
    groups, group_size = _groups(layers, hybrid_allocator, group_ratio)
    n_groups = sum(groups.values())
    page = block_size * max(x.bytes_per_token for x in layers)
    window = next((x.window for x in layers if x.window is not None), None)
    num_blocks = max(0, available_bytes // (page * group_size)) if available_bytes > 0 else 0
    per_request = 0
    needed = 0
    for kind, n_kind_groups in groups.items():
        tokens = _tokens_needed(kind, window, max_model_len, max_num_batched_tokens)
        blocks = -(-tokens // block_size) + (1 if kind == "sliding" else 0)
        per_request += blocks * n_kind_groups
        needed += blocks * page * n_kind_groups * group_size
    # Per-request blocks of the pool: every group's blocks come from the same pool.
    concurrency = num_blocks / per_request if per_request else 0.0
    if tokens_from_concurrency:
        tokens = num_blocks * max_model_len // per_request if per_request else 0
    else:
        tokens = num_blocks // n_groups * block_size
    return KVPlan(
        available_bytes=available_bytes,
        page_bytes=page,
        group_size=group_size,
        n_groups=n_groups,
        num_blocks=num_blocks,
        kv_cache_bytes=num_blocks * page * group_size,
        kv_cache_tokens=tokens,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        needed_bytes=needed,
        kinds=tuple(groups),
    )


def largest_max_model_len(
    layers: list[LayerKV],
    *,
    available_bytes: int,
    block_size: int,
    max_num_batched_tokens: int,
    hybrid_allocator: bool,
    upper: int,
    group_ratio: float = GROUP_SIZE_RATIO,
) -> int:
    """The largest max_model_len whose one request fits ``available_bytes`` (vLLM's
    ``estimate_max_model_len``, a binary search on ``max_memory_usage_bytes``); 0 if none."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        plan = plan_kv(
            layers,
            available_bytes=available_bytes,
            block_size=block_size,
            max_model_len=mid,
            max_num_batched_tokens=max_num_batched_tokens,
            hybrid_allocator=hybrid_allocator,
            tokens_from_concurrency=False,
            group_ratio=group_ratio,
        )
        if plan.needed_bytes <= available_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo
