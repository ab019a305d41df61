"""Simulate vLLM's start-up memory accounting: does ``vllm serve`` start, with how much KV cache.

The steps (sources in :mod:`memfit.serving.versions`):

1. ``init_device``: ``requested = total x gpu_memory_utilization``; the free memory after the
   CUDA context (and NCCL for TP/PP > 1) must cover it (V1 0.9+).
2. ``load_model``: weights per rank ("Model loading took X GiB"), less ``--cpu-offload-gb``.
3. ``profile_run``: one forward pass of ``max_num_batched_tokens`` tokens, then the dummy sampler
   pass over ``min(max_num_seqs, max_num_batched_tokens)`` rows of fp32 logits; the torch peak
   increase is the larger of the two. Plus the non-torch increase (NCCL, custom all-reduce).
4. ``available = requested - weights - activation peak - non-torch`` ("Available KV cache
   memory"); blocks, tokens and concurrency as :mod:`memfit.serving.kv_cache` computes them.
5. CUDA graphs are captured after the KV cache is allocated: up to 0.19 their memory is outside
   the budget; from 0.20 vLLM estimates it while profiling ("Estimated CUDA graph memory") and
   takes it out of the KV cache's share (``VllmVersion.cudagraph_in_budget``).
6. From 0.34 the KV cache is sized after warmup and capture from measured memory (the extensible
   KV cache, :mod:`memfit.serving.extensible`); step 4's figure is only its capacity.

Unset flags take the modelled release's defaults (``gpu_memory_utilization`` 0.9, 0.92 from 0.20,
1.0 with 0.34's extensible KV cache; block size 16, 64 from 0.34: memfit.serving.vllm_matrix); an
unset version is the installed vLLM's, else the newest modelled (``resolve_version``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.hardware.catalog import GPU
from memfit.models import ModelSpec
from memfit.serving.cudagraphs import (
    LEGACY_ALLOWANCE_BYTES,
    default_max_capture_size,
    is_mm_prefix_lm,
    plan_cudagraphs,
)
from memfit.serving.extensible import (
    VMM_GRANULE_BYTES,
    ExtensibleSizing,
    size_extensible,
    too_small_error,
)
from memfit.serving.kv_cache import KVPlan, largest_max_model_len, plan_kv
from memfit.serving.layout import (
    LayerKV,
    kv_layers,
    parallel_error,
    pp_layer_counts,
    quantization_error,
    rank_weights,
)
from memfit.serving.versions import (
    VllmVersion,
    get_version,
    release_minor,
    resolve_version,
)
from memfit.serving.vllm_matrix import VllmRelease, release
from memfit.spec.serving import DTYPES, KV_CACHE_DTYPES, VllmConfig
from memfit.units import GiB

__all__ = ["VllmStartup", "simulate_startup", "vllm_total_bytes"]

#: Used before the snapshot: CUDA context + torch (79.18 - 78.57 GiB in the llm-d H100 logs) and,
#: with TP/PP > 1, NCCL communicators (79.18 - 77.64 GiB at TP=2, same source).
CONTEXT_BYTES = int(0.61 * GiB)
CONTEXT_DIST_BYTES = int(1.54 * GiB)
#: Forward-pass elements live per batched token at the profile peak: the residual stream and
#: hidden states (4 h) and the MLP's gate/up output, activation and product (4 I / TP). Fitted to
#: vLLM 0.19's PP=2 Llama-3.1-8B log (1.10 GiB at 8192 tokens, a stage without the sampler).
FWD_HIDDEN_FACTOR = 4
FWD_MLP_FACTOR = 4
#: CUDA graph capture before 0.18 ("Graph capturing finished … took X GiB"): -0.45 to 1.03 GiB
#: in the llm-d logs (piecewise graphs, 8B-120B); a fixed allowance, used only to warn. From 0.18
#: memfit.serving.cudagraphs follows vLLM's own estimate by capture sizes.
CUDA_GRAPH_BYTES = LEGACY_ALLOWANCE_BYTES
#: vLLM ``_get_and_verify_max_len`` (vllm/config/model.py): the length a config without any of
#: max_position_embeddings / n_positions / max_seq_len / seq_length / … is given.
DEFAULT_MAX_MODEL_LEN = 2048
#: ModelSpec tasks vLLM serves as a generative decoder (text, or a multimodal model's text).
DECODER_TASKS = ("causal-lm", "image-text-to-text")
#: ``EngineArgs.get_batch_defaults``: GPUs of 70 GiB or more (A100s excluded) get the large ones.
LARGE_GPU_BYTES = 70 * GiB


@dataclass(frozen=True, kw_only=True)
class VllmStartup:
    """What vLLM does at start-up for one configuration on one GPU (figures per rank)."""

    version: str
    engine: str
    gpu: str
    total_bytes: int
    requested_bytes: int
    weights_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv: KVPlan
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_cache_dtype: str
    weight_format: str
    starts: bool
    error: str | None
    largest_max_model_len: int | None
    smallest_gpu_memory_utilization: float | None
    notes: tuple[str, ...] = field(default=())
    #: what the process holds before vLLM's budget: the CUDA context (and NCCL with TP/PP > 1)
    context_bytes: int = CONTEXT_BYTES
    #: vLLM refuses the parallel layout before it looks at memory (``error`` says why): no
    #: memory setting starts it
    refused_layout: bool = False
    #: vLLM's own CUDA graph estimate while profiling (0.18+; 0 before or with --enforce-eager)
    cuda_graph_estimate_bytes: int = 0
    #: 0.20+: the CUDA graph estimate is inside vLLM's budget (taken from the KV cache's share)
    cudagraph_in_budget: bool = False
    #: the release modelled ("0.34.0", "0.19") and why: "--vllm-version", "installed" or
    #: "newest modelled"
    release: str = ""
    version_source: str = "--vllm-version"
    #: the gpu_memory_utilization vLLM resolves (the flag, else the release's default)
    gpu_memory_utilization: float = 0.9
    #: 0.34+: the extensible KV cache's measurement after warmup (None before 0.34)
    extensible: ExtensibleSizing | None = None

    # -- the Answer protocol (memfit.estimate.answer) -------------------------------------------
    @property
    def peak_allocated_bytes(self) -> int:
        """Torch's tensors once serving: weights, the KV cache, the activation peak."""
        return self.weights_bytes + self.kv.kv_cache_bytes + self.activation_peak_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        """The caching allocator keeps the profile run's activation segments: as allocated."""
        return self.peak_allocated_bytes

    @property
    def device_used_bytes(self) -> int:
        """What nvidia-smi shows once it serves: the context, torch's reserved bytes, the
        non-torch increase (NCCL, custom all-reduce) and the CUDA graphs captured after."""
        return (
            self.context_bytes
            + self.peak_reserved_bytes
            + self.non_torch_bytes
            + self.cuda_graph_bytes
        )

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """No measured range: vLLM's own accounting is simulated (docs/serving.md)."""
        return {}

    @property
    def peak_components(self) -> dict[str, int]:
        return {
            "parameters": self.weights_bytes,
            "kv_cache": self.kv.kv_cache_bytes,
            "activations": self.activation_peak_bytes,
        }

    @property
    def engine_reason(self) -> str:
        """``engine`` is vLLM's (v0 / v1); memfit answers by simulating its start-up."""
        return f"vLLM {self.version} start-up accounting simulated (memfit.serving.startup)"

    @property
    def verdict(self) -> None:
        """None: vLLM's question is whether it starts (``starts``, ``error``), not a fit."""
        return None

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` record (``memfit vllm``; the CLI adds the ``command``)."""
        kv = self.kv
        return {
            "runtime": "vllm",
            "vllm_version": self.version,
            "vllm_release": self.release or self.version,
            "vllm_version_source": self.version_source,
            "engine": self.engine,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "extensible_kv_cache": self.extensible is not None,
            "kv_cache_capacity_bytes": (
                self.extensible.capacity_bytes if self.extensible is not None else None
            ),
            "gpu": self.gpu,
            "total_bytes": self.total_bytes,
            "requested_bytes": self.requested_bytes,
            "weights_bytes": self.weights_bytes,
            "weight_format": self.weight_format,
            "activation_peak_bytes": self.activation_peak_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes,
            "cuda_graph_estimate_bytes": self.cuda_graph_estimate_bytes,
            "available_kv_cache_bytes": kv.available_bytes,
            "kv_cache_bytes": kv.kv_cache_bytes,
            "kv_cache_blocks": kv.num_blocks,
            "kv_cache_tokens": kv.kv_cache_tokens,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_groups": list(kv.kinds),
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "max_concurrency": round(kv.max_concurrency, 4),
            "starts": self.starts,
            "error": self.error,
            "largest_max_model_len": self.largest_max_model_len,
            "smallest_gpu_memory_utilization": self.smallest_gpu_memory_utilization,
            "notes": list(self.notes),
        }

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv.kv_cache_bytes

    @property
    def kv_cache_tokens(self) -> int:
        return self.kv.kv_cache_tokens

    @property
    def max_concurrency(self) -> float:
        return self.kv.max_concurrency

    @property
    def available_kv_bytes(self) -> int:
        return self.kv.available_bytes

    def log_lines(self) -> list[str]:
        """The lines vLLM prints at start-up, as this version words them."""
        if self.extensible is not None:
            return self._extensible_lines(self.extensible)
        g = 1 / GiB
        lines = [f"Model loading took {self.weights_bytes * g:.4f} GiB memory"]
        if self.cuda_graph_estimate_bytes:
            lines.append(
                f"Estimated CUDA graph memory: {self.cuda_graph_estimate_bytes * g:.2f} GiB total"
            )
        lines.append(f"Available KV cache memory: {self.kv.available_bytes * g:.2f} GiB")
        if self.kv.num_blocks > 0:
            if self.engine == "v0":
                lines.append(f"# GPU blocks: {self.kv.num_blocks}")
            lines.append(f"GPU KV cache size: {self.kv.kv_cache_tokens:,} tokens")
            lines.append(
                f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
                f"{self.kv.max_concurrency:.2f}x"
            )
        return lines

    def _extensible_lines(self, ext: ExtensibleSizing) -> list[str]:
        """vLLM 0.34's lines (gpu_worker.py, extensible_kv_cache.py, kv_cache_utils.py
        ``update_kv_cache_capacity``), figures as its ``format_gib`` rounds them."""
        kv = self.kv
        per_block = kv.page_bytes * kv.group_size
        lines = [
            f"Model loading took {round(self.weights_bytes / GiB, 2)} GiB memory",
            f"Available KV cache memory: {round(ext.capacity_bytes / GiB, 2)} GiB",
        ]
        # vLLM stops at the capacity check (get_kv_cache_configs) before warmup when the
        # reserved capacity, less the null block, cannot hold one max_model_len request
        if ext.capacity_bytes - per_block >= kv.needed_bytes:
            lines.append(ext.log_line(kv.num_blocks, per_block))
        if self.starts:  # shrink_kv_cache_configs raised otherwise, before the cache is extended
            lines.append(ext.committed_line(kv.num_blocks, per_block))
            lines.append(
                f"GPU KV cache size: {kv.kv_cache_tokens:,} tokens, Maximum concurrency for "
                f"{self.max_model_len:,} tokens per request: {kv.max_concurrency:.2f}x"
            )
        return lines


def default_utilization(v: VllmVersion, row: VllmRelease | None) -> float:
    """vLLM's ``gpu_memory_utilization`` when the flag is unset: 1.0 with the extensible KV cache
    (``CacheConfig.resolved_gpu_memory_utilization``), else the release's field default."""
    if v.extensible_kv_cache:
        return 1.0
    return row.gpu_memory_utilization if row is not None else 0.9


def vllm_total_bytes(gpu: GPU) -> int:
    """``torch.cuda.mem_get_info()[1]`` on ``gpu``: the catalog's capacity (the torch-visible total
    where observed -- H100 80GB: 79.19 GiB, vLLM's own logs -- else its estimate), the figure every
    verdict judges against (:attr:`memfit.hardware.gpu.GPU.capacity_bytes`)."""
    return gpu.capacity_bytes


def model_dtype(spec: ModelSpec, config: VllmConfig, gpu: GPU) -> str:
    """vLLM's ``--dtype auto``: config.json's torch_dtype, with fp32 (or none) cast to bf16 (fp16
    on GPUs without bf16), as ``_get_and_verify_dtype`` does."""
    if config.dtype != "auto":
        return {"half": "float16", "float": "float32"}.get(config.dtype, config.dtype)
    d = spec.dtype or "float32"
    if d in ("float32", "float") or d not in ("float16", "bfloat16"):
        return "bfloat16" if gpu.supports_bf16 else "float16"
    if d == "bfloat16" and not gpu.supports_bf16:
        return "float16"
    return d


def derived_max_model_len(spec: ModelSpec) -> int | None:
    """vLLM's derived max_model_len: the config's positions, scaled by a yarn / dynamic / linear
    rope factor (llama3 / longrope keep it), as ``_get_and_verify_max_len`` does."""
    text = spec.text or spec
    base = text.context_limit
    if base is None:
        return None
    rope = text.get("rope_scaling")
    if isinstance(rope, dict):
        kind = str(rope.get("rope_type") or rope.get("type") or "")
        factor = rope.get("factor")
        if kind not in ("su", "longrope", "llama3", "default", "") and isinstance(
            factor, int | float
        ):
            if kind == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
                base = rope["original_max_position_embeddings"]
            base = int(base * factor)
    return base


def served_as_decoder(spec: ModelSpec) -> None:
    """NotModelledError unless ``spec`` is a decoder memfit models under vLLM (an encoder, an
    encoder-decoder or a vision / audio classifier is said to be not modelled, with its task)."""
    text = spec.text or spec
    if spec.is_encoder_decoder or spec.task not in DECODER_TASKS:
        kind = f"an encoder-decoder, {spec.task}" if spec.is_encoder_decoder else spec.task
        raise NotModelledError(
            f"vLLM serving of {spec.model_type or 'this model'} ({kind}) is not modelled: "
            "memfit models vLLM's generative decoders",
            engine="vllm",
        )
    if text.n_layers is None or text.hidden_size is None:
        raise NotModelledError(
            f"vLLM serving of {spec.model_type!r} is not modelled: its config gives no layer "
            "count or hidden size",
            engine="vllm",
        )


def batch_defaults(gpu: GPU, total_bytes: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vllm serve uses when not given (V1)."""
    if total_bytes >= LARGE_GPU_BYTES and not gpu.name.startswith("A100"):
        return 8192, 1024
    return 2048, 256


def graph_shape(
    spec: ModelSpec, *, tp: int, pp: int, minor: int
) -> tuple[int, int, int, int, bool]:
    """What memfit.serving.cudagraphs sizes a rank's graphs by: the layers of the stage holding
    the most, the fused-MoE ones among them (DeepSeek's ``first_k_dense_replace`` leading dense
    layers sit on the first stage), the attention's query heads per rank and their value width
    (MLA decodes in the ``kv_lora_rank`` latent), and whether FlashAttention serves it (not an
    mm-prefix checkpoint, ``memfit.serving.cudagraphs.is_mm_prefix_lm``)."""
    text = spec.text or spec
    n_layers = max(pp_layer_counts(text.n_layers or 0, pp))
    n_moe = 0
    if text.n_experts:
        dense = int(text.raw.get("first_k_dense_replace") or 0) if pp == 1 else 0
        n_moe = max(0, n_layers - dense)
    heads = text.n_heads or 0
    head_dim = text.head_dim or ((text.hidden_size or 0) // heads if heads else 0)
    declared = spec.raw.get("is_mm_prefix_lm")
    fa = not is_mm_prefix_lm(
        spec.model_type, minor, declared=None if declared is None else bool(declared)
    )
    return n_layers, n_moe, heads // tp, int(text.raw.get("kv_lora_rank") or head_dim), fa


#: ``FlashAttentionBackend.supported_dtypes`` (``vllm/v1/attention/backends/flash_attn.py`` of
#: the v0.19.0 sdist): a float32 model is served by TRITON_ATTN ("FLASH_ATTN: [dtype not
#: supported]" in the llm-d-planner fp32 log), without FlashAttention's split workspace
FLASH_ATTENTION_DTYPES = ("float16", "bfloat16")


def _mlp_intermediate(spec: ModelSpec) -> int:
    """A token's MLP width: the dense ``intermediate_size``, or a fused-MoE layer's routed
    experts' (``top_k x expert_intermediate_size``)."""
    text = spec.text or spec
    if text.n_experts and text.expert_intermediate_size:
        return (text.n_experts_per_token or 1) * text.expert_intermediate_size
    return text.intermediate_size or 4 * (text.hidden_size or 0)


def _activation_peak(
    spec: ModelSpec, *, tokens: int, rows: int, tp: int, act_bytes: int, v: VllmVersion
) -> int:
    text = spec.text or spec
    h = text.hidden_size or 0
    inter = text.intermediate_size or 4 * h
    workspace = 0
    if text.n_experts and text.expert_intermediate_size:
        topk = text.n_experts_per_token or 1
        inter = topk * text.expert_intermediate_size
        inter += (text.n_shared_experts or 0) * (text.shared_expert_intermediate_size or 0)
        if v.moe_workspace_persists:  # fused-MoE workspaces held by the WorkspaceManager
            i_rank = text.expert_intermediate_size // tp
            workspace = tokens * topk * (max(i_rank, h) + max(2 * i_rank, h)) * act_bytes
    forward = tokens * act_bytes * (FWD_HIDDEN_FACTOR * h + FWD_MLP_FACTOR * inter // tp)
    vocab = text.vocab_size or 0
    sampler = tokens * h * act_bytes + int(rows * vocab * v.sampler_bytes_per_logit)
    return int(max(forward, sampler + workspace))


def simulate_startup(
    spec: ModelSpec, gpu: GPU, config: VllmConfig, *, total_bytes: int | None = None
) -> VllmStartup:
    """Run vLLM's start-up accounting for ``spec`` served with ``config`` on ``gpu``
    (``total_bytes``: the total a log printed, instead of the GPU's usual one)."""
    modelled = resolve_version(config.vllm_version)
    v = get_version(modelled.release)
    minor = release_minor(modelled.release)
    row = release(minor)
    util = (
        config.gpu_memory_utilization
        if config.gpu_memory_utilization is not None
        else default_utilization(v, row)
    )
    block_size = config.block_size or (row.block_size if row is not None else 16)
    if config.max_cudagraph_capture_size is not None and (v.engine != "v1" or minor < 13):
        raise SpecError(
            "--max-cudagraph-capture-size is a vLLM 0.13+ flag (arg_utils.py of the 0.13 sdist); "
            f"vLLM {modelled.release} has no such flag: pass --vllm-version 0.13 or later, or "
            "drop it"
        )
    total = total_bytes or vllm_total_bytes(gpu)
    notes: list[str] = []
    if modelled.note:
        notes.append(modelled.note)
    dtype = model_dtype(spec, config, gpu)
    act_bytes = DTYPES[dtype]
    kv_bytes = KV_CACHE_DTYPES[config.kv_cache_dtype] or act_bytes
    served_as_decoder(spec)
    derived = derived_max_model_len(spec)
    L = config.max_model_len or derived
    if L is None:  # vLLM's _get_and_verify_max_len: no length key in the config -> 2048
        L = derived = DEFAULT_MAX_MODEL_LEN
        notes.append(
            f"config.json gives no max_position_embeddings (or another length key): vLLM assumes "
            f"{DEFAULT_MAX_MODEL_LEN} tokens, as here; pass --max-model-len to set it"
        )
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if v.engine == "v1":
        d_tokens, d_seqs = batch_defaults(gpu, total)
    else:
        d_tokens, d_seqs = (max(L, 2048) if L <= 32768 else 2048), 256
    tokens = config.max_num_batched_tokens or d_tokens
    seqs = config.max_num_seqs or d_seqs
    rows = min(seqs, tokens)
    w = rank_weights(
        spec,
        tp=tp,
        pp=pp,
        dtype=dtype,
        quantization=config.quantization,
        compute_capability=gpu.compute_capability,
        vllm_minor=minor,
    )
    if w.note:
        notes.append(w.note)
    weights = max(0, w.weights_bytes - int(config.cpu_offload_gb * GiB))
    act = _activation_peak(spec, tokens=tokens, rows=rows, tp=tp, act_bytes=act_bytes, v=v)
    non_torch = v.non_torch_tp_bytes if tp > 1 else v.non_torch_bytes
    requested = int(total * util)
    if v.extensible_kv_cache:  # request_memory: math.ceil(total x utilization)
        requested = math.ceil(total * util)
    g_layers, g_moe, g_heads, g_dv, g_fa = graph_shape(spec, tp=tp, pp=pp, minor=minor)
    cg = plan_cudagraphs(
        minor=minor,
        engine=v.engine,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        enforce_eager=config.enforce_eager,
        sm100=(gpu.compute_capability or (0, 0))[0] == 10,
        n_layers=g_layers,
        n_moe_layers=g_moe,
        n_heads_per_rank=g_heads,
        head_dim_v=g_dv,
        flash_attention=g_fa,
        max_capture_size=config.max_cudagraph_capture_size
        or default_max_capture_size((spec.text or spec).model_type, minor),
        n_mla_layers=g_layers if (spec.text or spec).raw.get("kv_lora_rank") else 0,
        mlp_out_bytes_per_token=2 * _mlp_intermediate(spec) // tp * act_bytes,
        fa_dtype=dtype in FLASH_ATTENTION_DTYPES,
    )
    graphs = cg.capture_bytes
    # 0.20+: the estimated CUDA graph memory is profiled and kept out of the KV budget
    in_budget = cg.estimate_bytes if v.cudagraph_in_budget else 0
    available = requested - weights - act - non_torch - in_budget
    all_layers = kv_layers(spec, tp=tp, kv_bytes=kv_bytes)
    stage = max(pp_layer_counts(len(all_layers), pp))  # the stage holding the most layers
    layers = all_layers[-stage:]
    kv_args: dict[str, Any] = dict(
        block_size=block_size,
        max_num_batched_tokens=tokens,
        hybrid_allocator=v.hybrid_allocator,
        group_ratio=row.kv_group_ratio if row is not None else 1.0,
    )
    kv = plan_kv(
        layers,
        available_bytes=available,
        max_model_len=L,
        tokens_from_concurrency=v.tokens_from_concurrency,
        **kv_args,
    )
    if config.world_size > 1:
        context = v.context_dist_bytes or CONTEXT_DIST_BYTES
    else:
        context = v.context_bytes or CONTEXT_BYTES
    ext: ExtensibleSizing | None = None
    if v.extensible_kv_cache:  # 0.34+: sized after warmup and capture; `kv` was the capacity
        ext = size_extensible(
            total_bytes=total,
            context_bytes=context,
            requested_bytes=requested,
            weights_bytes=weights,
            non_torch_bytes=non_torch,
            activation_bytes=act,
            graph_bytes=0 if config.enforce_eager else graphs,
            n_segments=kv.group_size,
        )
        per_block = kv.page_bytes * kv.group_size
        blocks = ext.blocks_within(per_block, kv.num_blocks)
        kv = plan_kv(
            layers,
            available_bytes=blocks * per_block,
            max_model_len=L,
            tokens_from_concurrency=v.tokens_from_concurrency,
            **kv_args,
        )
    # vLLM's preconditions come before any memory: the layout, the quantization on this GPU
    method = "mxfp4" if w.format == "mxfp4" else config.quantization
    refused = (
        architecture_error(spec, v)
        or parallel_error(spec, tp=tp)
        or quantization_error(method, gpu)
    )
    if refused is not None:
        notes.append(refused[1])
    if refused:
        error: str | None = refused[0]
    elif ext is not None:
        error = _extensible_error(config, ext, kv, L, derived, layers, kv_args, util)
        notes.append(
            f"vLLM 0.{minor} sizes the KV cache from the memory free after warmup and CUDA graph "
            "capture (the extensible KV cache): memfit simulates that measurement with its own "
            "activation-peak and CUDA-graph figures; the growth of torch's reservation during "
            "the sizing steps is measured by vLLM and not modelled (assumed not to exceed the "
            "activation peak)"
        )
    else:
        error = _error(v, config, util, total, requested, context, kv, L, derived, layers, kv_args)
    if ext is None and error is None and requested + graphs - in_budget + context > total:
        notes.append(
            f"gpu_memory_utilization {util} leaves "
            f"{(total - requested - context) / GiB:.2f} GiB outside vLLM's budget; CUDA graph "
            f"capture (~{graphs / GiB:.1f} GiB) may run out of memory: lower it or pass "
            "--enforce-eager"
        )
    fixed = weights + act + non_torch + in_budget
    if ext is not None:  # the pool less the null block; graphs and the margin come out too
        available = max(0, (kv.num_blocks - 1) * kv.page_bytes * kv.group_size)
    largest = (
        largest_max_model_len(
            layers, available_bytes=available, upper=max(derived or L, L), **kv_args
        )
        if available > 0 and refused is None
        else 0
    )
    smallest = _smallest_utilization(fixed, kv, total, context, ext, refused is not None)
    return VllmStartup(
        version=v.name,
        engine=v.engine,
        gpu=gpu.name,
        total_bytes=total,
        requested_bytes=requested,
        weights_bytes=weights,
        activation_peak_bytes=act,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs,
        # profile_cudagraph_memory returns 0 with the extensible KV cache (graphs are measured)
        cuda_graph_estimate_bytes=0 if ext is not None else cg.estimate_bytes,
        kv=kv,
        max_model_len=L,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        block_size=block_size,
        kv_cache_dtype=config.kv_cache_dtype if config.kv_cache_dtype != "auto" else dtype,
        weight_format=w.format,
        starts=error is None,
        error=error,
        largest_max_model_len=largest,
        smallest_gpu_memory_utilization=smallest,
        notes=tuple(notes),
        context_bytes=context,
        refused_layout=refused is not None,
        cudagraph_in_budget=v.cudagraph_in_budget,
        release=modelled.release,
        version_source=modelled.source,
        gpu_memory_utilization=util,
        extensible=ext,
    )


def _smallest_utilization(
    fixed: int,
    kv: KVPlan,
    total: int,
    context: int,
    ext: ExtensibleSizing | None,
    refused: bool,
) -> float | None:
    """The smallest ``--gpu-memory-utilization`` (two decimals) whose budget holds the fixed
    bytes and one max_model_len request; None when none does. With the extensible KV cache the
    budget must also hold the graphs and the transient kept free, and the device's headroom
    less the margin must hold the request whatever the utilization."""
    if refused:
        return None
    if ext is None:
        util = math.ceil((fixed + kv.needed_bytes) / total * 100) / 100
        return util if total * util + context <= total else None
    pool_block = kv.page_bytes * kv.group_size
    need = kv.needed_bytes + pool_block + ext.n_segments * VMM_GRANULE_BYTES
    headroom = ext.free_bytes + ext.committed_bytes
    if headroom - ext.margin_bytes - ext.transient_bytes < need:
        return None
    used = total - context - headroom  # weights, non-torch, graphs
    return min(1.0, math.ceil((used + ext.transient_bytes + need) / total * 100) / 100)


#: Architectures vLLM added after the V1 engine: (first minor release that loads them, the
#: architecture name vLLM's registry knows). gpt-oss: ``GptOssForCausalLM`` with MXFP4 MoE,
#: first released in v0.10.1 (vllm/model_executor/models/registry.py).
FIRST_VERSION = {"gpt_oss": (10, "GptOssForCausalLM")}


def architecture_error(spec: ModelSpec, v: VllmVersion) -> tuple[str, str] | None:
    """vLLM's refusal of an architecture its version does not know yet, or None."""
    first = FIRST_VERSION.get(spec.model_type or "")
    minor = int(v.name.split(".")[1])
    if first is None or minor >= first[0]:
        return None
    return (
        f"ValueError: Model architectures ['{first[1]}'] are not supported for now.",
        f"vLLM {v.name} predates {first[1]} (first served by vLLM 0.{first[0]}.x): pass "
        f"--vllm-version 0.{first[0]} or later",
    )


def _too_long(config: VllmConfig, derived: int | None) -> str | None:
    """``_get_and_verify_max_len``'s refusal of a --max-model-len above the config's."""
    if config.max_model_len is not None and derived is not None and config.max_model_len > derived:
        return (
            f"ValueError: User-specified max_model_len ({config.max_model_len}) is greater than "
            f"the derived max_model_len (max_position_embeddings={derived} in model's "
            "config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    return None


def _extensible_error(
    config: VllmConfig,
    ext: ExtensibleSizing,
    kv: KVPlan,
    L: int,
    derived: int | None,
    layers: list[LayerKV],
    kv_args: dict[str, Any],
    util: float,
) -> str | None:
    """vLLM 0.34's error with the extensible KV cache, None when it starts: the capacity checked
    before warmup (``get_kv_cache_configs``), then the measured size (``shrink_kv_cache_configs``);
    both hold back the null block."""
    too_long = _too_long(config, derived)
    if too_long is not None:
        return too_long
    pool_block = kv.page_bytes * kv.group_size
    for pool, after in ((ext.capacity_bytes - pool_block, False),
                        ((kv.num_blocks - 1) * pool_block, True)):  # fmt: skip
        est = (
            largest_max_model_len(layers, available_bytes=pool, upper=L, **kv_args)
            if pool > 0
            else 0
        )
        error = too_small_error(
            available_bytes=pool if ext.capacity_bytes > 0 else 0,
            needed_bytes=kv.needed_bytes,
            max_model_len=L,
            estimated_max_len=est,
            utilization=util,
            after_warmup=after,
        )
        if error is not None:
            return error
    return None


def _error(
    v: VllmVersion,
    config: VllmConfig,
    util: float,
    total: int,
    requested: int,
    context: int,
    kv: KVPlan,
    L: int,
    derived: int | None,
    layers: list[LayerKV],
    kv_args: dict[str, Any],
) -> str | None:
    """vLLM's own error for this start-up, None when it starts."""
    g = 1 / GiB
    too_long = _too_long(config, derived)
    if too_long is not None:
        return too_long
    if v.name != "0.6" and total - context < requested:
        return (
            f"ValueError: Free memory on device ({(total - context) * g:.2f}/{total * g:.2f} GiB) "
            f"on startup is less than desired GPU memory utilization "
            f"({util}, {requested * g:.2f} GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes."
        )
    if kv.available_bytes <= 0 or kv.num_blocks <= 0:
        return (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    if v.engine == "v0":
        capacity = kv.num_blocks * kv_args["block_size"]
        if capacity < L:
            return (
                f"ValueError: The model's max seq len ({L}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({capacity}). Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                "engine."
            )
        return None
    if kv.needed_bytes > kv.available_bytes:
        est = largest_max_model_len(layers, available_bytes=kv.available_bytes, upper=L, **kv_args)
        return (
            f"ValueError: To serve at least one request with the models's max seq len ({L}), "
            f"({kv.needed_bytes * g:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({kv.available_bytes * g:.2f} GiB). Based on the "
            f"available memory, the estimated maximum model length is {est}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )
    return None


@dataclass(frozen=True, kw_only=True)
class NotModelledServing:
    """A serving question memfit does not model for vLLM (``reason``), and the nearest answer it
    gives: the weights alone in the model dtype against vLLM's budget, and the command that
    estimates the model's inference outside vLLM."""

    reason: str
    gpu: str
    weights_bytes: int | None
    requested_bytes: int
    nearest_command: str

    @property
    def weights_exceed_budget(self) -> bool:
        return self.weights_bytes is not None and self.weights_bytes > self.requested_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "runtime": "vllm",
            "modelled": False,
            "not_modelled": self.reason,
            "gpu": self.gpu,
            "weights_bytes": self.weights_bytes,
            "requested_bytes": self.requested_bytes,
            "weights_exceed_budget": self.weights_exceed_budget,
            "nearest_command": self.nearest_command,
            "starts": None,
        }


def not_modelled_answer(
    spec: ModelSpec | None, model: str, gpu: GPU, config: VllmConfig, reason: str
) -> NotModelledServing:
    """The nearest answer to a vLLM question memfit does not model (``reason``)."""
    weights = None
    if spec is not None and spec.n_params is not None:
        weights = spec.n_params * DTYPES[model_dtype(spec, config, gpu)]
    util = config.gpu_memory_utilization
    if util is None:  # the newest modelled release's default (the asked one is not modelled)
        newest = resolve_version(None).release
        util = default_utilization(get_version(newest), release(release_minor(newest)))
    return NotModelledServing(
        reason=reason,
        gpu=gpu.name,
        weights_bytes=weights,
        requested_bytes=int(vllm_total_bytes(gpu) * util),
        nearest_command=f"memfit estimate {model} --mode infer --gpu {gpu.name}",
    )
