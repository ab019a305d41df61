"""SGLang's CUDA graphs at start-up: the batch sizes it captures and what "Capture cuda graph end.
... mem usage=X GB" counts (torch-free).

``ModelRunner.init_cuda_graphs`` (``python/sglang/srt/model_executor/model_runner.py``, read in
the 0.4.3, 0.4.6.post2, 0.4.10, 0.5.1 and 0.5.3 wheels) logs the free-memory difference around
``CudaGraphRunner(self)``, both ends after ``torch.cuda.empty_cache()``. What that constructor
leaves on the device (``cuda_graph_runner.py``):

1. **The attention backend's graph state** (``init_cuda_graph_state``, allocated before capture):
   FlashInfer, SGLang's default for MHA models off Hopper, keeps ``cuda_graph_kv_indices``
   (int32, ``max_bs x context_len``) and, for the main model, ``cuda_graph_custom_mask`` (uint8,
   the same length) (``layers/attention/flashinfer_backend.py``); FlashAttention 3 (Hopper) a
   ``page_table`` of int32 ``max_bs x context_len / page_size``. Counted as
   :data:`ATTN_STATE_BYTES_PER_SLOT` = 5 bytes per (batch row, context token): FlashInfer's,
   on the safe side of FA3's 4 from 0.5.1. Before 0.5, on Hopper: 8
   (:data:`FA3_04_STATE_BYTES_PER_SLOT`). ``ModelRunner`` picks FA3 by default on Hopper with
   CUDA >= 12.3 for MLA and the usual MHA architectures (``model_runner.py`` of the 0.4.6.post2
   and 0.4.10 wheels: ``is_hopper_with_cuda_12_3()``), and that release's
   ``FlashAttentionBackend.init_cuda_graph_state`` allocates a second int32 table of the same
   shape, ``page_table_draft_decode``, whether or not speculative decoding runs
   (``layers/attention/flashattention_backend.py``, 0.4.6.post2 and 0.4.10; gone from the 0.5.1
   and 0.5.3 wheels). 0.4.0-0.4.5 on Hopper get the 8 as well (the over-predicting side where
   they still ran FlashInfer).
   ``--attention-backend triton`` (``layers/attention/triton_backend.py``):
   ``cuda_graph_kv_indices`` of ``max_bs x context_len`` (int32 in the 0.4.6.post2 and 0.4.10
   wheels, **int64** in the 0.5.1 and 0.5.3 wheels), the same uint8 ``cuda_graph_custom_mask``,
   and the split-KV decode's fp32 ``cuda_graph_attn_logits`` ``[max_bs, heads, num_kv_splits,
   v_head_dim]`` with its ``cuda_graph_attn_lse`` ``[max_bs, heads, num_kv_splits]``
   (``--triton-attention-num-kv-splits``, default 8): 9 bytes per slot from 0.5
   (:data:`TRITON_STATE_BYTES_PER_SLOT`), plus :func:`triton_split_bytes`. An explicit
   ``--attention-backend fa3`` in 0.5 keeps only
   ``page_table`` (4 bytes).
   **FA3 before 0.5 also keeps one page table per captured batch size**
   (:func:`fa3_page_table_copy_bytes`): its ``init_forward_metadata_capture_cuda_graph`` (normal
   decode) sets ``metadata.page_table = self.decode_cuda_graph_metadata["page_table"]
   [req_pool_indices, :]`` — advanced indexing, a copy of ``bs x ceil(context_len / page_size)``
   int32 — and stores that metadata under ``decode_cuda_graph_metadata[bs]``, so every graph's
   copy stays alive (``layers/attention/flashattention_backend.py`` of the 0.4.6.post2 and
   0.4.10 wheels; the review of sgl-project/sglang#4680, which added it: "the main tensors we
   wanna save are the sliced page_tables for different bsz"). sgl-project/sglang#8567 ("Save
   cuda graph memory for fa3", merged 2025-07-30) took contiguous views instead (``[:bs, :]`` in
   the 0.5.1 and 0.5.3 wheels) and measured GLM-4.5-Air at TP 4 falling from 5.16 to 3.22 GB.
   For DeepSeek-V3 (MLA, FA3 by default on Hopper from 0.4.5, context 163,840, bs 1-256) the
   copies are ``sum(capture) x 163,840 x 4`` = 2.58 GiB, most of what memfit missed there.
2. **The graphs' fp32 logits** (``next_token_logits``, after the TP all-gather). Up to 0.4.x
   each graph keeps its own (``self.output_buffers[bs] = output_buffers``; the decode graphs
   share one pool, ``torch.cuda.graph(graph, pool=global_graph_memory_pool)``, so one capture's
   intermediates are reused by the next, but outputs stay alive; ``logits_processor.py``:
   ``logits[:, :vocab_size].float()``): ``sum(capture_bs) x vocab x 4`` bytes. From 0.5 the
   graphs write into one ``next_token_logits_buffer`` of ``max_bs x vocab`` fp32
   (sgl-project/sglang#8579, merged 2025-07-30: absent from the 0.4.10 wheel, present in 0.5.1's
   ``cuda_graph_runner.py``), which that PR measured as GLM-4.5-Air's capture falling from 5.16
   to 2.89 GB at TP 4 — the 2.24 GiB this term gives for bs up to 256 (151,552 tokens).
3. **The graphs themselves**: an instantiated graph's device memory grows with the kernels it
   replays. SGLang captures one FULL decode graph per batch size. The base and the per-fused-MoE-
   layer bytes are vLLM's (:data:`memfit.serving.cudagraphs.CAPTURE_PER_GRAPH`, fitted on 34
   vLLM 0.19 H100 captures); the per-layer bytes are SGLang's own,
   :data:`SGLANG_PER_LAYER_BYTES`, about twice vLLM's 0.165 MiB: two logged captures that
   print their bar readings (Llama-3.x-70B at TP 8 on H200s, sgl-project/sglang#11716, a
   dense bf16 model; Grok-2 at TP 8 on H100s, FP8 MoE) leave 0.35 / 0.39 MiB per layer per graph
   after terms 1, 2 and 5 (Grok-2: 0.32 after vLLM's per-fused-MoE-layer bytes), so the excess is
   not an FP8-MoE mechanism. Fitted jointly with the
   start-up (term 5) on the Llama-70B capture and the two bs 1-8 logs; why SGLang's eager decode
   graphs hold more per layer than vLLM's compiled ones is not established.
4. **Collectives in the graphs** (TP > 1 where SGLang's custom all-reduce is off: PCIe GPUs beyond
   two): NCCL's all-reduce after each attention and MLP block and the logits all-gather are
   captured in every graph; :data:`PER_CAPTURED_COLLECTIVE_BYTES` each, fitted on the one such
   log (QwQ-32B on 4 x L4, 0.93 GB; not checked on a second log).
5. **Capture start-up**: two terms read in source, and a fitted rest.
   (a) The capture stream's cuBLAS workspace: the eager warm-up runs (``capture_one_batch_size``
   runs the batch twice before capturing it) are the first GEMMs on ``graph_capture()``'s new
   stream, and torch allocates one workspace per (handle, stream) through the caching allocator
   and keeps it: 32 MiB on compute capability 9.0, else 8 MiB + 128 KiB
   (``parseChosenWorkspaceSize``, ``aten/src/ATen/cuda/CublasHandlePool.cpp`` at
   pytorch/pytorch@26a39059; :func:`cublas_workspace_bytes`).
   (b) FlashInfer's decode wrappers: SGLang's FlashInfer backend builds a
   ``BatchDecodeWithPagedKVCacheWrapper(..., use_cuda_graph=True)`` per captured batch size and
   keeps it (``decode_cuda_graph_metadata[bs]``, ``layers/attention/flashinfer_backend.py`` of
   the 0.4.10 and 0.5.9 wheels), and each wrapper allocates an 8 MiB device
   ``_int_workspace_buffer`` in ``__init__`` (flashinfer ``decode.py``): 8 MiB per graph where
   FlashInfer runs (:func:`runs_flashinfer_decode`: FA3 is the default on Hopper, FlashInfer
   elsewhere — B200 included in the 0.5.5.post1 wheel — and trtllm_mha / FA3 / Triton keep none).
   (c) The rest (:data:`CAPTURE_START_BYTES`, fitted): the decode kernels loaded lazily at the
   first capture and the pool's first segments. Fitted with :data:`SGLANG_PER_LAYER_BYTES` on
   the two small-batch logs (Llama-3.1-8B, RTX 4090, 0.4.9; Qwen3-0.6B, RTX 5080, 0.4.10; bs
   1-8, both 0.11 GB; FlashInfer, 8 MiB cuBLAS workspaces) and the Llama-70B capture (1.98 GB,
   52 graphs of 80 layers; FA3 on an H200, a 32 MiB one), (a) and (b) subtracted first: 17 MiB
   (57 MiB while (a) and (b) were in it, which put the FA3 Qwen2.5-0.5B capture on an H100 at
   +22 %, now +10.5 %; docs/accuracy.md, helper "servegraph").

Not in the graphs: fused MoE's own buffers. ``fused_experts_impl``
(``layers/moe/fused_moe_triton/fused_moe.py``, 0.5.1 wheel) allocates ``cache`` (``M x topk x
max(N, hidden)``), ``intermediate_cache2`` (``M x topk x N / 2``) and the output per call, and
``moe_align_block_size`` its sorted ids: transient tensors of the decode batch, reused across
graphs because SGLang captures the largest batch first into one shared pool
(``cuda_graph_runner.py``: ``reversed(self.capture_bs)``, ``global_graph_memory_pool``). For
Grok-2 at TP 8 and bs 160 that is 160 x 2 x 8192 x 2 bytes = 5 MiB, once, not per graph.

The batch sizes (``get_batch_sizes_to_capture`` up to 0.5.2, ``ServerArgs.
_generate_cuda_graph_batch_sizes`` from 0.5.3): :func:`capture_batch_sizes`.
"""

from __future__ import annotations

import re

from memfit.models import ModelSpec
from memfit.serving.cudagraphs import CAPTURE_PER_GRAPH
from memfit.spec.sglang import SGLANG_ATTENTION_BACKENDS
from memfit.units import GiB

__all__ = [
    "ATTENTION_BACKENDS",
    "ATTN_STATE_BYTES_PER_SLOT",
    "FA3_04_STATE_BYTES_PER_SLOT",
    "CAPTURE_START_BYTES",
    "PER_CAPTURED_COLLECTIVE_BYTES",
    "SGLANG_PER_LAYER_BYTES",
    "TRITON_STATE_BYTES_PER_SLOT",
    "attn_state_bytes_per_slot",
    "capture_batch_sizes",
    "cublas_workspace_bytes",
    "runs_flashinfer_decode",
    "fa3_page_table_copy_bytes",
    "keeps_fa3_page_table_copies",
    "sglang_graph_bytes",
    "shares_logits_buffer",
    "triton_split_bytes",
]

#: FlashInfer's ``cuda_graph_kv_indices`` (int32) + ``cuda_graph_custom_mask`` (uint8) per batch
#: row and context token (module docstring, 1)
ATTN_STATE_BYTES_PER_SLOT = 4 + 1
#: FA3's ``page_table`` + ``page_table_draft_decode`` (int32 each) in 0.4.x on Hopper (module
#: docstring, 1)
FA3_04_STATE_BYTES_PER_SLOT = 4 + 4
#: ``--attention-backend`` values whose graph state memfit sizes (module docstring, 1); None:
#: SGLang's default for the release and GPU
ATTENTION_BACKENDS = SGLANG_ATTENTION_BACKENDS
#: FA3's ``page_table`` alone (int32), 0.5.1 and 0.5.3 wheels (module docstring, 1)
FA3_STATE_BYTES_PER_SLOT = 4
#: Triton's ``cuda_graph_kv_indices`` (int64 from 0.5, int32 before) + ``cuda_graph_custom_mask``
#: (uint8) per batch row and context token (module docstring, 1)
TRITON_STATE_BYTES_PER_SLOT = 8 + 1
TRITON_04_STATE_BYTES_PER_SLOT = 4 + 1
#: ``--triton-attention-num-kv-splits`` default (``server_args.py``, 0.4.6.post2 to 0.5.3)
TRITON_NUM_KV_SPLITS = 8
#: Triton's split-KV accumulators are fp32 (``cuda_graph_attn_logits`` / ``cuda_graph_attn_lse``)
TRITON_ACCUM_BYTES = 4
#: FA3's page table is int32 (module docstring, 1)
FA3_PAGE_TABLE_ENTRY_BYTES = 4
#: the first 0.4 patch release whose SGLang may pick FA3 by default on Hopper: read in the
#: 0.4.6.post2 wheel (``model_runner.py``, ``is_hopper_with_cuda_12_3()``); sgl-project/sglang#5210
#: ("use fa3 mla by default on hopper") merged 2025-04-09, in the 0.4.5 series, so 0.4.5 counts
#: (the safe side: its wheel was not read)
FA3_DEFAULT_FROM_PATCH = 5
_PATCH_04 = re.compile(r"^0\.4\.(\d+)")
#: the MHA architectures SGLang runs with FA3 by default on Hopper (``utils.py``
#: ``is_fa3_default_architecture``: the 0.4.6.post2 and 0.4.10 wheels' sets, united, the safe
#: side), plus ``Gemma3ForCausalLM``: memfit's bundled Gemma 3 text configs name it where the
#: served checkpoints name ``Gemma3ForConditionalGeneration``. MLA models get FA3 on Hopper
#: whatever their architecture (``model_runner.py``, the same wheels).
FA3_DEFAULT_ARCHITECTURES = frozenset(
    {
        "Qwen2ForCausalLM",
        "Llama4ForConditionalGeneration",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Gemma3ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Glm4MoeForCausalLM",
    }
)
#: torch's default cuBLAS workspace per (handle, stream), allocated through the caching allocator
#: the first time a GEMM runs on a stream (module docstring, 5): ``parseChosenWorkspaceSize`` in
#: ``aten/src/ATen/cuda/CublasHandlePool.cpp`` (pytorch/pytorch@26a39059): ``4096 * 8 * 1024``
#: on compute capability 9.0 exactly (H100 / H200), else ``:4096:2:16:8`` (8 MiB + 128 KiB)
CUBLAS_WORKSPACE_BYTES_SM90 = 4096 * 8 * 1024
CUBLAS_WORKSPACE_BYTES_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
#: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper.__init__`` allocates an 8 MiB device
#: ``_int_workspace_buffer`` (flashinfer ``flashinfer/decode.py``, read in the code index), and
#: SGLang's FlashInfer backend builds and keeps one such wrapper per captured batch size
#: (module docstring, 5)
FLASHINFER_INT_WORKSPACE_BYTES = 8 * 1024 * 1024

#: ``next_token_logits`` are fp32 (module docstring, 2)
LOGIT_BYTES = 4
#: collectives captured per layer at TP > 1 (attention and MLP all-reduce), and per graph (the
#: logits all-gather)
COLLECTIVES_PER_LAYER, COLLECTIVES_PER_GRAPH = 2, 1


def _vocab_logits_bytes(capture: tuple[int, ...], vocab: int, shared: bool = False) -> int:
    """Module docstring, 2: every graph's logits, or (``shared``, 0.5+) one buffer of the
    largest."""
    return (max(capture) if shared else sum(capture)) * vocab * LOGIT_BYTES


#: Module docstring, 3 and 5: the two small-batch logs (context, vocabulary, layers; four
#: graphs, bs 1, 2, 4, 8; 0.4.x: every graph's logits; 0.11 GiB each) and the Llama-70B capture
#: of sgl-project/sglang#11716 (main of 2025-10-16, H200, TP 8: 52 graphs, bs 1-512, context
#: 131072, vocab 128256, 80 layers, the shared logits buffer; "mem usage=1.98 GB" on TP0).
_SMALL_LOGS = ((131072, 128256, 32), (40960, 151936, 28))
_L70B_CAPTURE = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 513, 16))


def _solve_start_and_per_layer() -> tuple[int, int]:
    """Start-up S and SGLang's per-layer bytes P from ``S + 4 x layers_i x P = left_i`` (the two
    small logs, averaged) and ``S + 52 x 80 x P = left_70B``, where ``left`` is each capture less
    terms 1, 2, the per-graph base, the capture stream's cuBLAS workspace (the small logs' RTX
    4090 / RTX 5080: 8 MiB + 128 KiB; the H200: 32 MiB) and FlashInfer's per-graph wrappers (the
    small logs run FlashInfer; the Llama-70B log FA3, SGLang's Hopper default)."""
    base = CAPTURE_PER_GRAPH[0]
    small = [
        0.11 * GiB
        - 8 * ctx * ATTN_STATE_BYTES_PER_SLOT
        - _vocab_logits_bytes((1, 2, 4, 8), vocab)
        - 4 * base
        - CUBLAS_WORKSPACE_BYTES_OTHER
        - 4 * FLASHINFER_INT_WORKSPACE_BYTES
        for ctx, vocab, _ in _SMALL_LOGS
    ]
    mean_left = sum(small) / len(small)
    mean_layers = sum(layers for *_, layers in _SMALL_LOGS) / len(_SMALL_LOGS)
    n = len(_L70B_CAPTURE)
    left_70b = (
        1.98 * GiB
        - max(_L70B_CAPTURE) * 131072 * ATTN_STATE_BYTES_PER_SLOT
        - _vocab_logits_bytes(_L70B_CAPTURE, 128256, shared=True)
        - n * base
        - CUBLAS_WORKSPACE_BYTES_SM90
    )
    per_layer = (left_70b - mean_left) / (n * 80 - 4 * mean_layers)
    return int(mean_left - 4 * mean_layers * per_layer), int(per_layer)


#: Module docstring, 5 (start-up) and 3 (SGLang's bytes per layer per captured graph)
CAPTURE_START_BYTES, SGLANG_PER_LAYER_BYTES = _solve_start_and_per_layer()


def _per_graph(n_layers: int, n_moe_layers: int) -> int:
    """One captured graph's own bytes (module docstring, 3): vLLM's base and per-fused-MoE-layer
    terms, SGLang's per-layer term."""
    base, _, per_moe = CAPTURE_PER_GRAPH
    return base + SGLANG_PER_LAYER_BYTES * n_layers + per_moe * n_moe_layers


#: Module docstring, 4: QwQ-32B on 4 x L4 (sglang 0.4.3, didier-durand/llms-in-clouds
#: docs/sglang.md at 3e1df42a): 0.93 GiB for 13 graphs (bs 1-80) of 64 layers, context 131072,
#: vocab 152064, less terms 1, 2, 3 and 5, over 13 x (2 x 64 + 1) collectives.
_QWQ_CAPTURE = (1, 2, 4, 8, *range(16, 81, 8))
PER_CAPTURED_COLLECTIVE_BYTES = int(
    (
        0.93 * GiB
        - 80 * 131072 * ATTN_STATE_BYTES_PER_SLOT
        - _vocab_logits_bytes(_QWQ_CAPTURE, 152064)
        - len(_QWQ_CAPTURE) * _per_graph(64, 0)
        - CAPTURE_START_BYTES
        - CUBLAS_WORKSPACE_BYTES_OTHER  # 4 x L4 (compute capability 8.9), FlashInfer
        - len(_QWQ_CAPTURE) * FLASHINFER_INT_WORKSPACE_BYTES
    )
    / (len(_QWQ_CAPTURE) * (COLLECTIVES_PER_LAYER * 64 + COLLECTIVES_PER_GRAPH))
)

#: 0.4 / 0.4.7 series (``get_batch_sizes_to_capture``): the base list, and the GPUs (memory in
#: MiB above the bound) that add larger sizes: > 96 GiB (0.4.6.post2; 0.4.10: > 90 GiB) up to
#: 256 in steps of 8, > 160 GB (0.4.10) up to 512 in steps of 16
_BASE_04 = (1, 2, 4, 8, *range(16, 161, 8))
_LARGE_GPU_04 = {"0.4": (96 * 1024, None), "0.4.7": (90 * 1024, 160 * 1000)}


def shares_logits_buffer(sglang_version: str) -> bool:
    """Whether SGLang ``sglang_version`` (a release or a series name) writes every graph's logits
    into one shared buffer (module docstring, 2: the 0.5 releases; 0.4.x keep one per graph)."""
    return not sglang_version.startswith("0.4")


def attn_state_bytes_per_slot(
    sglang_version: str, gpu_arch: str | None, backend: str | None = None
) -> int:
    """Bytes of the attention backend's graph state per (batch row, context token) for SGLang
    ``sglang_version`` on a GPU of ``gpu_arch`` (module docstring, 1). ``backend``
    (``--attention-backend``): Triton's int64 indices and mask from 0.5 (int32 before), FA3's
    page table(s), FlashInfer's indices and mask; None (SGLang's default): FA3's two int32 page
    tables on Hopper before 0.5, else FlashInfer's 5 (the safe side of FA3's 4 from 0.5)."""
    before_05 = sglang_version.startswith("0.4")
    if backend == "triton":
        return TRITON_04_STATE_BYTES_PER_SLOT if before_05 else TRITON_STATE_BYTES_PER_SLOT
    if backend == "fa3":
        return FA3_04_STATE_BYTES_PER_SLOT if before_05 else FA3_STATE_BYTES_PER_SLOT
    if backend is None and gpu_arch == "hopper" and before_05:
        return FA3_04_STATE_BYTES_PER_SLOT
    return ATTN_STATE_BYTES_PER_SLOT


def keeps_fa3_page_table_copies(
    sglang_version: str,
    gpu_arch: str | None,
    backend: str | None = None,
    *,
    architecture: str | None = None,
    mla: bool = False,
) -> bool:
    """Whether SGLang ``sglang_version`` keeps a copy of FA3's page table per captured batch size
    (module docstring, 1): FA3 (``backend`` "fa3", or SGLang's default on Hopper from 0.4.5 —
    a series name such as "0.4" counts, the safe side — for an ``mla`` model or an
    ``architecture`` in :data:`FA3_DEFAULT_ARCHITECTURES`; an unknown architecture counts, the
    safe side) in a release before 0.5 (sgl-project/sglang#8567 is absent from the 0.4.10
    wheel, present in 0.5.1's)."""
    if not sglang_version.startswith("0.4"):
        return False
    if backend is not None:
        return backend == "fa3"
    return _default_is_fa3(sglang_version, gpu_arch, architecture, mla)


def _default_is_fa3(
    sglang_version: str, gpu_arch: str | None, architecture: str | None, mla: bool
) -> bool:
    """Whether SGLang's default attention backend is FA3: on Hopper, from 0.4.5 (a series name
    such as "0.4" counts, the safe side), for an ``mla`` model or an ``architecture`` in
    :data:`FA3_DEFAULT_ARCHITECTURES` (an unknown architecture counts)."""
    if gpu_arch != "hopper":
        return False
    if not mla and architecture is not None and architecture not in FA3_DEFAULT_ARCHITECTURES:
        return False
    patch = _PATCH_04.match(sglang_version)
    return patch is None or int(patch.group(1)) >= FA3_DEFAULT_FROM_PATCH


def cublas_workspace_bytes(compute_capability: tuple[int, int] | None) -> int:
    """The capture stream's cuBLAS workspace on a GPU of ``compute_capability`` (module
    docstring, 5): 32 MiB on 9.0, else 8 MiB + 128 KiB (an unknown GPU: the larger)."""
    if compute_capability is None or tuple(compute_capability) == (9, 0):
        return CUBLAS_WORKSPACE_BYTES_SM90
    return CUBLAS_WORKSPACE_BYTES_OTHER


def runs_flashinfer_decode(
    sglang_version: str,
    gpu_arch: str | None,
    backend: str | None = None,
    *,
    architecture: str | None = None,
    mla: bool = False,
) -> bool:
    """Whether SGLang's decode graphs run FlashInfer's wrappers, one per captured batch size
    (module docstring, 5): ``--attention-backend flashinfer``, or SGLang's default where it is
    not FA3 on Hopper (0.4.5+, MLA or an architecture in :data:`FA3_DEFAULT_ARCHITECTURES`;
    the 0.5.9 wheel's ``server_args.py`` picks FA3 for every MHA model on Hopper, the set is
    kept as the safe side). Elsewhere SGLang's default is FlashInfer (Blackwell's trtllm_mha,
    which keeps none, is not dated: counted as FlashInfer, the safe side)."""
    if backend is not None:
        return backend == "flashinfer"
    return not _default_is_fa3(sglang_version, gpu_arch, architecture, mla)


def fa3_page_table_copy_bytes(
    capture: tuple[int, ...], context_len: int, page_size: int = 1
) -> int:
    """The per-batch-size page-table copies FA3 keeps before 0.5 (module docstring, 1):
    ``sum(capture) x ceil(context_len / page_size)`` int32 entries."""
    pages = -(-context_len // page_size)
    return sum(capture) * pages * FA3_PAGE_TABLE_ENTRY_BYTES


def triton_split_bytes(max_bs: int, n_heads_per_rank: int, head_dim_v: int) -> int:
    """Triton decode attention's split-KV accumulators, allocated with the graph state (module
    docstring, 1): ``cuda_graph_attn_logits`` ``[max_bs, heads, splits, Dv]`` and
    ``cuda_graph_attn_lse`` ``[max_bs, heads, splits]``, fp32 (MLA: Dv is ``kv_lora_rank``)."""
    return max_bs * n_heads_per_rank * TRITON_NUM_KV_SPLITS * (head_dim_v + 1) * TRITON_ACCUM_BYTES


def capture_batch_sizes(
    max_bs: int, series: str = "0.5", gpu_memory_mib: int | None = None
) -> tuple[int, ...]:
    """The decode batch sizes SGLang ``series`` captures up to ``max_bs`` (the smaller of
    ``--cuda-graph-max-bs`` and ``max_running_requests``). 0.5.3+ (``_generate_cuda_graph_batch_
    sizes``): 1, 2, 4, 8, 12, then steps of 8 to 256, 16 to 512, 32 beyond. Before: 1, 2, 4, 8,
    then steps of 8 to 160 (to 256 / 512 on the largest GPUs), and up to ``max_bs`` in steps of
    16 when it lies beyond."""
    if series == "0.5":
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16)]
        sizes += list(range(512, max_bs + 1, 32))
        return tuple(b for b in sizes if b <= max_bs)
    sizes = list(_BASE_04)
    over_256, over_512 = _LARGE_GPU_04.get(series, _LARGE_GPU_04["0.4"])
    if gpu_memory_mib is not None and gpu_memory_mib > over_256:
        sizes += list(range(160, 257, 8))
    if over_512 is not None and gpu_memory_mib is not None and gpu_memory_mib > over_512:
        sizes += list(range(256, 513, 16))
    kept = sorted({b for b in sizes if b <= max_bs})
    if kept and kept[-1] < max_bs:
        kept += list(range(kept[-1], max_bs + 1, 16))
    return tuple(sorted(set(kept)))


def sglang_graph_bytes(
    spec: ModelSpec,
    capture: tuple[int, ...],
    *,
    context_len: int,
    n_moe_layers: int = 0,
    nccl_in_graph: bool = False,
    shared_logits: bool = False,
    attn_bytes_per_slot: int = ATTN_STATE_BYTES_PER_SLOT,
    attn_workspace_bytes: int = 0,
    fa3_copies: bool = False,
    page_size: int = 1,
    cublas_bytes: int = CUBLAS_WORKSPACE_BYTES_SM90,
    flashinfer_wrappers: bool = False,
) -> int:
    """What "Capture cuda graph end ... mem usage" counts for ``capture`` (module docstring):
    start-up + attention state + the graphs' fp32 logits (every graph's, or one shared buffer:
    ``shared_logits``, SGLang 0.5+) + per-graph bytes + captured collectives (``nccl_in_graph``:
    TP > 1 without SGLang's custom all-reduce; ``attn_bytes_per_slot``:
    :func:`attn_state_bytes_per_slot`; ``attn_workspace_bytes``: the backend's fixed graph
    buffers, :func:`triton_split_bytes`; ``fa3_copies``: FA3's per-batch-size page tables before
    0.5, :func:`keeps_fa3_page_table_copies`, of ``page_size``-token pages; ``cublas_bytes``:
    :func:`cublas_workspace_bytes`; ``flashinfer_wrappers``: :func:`runs_flashinfer_decode`)."""
    if not capture:
        return 0
    text = spec.text or spec
    n_layers = text.n_layers or 0
    graphs = len(capture) * _per_graph(n_layers, n_moe_layers)
    collectives = 0
    if nccl_in_graph:
        per_graph = COLLECTIVES_PER_LAYER * n_layers + COLLECTIVES_PER_GRAPH
        collectives = len(capture) * per_graph * PER_CAPTURED_COLLECTIVE_BYTES
    wrappers = len(capture) * FLASHINFER_INT_WORKSPACE_BYTES if flashinfer_wrappers else 0
    return (
        CAPTURE_START_BYTES
        + cublas_bytes
        + wrappers
        + max(capture) * context_len * attn_bytes_per_slot
        + attn_workspace_bytes
        + (fa3_page_table_copy_bytes(capture, context_len, page_size) if fa3_copies else 0)
        + _vocab_logits_bytes(capture, text.vocab_size or 0, shared_logits)
        + graphs
        + collectives
    )
