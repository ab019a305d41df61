"""SGLang's defaults by release series (torch-free): the ``chunked_prefill_size``,
``cuda_graph_max_bs`` and ``mem_fraction_static`` that ``ServerArgs.__post_init__``
(``python/sglang/srt/server_args.py``) picks when they are not given, for each series of
:data:`memfit.spec.sglang.SGLANG_VERSIONS`. The rule for ``mem_fraction_static`` changed twice:

* **"0.4"** (0.4.0 - 0.4.6): a table by tensor-parallel size, whatever the GPU: 0.88 at TP 1,
  0.87 at TP 2-3, 0.85 at TP 4-7, 0.81 at TP 8-15, 0.79 from TP 16; ``chunked_prefill_size``
  2048 below 25,000 MiB of GPU memory, else 8192; ``cuda_graph_max_bs`` 8 (TP < 4) or 80 below
  25,000 MiB, else 160. Read in copies of that ``server_args.py`` in memfit's code index (the
  0.4.x ``ServerArgs.__post_init__``, "Set mem fraction static, which depends on the tensor
  parallelism size"); the published 0.4.1 docs log (H100, cuda_graph_max_bs=160,
  mem_fraction_static=0.88) and the 0.4.2 / 0.4.6.post2 logs of
  benchmarks/data/sglang_logs.jsonl print the values this gives.
* **"0.4.7"** (sgl-project/sglang#7054 "Simplify the heuristics for setting
  --mem-fraction-static", merged 2025-06-10, to 0.5.2): ``round((gpu_mem - reserved) /
  gpu_mem, 3)`` with ``reserved = (2.8 + tp x pp / 10)`` GiB below 35 GiB of GPU memory,
  ``(9.5 + tp x pp / 2)`` GiB below 90 GiB, ``(12 + tp x pp / 2)`` GiB below 160 GiB, 32 GiB
  above (+ 4 GiB with DP attention); ``chunked_prefill_size`` 2048 below 35 GiB, 8192 below
  160 GiB, else 16384; ``cuda_graph_max_bs`` 8 (TP < 4) or 80 below 35 GiB. Read in a copy of
  that ``server_args.py`` (code-index file 53148039833, which carries #7054's comments: "T4,
  4080. (chunked_prefill_size 2k, cuda_graph_max_bs 8)" …). An RTX 5080 log of August 2025
  (16,303 MiB) checks it: 0.818, where 0.5.3's rule gives 0.771 and the 0.4 table 0.88. From
  35 GiB ``cuda_graph_max_bs`` stays unset and the capture list's own ceiling applies
  (``get_batch_sizes_to_capture`` in the 0.4.9 and 0.4.10 wheels: sizes to 160, to 256 above
  90 GiB, to 512 above 160 GB; ``server_args.py``'s comments: "H100, A100 … cuda_graph_max_bs
  160", "H20 … 256", "B200, MI300 … 512").
  Which release first shipped #7054 (0.4.7 or 0.4.8) was not pinned; memfit takes 0.4.7.
* **"0.5"** (sgl-project/sglang#10975 "Use more general heuristics to set the default value of
  --mem-fraction-static", merged 2025-09-27, after 0.5.3rc0): the reserve itemised from the
  prefill chunk and the largest graph batch (:mod:`memfit.serving.sglang`, step 1).
"""

from __future__ import annotations

from memfit.spec.sglang import SglangConfig

__all__ = [
    "default_mem_fraction_static",
    "gpu_memory_defaults",
]

#: ``_handle_gpu_memory_settings`` tiers of 0.5.3+: (GPU memory below, MiB) ->
#: (chunked_prefill_size,
#: cuda_graph_max_bs at TP < 4, at TP >= 4). Its comments name the GPUs: T4 / 4080; A10 / 4090;
#: A100-40GB / L40; H100 / A100-80GB; H20 / H200; above: B200 / MI300.
MEMORY_TIERS = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (None, 16384, 512, 512),
)
#: reserved_mem terms of 0.5.3+ (MiB): constant metadata, activation per prefill token, per
#: captured batch size, per GPU of TP x PP (/8 x 1024), DP attention padding per bs x dp (and
#: extra above 300).
RESERVED_BASE_MIB = 512
RESERVED_PER_PREFILL_TOKEN_MIB = 1.5
RESERVED_PER_GRAPH_BS_MIB = 2
RESERVED_PER_GPU_MIB = 1024 / 8
RESERVED_DP_ATTN_MIB = 3
RESERVED_DP_ATTN_LARGE_BS_MIB = 1.5
RESERVED_FLOOR_MIB = 10 * 1024  # on GPUs of more than 60 GiB

#: "0.4": mem_fraction_static by TP size, largest first (tp_size at least the key)
FRACTION_BY_TP_04 = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
#: "0.4": below this GPU memory (MiB) the small-GPU chunk and graph batch apply
SMALL_GPU_MIB_04 = 25_000
#: "0.4.7" (#7054): (GPU memory below, MiB) -> (reserved GiB, reserved GiB per GPU of TP x PP)
RESERVED_TIERS_047 = (
    (35 * 1024, 2.8, 1 / 10),
    (90 * 1024, 9.5, 1 / 2),
    (160 * 1024, 12.0, 1 / 2),
    (None, 32.0, 0.0),
)
RESERVED_DP_ATTN_047_GIB = 4
#: "0.4.7": chunked_prefill_size by GPU memory (MiB, below) and the small-GPU graph batch bound
CHUNK_TIERS_047 = ((35 * 1024, 2048), (160 * 1024, 8192), (None, 16384))
SMALL_GPU_MIB_047 = 35 * 1024
#: the small-GPU graph batch of "0.4" and "0.4.7": 8 at TP < 4, 80 from TP 4; elsewhere 160 ("0.4")
SMALL_GPU_GRAPH_BS = (8, 80)
GRAPH_BS_04 = 160
#: "0.4.7" from 35 GiB: the capture list's ceiling by GPU memory (MiB above the bound)
GRAPH_BS_047 = ((160 * 1000, 512), (90 * 1024, 256), (0, 160))


def gpu_memory_defaults(gpu_mem_mib: int, tp: int, series: str = "0.5") -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang ``series`` picks for a GPU of
    ``gpu_mem_mib`` at TP ``tp`` (module docstring)."""
    small_bs = SMALL_GPU_GRAPH_BS[0] if tp < 4 else SMALL_GPU_GRAPH_BS[1]
    if series == "0.4":
        if gpu_mem_mib < SMALL_GPU_MIB_04:
            return 2048, small_bs
        return 8192, GRAPH_BS_04
    chunk_047 = next(c for below, c in CHUNK_TIERS_047 if below is None or gpu_mem_mib < below)
    if series == "0.4.7":
        if gpu_mem_mib < SMALL_GPU_MIB_047:
            return chunk_047, small_bs
        return chunk_047, next(bs for above, bs in GRAPH_BS_047 if gpu_mem_mib > above)
    for below, chunk, bs_small, bs_large in MEMORY_TIERS:
        if below is None or gpu_mem_mib < below:
            return chunk, bs_small if tp < 4 else bs_large
    raise AssertionError("unreachable: the last tier has no bound")


def default_mem_fraction_static(
    gpu_mem_mib: int, config: SglangConfig, chunked_prefill_size: int, cuda_graph_max_bs: int
) -> float:
    """``mem_fraction_static`` SGLang computes when it is not given, by ``config``'s series
    (module docstring; in "0.5" ``max_prefill_tokens`` is its default 16384 when chunking is
    off)."""
    series = config.series
    if series == "0.4":
        return next(f for tp, f in FRACTION_BY_TP_04 if config.tp_size >= tp)
    if series == "0.4.7":
        base, per_gpu = next(
            (b, g) for below, b, g in RESERVED_TIERS_047 if below is None or gpu_mem_mib < below
        )
        reserved = (base + config.tp_size * per_gpu) * 1024
        if config.enable_dp_attention:
            reserved += RESERVED_DP_ATTN_047_GIB * 1024
        return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    tokens = chunked_prefill_size if chunked_prefill_size > 0 else 16384
    reserved = RESERVED_BASE_MIB + max(tokens, 2048) * RESERVED_PER_PREFILL_TOKEN_MIB
    reserved += cuda_graph_max_bs * RESERVED_PER_GRAPH_BS_MIB
    reserved += config.tp_size * RESERVED_PER_GPU_MIB
    if config.enable_dp_attention:
        reserved += cuda_graph_max_bs * config.dp_size * RESERVED_DP_ATTN_MIB
        if cuda_graph_max_bs > 300:
            reserved += cuda_graph_max_bs * config.dp_size * RESERVED_DP_ATTN_LARGE_BS_MIB
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, RESERVED_FLOOR_MIB)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
