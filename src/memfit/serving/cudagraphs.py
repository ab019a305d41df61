"""vLLM's CUDA graphs at start-up: which graphs it captures, and the memory it counts for them.

Which graphs (read in vLLM's source, :mod:`memfit.serving.vllm_matrix`): the default
``cudagraph_mode`` FULL_AND_PIECEWISE captures one PIECEWISE graph per capture size (1, 2, 4,
steps of 8 to 256, of 16 beyond, up to ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``)
and one FULL decode graph per capture size up to ``max_num_seqs``
(``vllm/v1/cudagraph_dispatcher.py``).

How much: the capture runs after the KV cache is allocated ("Graph capturing finished … took X
GiB", a free-memory difference around ``capture_model``); vLLM's own estimate (0.18+, "Estimated
CUDA graph memory: X GiB total", from 0.20 kept out of the KV cache's budget) is computed before
it, while profiling: see "The estimate" below. For the capture memfit counts two mechanisms:

1. **FlashAttention's split-KV workspace, once** (not fitted). With FULL graphs the FlashAttention
   metadata builders fix ``max_num_splits`` to ``flash_attn_max_num_splits_for_cuda_graph`` = 32
   "so that large enough intermediate buffers are pre-allocated during capture"
   (``vllm/v1/attention/backends/flash_attn.py`` and ``mla/flashattn_mla.py``,
   ``FlashAttentionMetadataBuilder.__init__``; the 32 is the default of
   ``VLLM_FLASH_ATTN_MAX_NUM_SPLITS_FOR_CUDA_GRAPH`` in ``vllm/envs.py`` of the 0.11 and 0.12
   PyPI sdists and of ``AttentionConfig.flash_attn_max_num_splits_for_cuda_graph`` in
   ``vllm/config/attention.py`` of every sdist from 0.13 to 0.34). FlashAttention 3 then
   allocates its fp32 accumulators
   ``out_accum [splits, tokens, heads, head_dim_v]`` and ``softmax_lse_accum [splits, tokens,
   heads]`` inside the largest FULL graph's capture (flash-attention ``hopper/flash_api.cpp``,
   ``mha_fwd``), in the graph pool every later graph shares: ``32 x B x H/TP x (Dv + 1) x 4`` bytes,
   B the largest FULL (decode) capture size, Dv the head dim (MLA: ``kv_lora_rank``, the latent the
   decode kernel attends in). The llm-d-planner v0.19.0 logs print this as the FULL mode's first
   capture ("Estimated FULL CUDA graph memory: 260.00 MiB first-capture" for Llama-3.1-8B: 256 MiB
   + 4; 132 / 70 MiB at TP 2 / 4; 522 MiB for DeepSeek-V2-Lite's 16 x 512 latent), which is why
   the capture shrinks with TP (0.91 / 0.76 / 0.67 GiB at TP 1 / 2 / 4). Not for an "mm-prefix"
   checkpoint (bidirectional attention over image tokens: ``ModelConfig.is_mm_prefix_lm``, the
   model types in ``MM_PREFIX_LM_MODEL_TYPES`` from 0.13): FlashAttention's backend does not
   declare ``supports_mm_prefix`` (the base ``AttentionBackend`` returns False; Triton and Flex
   attention return True), so such a model is served by the Triton backend, whose decode
   buffers are persistent, allocated before the capture. That is why Gemma 3 4B / 12B / 27B -it
   capture 0.67 / 0.94 / 1.14 GiB, what the per-graph term alone gives (memfit had them +20 to
   +39 % with a workspace-free fit that spread the other families' workspace over every graph).
   Measured with FlashAttention 3 (Hopper) only: the builders set ``aot_schedule =
   get_flash_attn_version() == 3`` and fix ``max_num_splits`` only under it; FlashAttention 2
   keeps ``max_num_splits = 0`` ("no upper bound": its own heuristic decides, not read here). On
   other GPUs the workspace stays as an allowance on the safe side: the one non-Hopper log
   (Qwen3-8B on an RTX A5000, vLLM 0.21, LMCache#3430) estimates 0.52 GiB where memfit says 0.72,
   but without the allowance that log's KV tokens would be +4.0 % over the log (the estimate
   leaves the 0.20+ budget), past the 3 % memfit holds itself to.
2. **Per captured graph** (fitted): the instantiated graphs' own device memory, which grows with
   the kernels a graph replays: a piecewise graph is one CUDA graph per layer's piece
   (``vllm/compilation/backends.py``, split at each attention op), a FULL graph replays every
   layer; a fused-MoE layer adds its routing / align / grouped-GEMM / reduce kernels. The per-graph
   samples in the same logs are 2-26 MiB and roughly the same for every capture size (the second
   largest graph is sampled), so the term is per graph, not per token:

    bytes = split workspace + n_graphs x (BASE + PER_LAYER x layers + PER_MOE_LAYER x MoE layers)

with the three constants least-squares fitted (the workspace subtracted first) to the 34 vLLM
0.19.0 H100 runs of the llm-d-planner accuracy data (github.com/jgchn/llm-d-planner,
accuracy/results/v0.19.0/results_raw.csv at commit 30ec05f7: ``cuda_graph_actual_gib`` and
``cuda_graph_estimated_gib``; the debug lines quoted above are in accuracy/results/v0.19.0/logs/
at commit 6417620b). benchmarks/vllm_startup.py refits them and prints each log's leave-one-out
error (docs/accuracy.md section 9): 33 of 34 within 20 %. The one outside is DeepSeek-V2-Lite
(-24 %, under; -19 % in-sample): its MLA layers run more kernels per piece than a GQA layer (the
latent projections ``kv_a_proj_with_mqa`` / ``kv_a_layernorm``, the rope split, the decode's
``mla_decode_concat_quant_fp8`` and the W_UK / W_UV absorption around the FULL graphs' attention,
``vllm/model_executor/layers/attention/mla_attention.py``), with the same number of pieces (the
log stores subgraphs 0-27 for 27 layers, as Llama-3.1-8B's 0-32 for 32). The log's own samples
say so: 10 / 8 MiB per PIECEWISE / FULL graph against Llama-3.1-8B's 6 / 6 with more layers.
Hence a third term:

3. **Per MLA layer per graph** (fitted on that one log, checked on two held out): what
   DeepSeek-V2-Lite's capture leaves over the three constants, over its 102 graphs x 27 MLA
   layers: 0.112 MiB. Checked on Kimi-VL-A3B-Instruct (llm-d-planner results_raw.csv at commit
   3c876c8a, vLLM 0.19.0, H100; a DeepSeek-V3-style text stack of the same shape — the logs'
   custom-op counts rms_norm 82, mla_decode_concat_quant_fp8 27, fused_moe 26 equal
   DeepSeek-V2-Lite's, and its FULL first capture is the same 522 MiB): capture 1.57 / 1.32 GiB
   against 1.50 / 1.26 logged at TP 1 / 2 (+4.7 / +4.7 %; without the term -15 / -19 %). The
   term may also carry the shared experts' MLP (every MLA model checked has them): the two are
   not separable on these logs.

Every fitted run has 102 graphs on an H100; three runs held out of the fit
(``graph_held_out`` in the data) check the rest: phi-2 +9.2 %, and gpt-oss-20b at TP 1 / 2
(166 graphs up to 1024, ``GPT_OSS_MAX_CAPTURE``) -10.1 / -9.6 %.

V0 and V1 before the FULL_AND_PIECEWISE default (0.8-0.10) keep a flat 0.5 GiB allowance, used
only to warn (the llm-d logs show -0.45 to 1.03 GiB for 0.1x captures: a free-memory difference,
negative when the profile's cached segments are reused).

**The estimate** (``GPUModelRunner.profile_cudagraph_memory``,
``vllm/v1/worker/gpu_model_runner.py``, the same computation in the v0.18.0, v0.19.0, v0.20.0,
v0.21.0, v0.24.0, v0.28.0 and v0.33.0 sdists; 0.24+ add an opt-in encoder-graph term, not
modelled): in a temporary graph pool, for each mode (PIECEWISE, FULL) vLLM captures only the two
largest sizes, each between two
``torch.cuda.mem_get_info()`` reads. The first read-out is the mode's "first capture"; the second
is taken as every other graph's cost, ``per_graph = max(second, 1 << 20)`` ("at least 1 MiB per
graph for driver overhead"). Because "FULL and PIECEWISE graphs share the global pool", the total
is ``max(first captures) + sum over modes of (n - 1) x per_graph`` (the logs' debug lines
"Estimated FULL CUDA graph memory: 260.00 MiB first-capture + (51-1) × 6.00 MiB per-graph").
memfit follows that computation term by term:

- FULL first capture: FlashAttention's split workspace (mechanism 1; none for a float32 model,
  which FlashAttention does not serve: ``FlashAttentionBackend.supported_dtypes`` is fp16 / bf16,
  and the llm-d-planner fp32 log picks TRITON_ATTN and logs a 4 MiB FULL first capture) plus
  :data:`ESTIMATE_FULL_FIRST_EXTRA_BYTES` (the logs: 0-13 MiB over the workspace);
- PIECEWISE first capture: :data:`ESTIMATE_PIECEWISE_FIRST`, fitted: the pool's first fill at
  the largest size grows with the MLP's input projection output (``largest x 2 x intermediate /
  TP x activation bytes``). It decides the total where the workspace is small or absent (Gemma 3
  served by Triton, fp32, TP 4);
- the per-graph samples: :data:`ESTIMATE_SAMPLE_PIECEWISE` / :data:`ESTIMATE_SAMPLE_FULL`,
  least squares per mode on the logged samples (base + per layer + per fused-MoE layer), with
  vLLM's 1 MiB floor (Llama-3.1-8B at PP 4 logs "(51-1) × 1.00 MiB" for its 8-layer stages), plus
  :data:`ESTIMATE_SAMPLE_PER_MLA_LAYER` (DeepSeek-V2-Lite's 10 / 8 MiB over the fit, held-out
  Kimi-VL at TP 1 / 2: 1.38 / 1.13 GiB against 1.19 / 1.04 logged, +16 / +9 %; without it -7 /
  -18 %).

A sample is one free-memory difference: a whole number of 2 MiB pages, so every page it rounds
to moves the total by ``(n - 1)`` pages (0.1 GiB per mode on 51 graphs). memfit predicts the
mean, not the rounding. Two logged samples are not a graph's cost: Llama-3.1-8B at TP 2 and
Mistral-Small W8A8 at TP 2 sample 26 / 24 MiB for PIECEWISE where memfit's mean is 6 / 8 —
20 MiB over, PyTorch's ``kLargeBuffer`` (the caching allocator packs requests of 1-10 MiB into
20 MiB segments, ``c10/cuda/CUDACachingAllocator.cpp``): the sampled capture opened a new
segment, and vLLM extrapolated it 50 times (1.69 / 1.60 GiB estimated against 0.76 / 1.03
captured). Whether a capture opens a segment depends on the pool's free blocks at that moment,
which memfit does not replay: those two logs stay misses (-60 / -48 %), and on 0.20+ such a run
would keep ~1 GiB more out of the KV cache than memfit says. The fit leaves a sample out when
``(n - 1) x sample`` exceeds the whole measured capture (``is_segment_outlier`` in
benchmarks/vllm_startup.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.serving.vllm_matrix import cudagraph_capture_sizes
from memfit.units import MiB

__all__ = [
    "CudaGraphPlan",
    "default_max_capture_size",
    "estimate_sample_bytes",
    "fa_split_workspace_bytes",
    "is_mm_prefix_lm",
    "plan_cudagraphs",
    "vllm_estimate_bytes",
]

#: (base, per layer, per MoE layer) bytes per captured graph, fitted as the module docstring
#: says (``benchmarks/vllm_startup.py`` prints the refit: MiB per graph).
CAPTURE_PER_GRAPH = (int(1.4574 * MiB), int(0.1651 * MiB), int(0.0689 * MiB))
#: bytes per MLA layer per captured graph beyond the terms above (module docstring, 3):
#: DeepSeek-V2-Lite's logged 1.57 GiB capture less memfit's 1,362,161,394 bytes without it, over
#: 102 graphs x 27 MLA layers
CAPTURE_PER_MLA_LAYER = int((1.57 * 2**30 - 1_362_161_394) / (102 * 27))
#: vLLM's estimate (module docstring, "The estimate"): the mean of the one per-graph sample each
#: mode's second-largest capture gives, (base, per layer, per MoE layer) bytes, least squares on
#: the 34 fitted logs' "Estimated PIECEWISE / FULL CUDA graph memory: ... × X MiB per-graph"
#: debug lines (``graph_samples`` in benchmarks/data/vllm_startup_logs.jsonl; two samples left
#: out, see ``is_segment_outlier`` in benchmarks/vllm_startup.py, which prints the refit)
ESTIMATE_SAMPLE_PIECEWISE = (int(-1.7059 * MiB), int(0.2428 * MiB), int(0.0336 * MiB))
ESTIMATE_SAMPLE_FULL = (int(1.1653 * MiB), int(0.1289 * MiB), int(0.0752 * MiB))
#: per MLA layer per sampled graph beyond the terms above, (PIECEWISE, FULL): what
#: DeepSeek-V2-Lite's logged samples (10 / 8 MiB, llm-d-planner log at commit 6417620b) leave over
#: the fitted mean at its 27 layers (26 fused-MoE), per MLA layer. Fitted on that one log, checked
#: on two held out (Kimi-VL-A3B at TP 1 / 2, tests/serving/test_cudagraphs.py)
ESTIMATE_SAMPLE_PER_MLA_LAYER = (
    int(
        (
            10 * MiB
            - ESTIMATE_SAMPLE_PIECEWISE[0]
            - 27 * ESTIMATE_SAMPLE_PIECEWISE[1]
            - 26 * ESTIMATE_SAMPLE_PIECEWISE[2]
        )
        / 27
    ),
    int(
        (
            8 * MiB
            - ESTIMATE_SAMPLE_FULL[0]
            - 27 * ESTIMATE_SAMPLE_FULL[1]
            - 26 * ESTIMATE_SAMPLE_FULL[2]
        )
        / 27
    ),
)
#: ``max(second sample, 1 << 20)`` in ``profile_cudagraph_memory``: "at least 1 MiB per graph for
#: driver overhead"
VLLM_MIN_PER_GRAPH_BYTES = 1 * MiB
#: the FULL mode's first capture beyond FlashAttention's split workspace (the logs: 0-13 MiB,
#: median 4; the graph itself and the FA3 scheduler metadata)
ESTIMATE_FULL_FIRST_EXTRA_BYTES = 4 * MiB
#: the PIECEWISE mode's first capture (the largest capture size, the pool's first fill):
#: (base, multiple of the largest graph's MLP input projection output
#: ``largest x 2 x intermediate / TP x activation bytes``), least squares on the same 34 logs
#: ("... MiB first-capture" of PIECEWISE; residuals -47 to +34 MiB)
ESTIMATE_PIECEWISE_FIRST = (int(72.78 * MiB), 2.0913)
#: ``flash_attn_max_num_splits_for_cuda_graph`` (32 in every modelled release, docstring)
FA_MAX_SPLITS_FOR_CUDA_GRAPH = 32
#: FlashAttention's split accumulators are fp32 (``out_accum``, ``softmax_lse_accum``)
FA_ACCUM_BYTES = 4
#: gpt-oss's own largest capture size when the user sets none
#: (``GptOssForCausalLMConfig.verify_and_update_config``, ``vllm/model_executor/models/config.py``):
#: 992 in 0.11 (vllm-project/vllm#25508: FlashAttention 3's FULL graphs then stopped at 992), 1024
#: from 0.12 (vllm#28345, merged 2025-11-08, before 0.12.0; the llm-d-planner v0.19.0 gpt-oss-20b
#: log captures 83 + 83 graphs, the largest 1024). Not capped by 2 x max_num_seqs.
GPT_OSS_MAX_CAPTURE = {11: 992, 12: 1024}


def default_max_capture_size(model_type: str | None, minor: int) -> int | None:
    """The largest capture size a model's own vLLM config sets when the user sets none (gpt-oss),
    else None (vLLM's ``min(2 x max_num_seqs, 512)``)."""
    if model_type != "gpt_oss" or minor < min(GPT_OSS_MAX_CAPTURE):
        return None
    return GPT_OSS_MAX_CAPTURE[min(minor, max(GPT_OSS_MAX_CAPTURE))]


#: checkpoints vLLM serves with bidirectional attention over image tokens (no FlashAttention):
#: first minor -> the model types ``ModelConfig.is_mm_prefix_lm`` lists from it
#: (``vllm/config/model.py`` of the 0.13 / 0.16 / 0.18 PyPI sdists; absent from 0.11 and 0.12;
#: 0.20+ reads the same list in ``vllm/transformers_utils/model_arch_config_convertor.py``)
MM_PREFIX_LM_MODEL_TYPES = {13: ("gemma3", "paligemma"), 16: ("molmo2",), 18: ("bagel",)}
#: V0 and 0.8-0.10: the allowance for the capture after the KV cache (llm-d H100 logs).
LEGACY_ALLOWANCE_BYTES = 512 * MiB
#: First release with FULL_AND_PIECEWISE by default (``vllm/config/__init__.py``, 0.11.0)
FIRST_MODELLED_MINOR = 11
#: First release whose profile computes the estimate (``profile_cudagraph_memory``, 0.18.0)
FIRST_ESTIMATE_MINOR = 18


@dataclass(frozen=True, kw_only=True)
class CudaGraphPlan:
    """The graphs vLLM captures for one configuration and the bytes memfit counts for them."""

    n_piecewise: int
    n_full: int
    largest: int
    #: what the capture takes after the KV cache ("Graph capturing finished … took X GiB")
    capture_bytes: int
    #: vLLM's own estimate while profiling (0.18+; 0 before): "Estimated CUDA graph memory"
    estimate_bytes: int

    @property
    def n_graphs(self) -> int:
        return self.n_piecewise + self.n_full

    @property
    def estimated(self) -> bool:
        return self.estimate_bytes > 0


def is_mm_prefix_lm(model_type: str | None, minor: int, *, declared: bool | None = None) -> bool:
    """Whether vLLM 0.``minor`` serves a checkpoint of ``model_type`` with bidirectional attention
    over image tokens (``declared``: the config's own ``is_mm_prefix_lm``, read first from 0.18)."""
    if minor < min(MM_PREFIX_LM_MODEL_TYPES):
        return False
    if declared is not None and minor >= 18:
        return declared
    return any(
        model_type in types for first, types in MM_PREFIX_LM_MODEL_TYPES.items() if minor >= first
    )


def fa_split_workspace_bytes(*, largest_full: int, n_heads_per_rank: int, head_dim_v: int) -> int:
    """FlashAttention's split-KV accumulators for the largest FULL graph (module docstring, 1):
    ``splits x B x H x Dv`` fp32 for ``out_accum`` plus ``splits x B x H`` for the LSEs."""
    return (
        FA_MAX_SPLITS_FOR_CUDA_GRAPH * largest_full * n_heads_per_rank * (head_dim_v + 1)
    ) * FA_ACCUM_BYTES


def plan_cudagraphs(
    *,
    minor: int,
    engine: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    n_layers: int,
    enforce_eager: bool,
    sm100: bool = False,
    n_heads_per_rank: int = 0,
    head_dim_v: int = 0,
    n_moe_layers: int = 0,
    flash_attention: bool = True,
    max_capture_size: int | None = None,
    n_mla_layers: int = 0,
    mlp_out_bytes_per_token: int = 0,
    fa_dtype: bool = True,
) -> CudaGraphPlan:
    """What vLLM 0.``minor`` captures for a rank holding ``n_layers`` layers (``n_moe_layers`` of
    them fused-MoE, ``n_heads_per_rank`` query heads of value width ``head_dim_v``; without
    ``flash_attention`` (an mm-prefix checkpoint) no split workspace; ``max_capture_size``:
    ``--max-cudagraph-capture-size``; ``n_mla_layers``: the MLA layers among ``n_layers``;
    ``mlp_out_bytes_per_token``: a token's MLP input projection output on this rank, ``2 x
    intermediate / TP x activation bytes``; ``fa_dtype``: the activations are fp16 / bf16, the
    dtypes FlashAttention serves), and the bytes memfit counts for it (module docstring)."""
    if enforce_eager:
        return CudaGraphPlan(n_piecewise=0, n_full=0, largest=0, capture_bytes=0, estimate_bytes=0)
    ceiling = 1024 if sm100 and minor >= 28 else 512
    sizes = cudagraph_capture_sizes(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        ceiling=ceiling,
        max_capture_size=max_capture_size,
    )
    full = [s for s in sizes if s <= max_num_seqs]
    n = len(sizes) + len(full)
    largest = sizes[-1] if sizes else 0
    workspace = 0
    if flash_attention:
        workspace = fa_split_workspace_bytes(
            largest_full=max(full, default=0),
            n_heads_per_rank=n_heads_per_rank,
            head_dim_v=head_dim_v,
        )

    per_graph = (
        CAPTURE_PER_GRAPH[0]
        + CAPTURE_PER_GRAPH[1] * n_layers
        + CAPTURE_PER_GRAPH[2] * n_moe_layers
        + CAPTURE_PER_MLA_LAYER * n_mla_layers
    )

    if engine != "v1" or minor < FIRST_MODELLED_MINOR:
        capture = LEGACY_ALLOWANCE_BYTES
    else:
        capture = workspace + n * per_graph
    estimate = 0
    if engine == "v1" and minor >= FIRST_ESTIMATE_MINOR:
        estimate = vllm_estimate_bytes(
            n_piecewise=len(sizes),
            n_full=len(full),
            full_first=(workspace if fa_dtype else 0) + ESTIMATE_FULL_FIRST_EXTRA_BYTES,
            piecewise_first=ESTIMATE_PIECEWISE_FIRST[0]
            + int(ESTIMATE_PIECEWISE_FIRST[1] * largest * mlp_out_bytes_per_token),
            n_layers=n_layers,
            n_moe_layers=n_moe_layers,
            n_mla_layers=n_mla_layers,
        )
    return CudaGraphPlan(
        n_piecewise=len(sizes),
        n_full=len(full),
        largest=largest,
        capture_bytes=capture,
        estimate_bytes=estimate,
    )


def estimate_sample_bytes(
    mode: str, *, n_layers: int, n_moe_layers: int, n_mla_layers: int = 0
) -> int:
    """memfit's mean of the per-graph sample vLLM takes for ``mode`` ("PIECEWISE" or "FULL"):
    the second-largest capture's free-memory difference, at least 1 MiB (module docstring)."""
    pw = mode == "PIECEWISE"
    c = ESTIMATE_SAMPLE_PIECEWISE if pw else ESTIMATE_SAMPLE_FULL
    mla = ESTIMATE_SAMPLE_PER_MLA_LAYER[0 if pw else 1] * n_mla_layers
    return max(c[0] + c[1] * n_layers + c[2] * n_moe_layers + mla, VLLM_MIN_PER_GRAPH_BYTES)


def vllm_estimate_bytes(
    *,
    n_piecewise: int,
    n_full: int,
    full_first: int,
    piecewise_first: int,
    n_layers: int,
    n_moe_layers: int,
    n_mla_layers: int = 0,
) -> int:
    """``GPUModelRunner.profile_cudagraph_memory`` (0.18-0.33, module docstring): the largest of
    the modes' first captures (they share one pool) plus, per mode, ``(n - 1)`` x its per-graph
    sample."""
    firsts = [f for f, n in ((piecewise_first, n_piecewise), (full_first, n_full)) if n]
    if not firsts:
        return 0
    extrapolated = sum(
        (n - 1)
        * estimate_sample_bytes(
            mode, n_layers=n_layers, n_moe_layers=n_moe_layers, n_mla_layers=n_mla_layers
        )
        for mode, n in (("PIECEWISE", n_piecewise), ("FULL", n_full))
        if n
    )
    return max(firsts) + extrapolated
