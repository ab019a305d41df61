"""vLLM 0.34's extensible KV cache: the cache sized from the memory free after warmup and CUDA
graph capture, the default on CUDA from 0.34.0.

Read in the v0.34.0 sdist (``vllm-0.34.0.tar.gz``, sha256 in
:data:`memfit.serving.vllm_matrix.SDIST_SHA256`):

1. ``vllm/config/vllm.py`` ``VllmConfig._resolve_extensible_kv_cache``: on where unset on CUDA
   (off with ``--kv-cache-memory-bytes``, ``num_gpu_blocks_override``, elastic EP, legacy-IPC KV
   connectors); ``vllm/config/cache.py`` ``CacheConfig.resolved_gpu_memory_utilization``: 1.0
   when ``--gpu-memory-utilization`` is unset, so ``requested = ceil(total x 1.0)``
   (``vllm/v1/worker/utils.py`` ``request_memory``, which skips the "Free memory on device ... is
   less than desired" check with the extensible cache).
2. ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``: the profile run as before;
   ``profile_cudagraph_memory`` returns 0 with the extensible cache (vllm/v1/worker/gpu/
   model_runner.py), so "Available KV cache memory" is ``requested - weights - non-torch -
   activation peak``: the *capacity* reserved as address space (``ExtensibleKVCache``), checked
   against one max_model_len request (``_check_enough_kv_cache_memory``).
3. ``compile_or_warm_up_model``: warmup, the sizing steps (``run_kv_cache_sizing_warmup``,
   vllm/v1/worker/gpu/warmup.py: a ``max_num_batched_tokens`` prefill, prompt logprobs in 1024-row
   chunks), CUDA graph capture with only the null block committed, then
   ``measure_kv_cache_blocks`` / ``measure_kv_cache_bytes`` (vllm/v1/worker/
   extensible_kv_cache.py)::

       non_kv_used = init_free - free - committed       # weights, non-torch, graphs
       headroom    = free + committed
       margin      = max(1 GiB, 0.75 x transient)       # KV_CACHE_MARGIN_FLOOR_BYTES / _FRACTION
       available   = min(requested - non_kv_used, headroom - margin) - max(transient, growth)

   ``transient`` is the profile's activation peak (``peak_activation_memory``, the CUDA graph
   estimate being 0) or the sizing steps' allocated peak if larger; ``growth`` is the largest
   growth of torch's reservation over a sizing step (fragmentation). Both are measured at
   start-up: memfit takes the profile peak for ``transient`` and cannot determine ``growth`` from
   the source (the output says so). The blocks are those whose physical pages fit
   (``ExtensibleKVCache.blocks_within``: each per-layer segment is committed in 2 MiB granules,
   ``vllm/utils/extensible_tensor.py`` ``_MIN_GRANULARITY``), at most the capacity; the final
   size is checked again against one max_model_len request (``shrink_kv_cache_configs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.units import GiB, MiB

__all__ = ["ExtensibleSizing", "size_extensible", "too_small_error"]

#: vllm/v1/worker/extensible_kv_cache.py (CUDA values; ROCm keeps 3 GiB / 1 GiB).
KV_CACHE_MARGIN_FLOOR_BYTES = 1 * GiB
KV_CACHE_MARGIN_FRACTION = 0.75
#: the commit granule: the driver's VMM granularity, floored at 2 MiB (extensible_tensor.py).
VMM_GRANULE_BYTES = 2 * MiB
#: blocks committed while graphs are captured and memory is measured: the null block
#: (``ExtensibleKVCache.min_committed_blocks``, 1 under layer-outermost layouts).
MIN_COMMITTED_BLOCKS = 1
#: "[not modelled]": what vLLM measures at start-up and its source does not determine.
NOT_MODELLED = "[not modelled]"


@dataclass(frozen=True, kw_only=True)
class ExtensibleSizing:
    """The figures of ``measure_kv_cache_blocks`` for one rank (bytes)."""

    capacity_bytes: int  # "Available KV cache memory": the reserved address space
    free_bytes: int  # free after warmup and capture, the null blocks committed
    committed_bytes: int
    transient_bytes: int  # kept free for activations (the profile's peak)
    margin_bytes: int
    requested_bytes: int
    available_bytes: int  # what the KV cache may occupy
    n_segments: int

    def blocks_within(self, bytes_per_block: int, capacity_blocks: int) -> int:
        """``ExtensibleKVCache.blocks_within``: the most blocks whose pages, each segment rounded
        up to the granule, fit in ``available_bytes``; at most the capacity."""
        if bytes_per_block <= 0 or self.available_bytes <= 0:
            return 0
        stride = bytes_per_block // self.n_segments  # one layer's block
        per_segment = self.available_bytes // (self.n_segments * VMM_GRANULE_BYTES)
        return max(0, min(per_segment * VMM_GRANULE_BYTES // stride, capacity_blocks))

    def log_line(self, num_blocks: int, bytes_per_block: int) -> str:
        """vLLM 0.34's "Memory after warmup" line (the parts measured at start-up that memfit
        cannot determine marked ``[not modelled]``)."""
        return (
            f"Memory after warmup: {_gib(self.free_bytes)} GiB free, "
            f"{_gib(self.committed_bytes)} GiB committed to the KV cache, "
            f"{_gib(self.transient_bytes)} GiB kept for transient activations "
            f"({_gib(self.transient_bytes)} GiB allocated at peak, {NOT_MODELLED} GiB of torch "
            f"reservation growth); {num_blocks} KV cache blocks "
            f"({_gib(num_blocks * bytes_per_block)} GiB) fit within the requested "
            f"{_gib(self.requested_bytes)} GiB. Torch may reserve up to {NOT_MODELLED} GiB."
        )

    def committed_line(self, num_blocks: int, bytes_per_block: int) -> str:
        """``extend_kv_cache``'s line: the blocks committed and their physical bytes."""
        stride = bytes_per_block // self.n_segments
        pages = -(-num_blocks * stride // VMM_GRANULE_BYTES) * VMM_GRANULE_BYTES
        return (
            f"Extended KV cache to {num_blocks} blocks ({pages * self.n_segments / GiB:.2f} GiB)."
        )


def _gib(n: int) -> str:
    """vLLM's ``format_gib``: ``round(GiB, 2)``."""
    return f"{round(n / GiB, 2)}"


def size_extensible(
    *,
    total_bytes: int,
    context_bytes: int,
    requested_bytes: int,
    weights_bytes: int,
    non_torch_bytes: int,
    activation_bytes: int,
    graph_bytes: int,
    n_segments: int,
) -> ExtensibleSizing:
    """``measure_kv_cache_bytes`` for a start-up whose steps memfit simulates: the process holds
    ``context_bytes`` before vLLM's snapshot, then weights, non-torch memory and the captured
    CUDA graphs; the transient kept free is the profile run's activation peak."""
    init_free = total_bytes - context_bytes
    segments = max(1, n_segments)
    committed = segments * VMM_GRANULE_BYTES * MIN_COMMITTED_BLOCKS
    non_kv_used = weights_bytes + non_torch_bytes + graph_bytes
    free = init_free - non_kv_used - committed
    headroom = free + committed
    transient = activation_bytes
    margin = max(KV_CACHE_MARGIN_FLOOR_BYTES, int(transient * KV_CACHE_MARGIN_FRACTION))
    available = min(requested_bytes - non_kv_used, headroom - margin) - transient
    return ExtensibleSizing(
        capacity_bytes=requested_bytes - weights_bytes - non_torch_bytes - activation_bytes,
        free_bytes=free,
        committed_bytes=committed,
        transient_bytes=transient,
        margin_bytes=margin,
        requested_bytes=requested_bytes,
        available_bytes=max(available, 0),
        n_segments=segments,
    )


def _hint(utilization: float, *, after_warmup: bool) -> str:
    """``_more_kv_cache_memory_hint`` (vllm/v1/core/kv_cache_planning.py) for the extensible
    cache."""
    used_by = "the model and its activations"
    graphs = ""
    if after_warmup:
        used_by = "the model, its activations, CUDA graphs and warmup"
        graphs = (
            " CUDA graphs take less with fewer or smaller capture sizes in the compilation config."
        )
    if utilization < 1.0:
        return (
            f"The KV cache gets what is left after {used_by} within "
            f"`gpu_memory_utilization`={utilization}; increase it (with the extensible KV cache "
            f"it defaults to 1.0) or decrease `max_model_len` or `max_num_seqs`.{graphs}"
        )
    return (
        "The extensible KV cache already takes all device memory left after "
        f"{used_by}; decrease `max_model_len` or `max_num_seqs`, or the model needs a device "
        f"with more memory.{graphs}"
    )


_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def too_small_error(
    *,
    available_bytes: int,
    needed_bytes: int,
    max_model_len: int,
    estimated_max_len: int,
    utilization: float,
    after_warmup: bool,
) -> str | None:
    """``_check_enough_kv_cache_memory``'s error for ``available_bytes`` (the pool less the null
    block), None when one max_model_len request fits."""
    hint = _hint(utilization, after_warmup=after_warmup)
    if available_bytes <= 0:
        return f"ValueError: No available memory for the cache blocks. {hint} {_DOCS}"
    if needed_bytes <= available_bytes:
        return None
    est = (
        f"Based on the available memory, the estimated maximum model length is "
        f"{estimated_max_len}. "
        if estimated_max_len > 0
        else ""
    )
    return (
        f"ValueError: To serve at least one request with the model's max seq len "
        f"({max_model_len}), ({_gib(needed_bytes)} GiB KV cache is needed, which is larger than "
        f"the available KV cache memory ({_gib(available_bytes)} GiB). {est}{hint} Decreasing "
        f"`max_model_len` also reduces what is needed. {_DOCS}"
    )
