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
   replays. SGLang captures one FULL decode graph per batch size, as vLLM's FULL graphs are;
   the per-graph bytes are vLLM's (:data:`memfit.serving.cudagraphs.CAPTURE_PER_GRAPH`: base +
   per layer + per fused-MoE layer, fitted on 34 vLLM 0.19 H100 captures).
4. **Collectives in the graphs** (TP > 1 where SGLang's custom all-reduce is off: PCIe GPUs beyond
   two): NCCL's all-reduce after each attention and MLP block and the logits all-gather are
   captured in every graph; :data:`PER_CAPTURED_COLLECTIVE_BYTES` each, fitted on the one such
   log (QwQ-32B on 4 x L4, 0.93 GB; not checked on a second log).
5. **Capture start-up** (:data:`CAPTURE_START_BYTES`, fitted): the decode kernels loaded lazily
   at the first capture, the capture stream's cuBLAS workspace and the pool's first segments.
   Fitted on the two small-batch logs (Llama-3.1-8B, RTX 4090, 0.4.9; Qwen3-0.6B, RTX 5080,
   0.4.10; bs 1-8, both 0.11 GB), which leave 73.3 and 78.1 MiB after terms 1-3.

The batch sizes (``get_batch_sizes_to_capture`` up to 0.5.2, ``ServerArgs.
_generate_cuda_graph_batch_sizes`` from 0.5.3): :func:`capture_batch_sizes`.
"""

from __future__ import annotations

from memfit.models import ModelSpec
from memfit.serving.cudagraphs import CAPTURE_PER_GRAPH
from memfit.units import GiB

__all__ = [
    "ATTN_STATE_BYTES_PER_SLOT",
    "FA3_04_STATE_BYTES_PER_SLOT",
    "CAPTURE_START_BYTES",
    "PER_CAPTURED_COLLECTIVE_BYTES",
    "attn_state_bytes_per_slot",
    "capture_batch_sizes",
    "sglang_graph_bytes",
    "shares_logits_buffer",
]

#: FlashInfer's ``cuda_graph_kv_indices`` (int32) + ``cuda_graph_custom_mask`` (uint8) per batch
#: row and context token (module docstring, 1)
ATTN_STATE_BYTES_PER_SLOT = 4 + 1
#: FA3's ``page_table`` + ``page_table_draft_decode`` (int32 each) in 0.4.x on Hopper (module
#: docstring, 1)
FA3_04_STATE_BYTES_PER_SLOT = 4 + 4
#: ``next_token_logits`` are fp32 (module docstring, 2)
LOGIT_BYTES = 4
#: collectives captured per layer at TP > 1 (attention and MLP all-reduce), and per graph (the
#: logits all-gather)
COLLECTIVES_PER_LAYER, COLLECTIVES_PER_GRAPH = 2, 1


def _vocab_logits_bytes(capture: tuple[int, ...], vocab: int, shared: bool = False) -> int:
    """Module docstring, 2: every graph's logits, or (``shared``, 0.5+) one buffer of the
    largest."""
    return (max(capture) if shared else sum(capture)) * vocab * LOGIT_BYTES


def _per_graph(n_layers: int, n_moe_layers: int) -> int:
    base, per_layer, per_moe = CAPTURE_PER_GRAPH
    return base + per_layer * n_layers + per_moe * n_moe_layers


#: Module docstring, 5: each small-batch log's 0.11 GiB less terms 1-3 (Llama-3.1-8B: context
#: 131072, vocab 128256, 32 layers; Qwen3-0.6B: context 40960, vocab 151936, 28 layers; four
#: graphs, bs 1, 2, 4, 8 each), averaged.
CAPTURE_START_BYTES = int(
    sum(
        0.11 * GiB
        - 8 * ctx * ATTN_STATE_BYTES_PER_SLOT
        - _vocab_logits_bytes((1, 2, 4, 8), vocab)
        - 4 * _per_graph(layers, 0)
        for ctx, vocab, layers in ((131072, 128256, 32), (40960, 151936, 28))
    )
    / 2
)
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


def attn_state_bytes_per_slot(sglang_version: str, gpu_arch: str | None) -> int:
    """Bytes of the attention backend's graph state per (batch row, context token) for SGLang
    ``sglang_version`` on a GPU of ``gpu_arch`` (module docstring, 1): FA3's two int32 page
    tables on Hopper before 0.5, else FlashInfer's 5."""
    if gpu_arch == "hopper" and sglang_version.startswith("0.4"):
        return FA3_04_STATE_BYTES_PER_SLOT
    return ATTN_STATE_BYTES_PER_SLOT


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
) -> int:
    """What "Capture cuda graph end ... mem usage" counts for ``capture`` (module docstring):
    start-up + attention state + the graphs' fp32 logits (every graph's, or one shared buffer:
    ``shared_logits``, SGLang 0.5+) + per-graph bytes + captured collectives (``nccl_in_graph``:
    TP > 1 without SGLang's custom all-reduce; ``attn_bytes_per_slot``:
    :func:`attn_state_bytes_per_slot`)."""
    if not capture:
        return 0
    text = spec.text or spec
    n_layers = text.n_layers or 0
    graphs = len(capture) * _per_graph(n_layers, n_moe_layers)
    collectives = 0
    if nccl_in_graph:
        per_graph = COLLECTIVES_PER_LAYER * n_layers + COLLECTIVES_PER_GRAPH
        collectives = len(capture) * per_graph * PER_CAPTURED_COLLECTIVE_BYTES
    return (
        CAPTURE_START_BYTES
        + max(capture) * context_len * attn_bytes_per_slot
        + _vocab_logits_bytes(capture, text.vocab_size or 0, shared_logits)
        + graphs
        + collectives
    )
