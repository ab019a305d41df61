"""Simulate SGLang's start-up memory accounting: does ``python -m sglang.launch_server`` start,
with how many KV-cache tokens (torch-free).

SGLang 0.5, as its source does it (sgl-project/sglang):

1. ``server_args.py`` ``ServerArgs._handle_gpu_memory_settings``: from the GPU's memory
   (``nvidia-smi`` total, MiB) pick ``chunked_prefill_size`` and ``cuda_graph_max_bs`` by memory
   tier and TP, then ``mem_fraction_static = round((gpu_mem - reserved_mem) / gpu_mem, 3)`` with
   ``reserved_mem = 512 + max(chunked_prefill_size, 2048) x 1.5 + cuda_graph_max_bs x 2 +
   tp x pp / 8 x 1024`` MiB (+ DP-attention padding), at least 10 GiB on GPUs over 60 GiB. The
   same reserve is in the current main branch (``python/sglang/srt/runtime_context.py``
   ``pre_capture_activation_reserve_mb``, commit b404e8e50d4f657bbf03beb6d345c87d7e0ee5f3).
   That is the 0.5.3+ rule; 0.4.0-0.4.6 and 0.4.7-0.5.2 set the default otherwise
   (``--sglang-version``; :mod:`memfit.serving.sglang_defaults`). Steps 2-5 are the same in
   every modelled release.
2. ``model_executor/model_runner.py``: ``init_torch_distributed`` measures the free memory after
   the CUDA context and NCCL ("Load weight begin. avail mem=…"): ``total_gpu_memory``;
   ``load_model`` loads the weights ("Load weight end. … mem usage=…"; what that holds beyond
   the weights, the allocator's segment tails, the fp32 rotary cache and, at TP 1, the first
   CUDA kernels' memory before 0.5.8: :mod:`memfit.serving.sglang_load`).
3. ``profile_max_num_token`` (commit 01cc04e2b5b01ce379698a3fee1bd17706e1d0ec and later):
   ``rest = avail_after_weights - total_gpu_memory x (1 - mem_fraction_static)``;
   ``max_total_num_tokens = rest // cell_size`` where ``cell_size`` is the KV bytes of one token
   over all layers on a rank (``kv_heads/tp x head_dim x 2 x layers x dtype``; MLA:
   ``(kv_lora_rank + qk_rope_head_dim) x layers x dtype``), capped by ``--max-total-tokens`` and
   rounded down to ``--page-size``. ``<= 0`` raises "Not enough memory. Please try to increase
   --mem-fraction-static." (``model_runner.py``; ``model_executor/pool_configurator.py`` at
   003fca8027387a3d6565b2c08e497e3020ac6211 appends the current value).
4. ``init_memory_pool``: ``max_num_reqs = min(max(tokens / context_len x 512, 2048), 4096)``
   unless ``--max-running-requests``; ``ReqToTokenPool`` holds ``max_num_reqs x (context_len +
   4)`` int32; the KV pool ``(tokens + page_size)`` slots per layer ("KV Cache is allocated.
   #tokens: …, K size: … GB, V size: … GB"; "Memory pool end. avail mem=…").
5. ``cuda_graph_runner.py`` captures the decode batch sizes up to ``cuda_graph_max_bs`` out of
   what the pool left ("Capture cuda graph end. … mem usage=…", by capture sizes, layers,
   vocabulary and context: :mod:`memfit.serving.sglang_graphs`); an out-of-memory there is
   "Capture cuda graph failed".

6. Hybrid sliding-window models whose architecture SGLang lists in ``is_hybrid_swa_model``
   (``python/sglang/srt/configs/model_config.py``: gpt-oss, Llama 4, Gemma 4, MiMo-V2, Step-3.5;
   not Gemma 2 / 3, whose pool is sized as full attention) get the SWA pool
   (``model_runner_kv_cache_mixin.py`` ``set_num_tokens_hybrid_swa``, sgl-project/sglang commit
   226149ac457bd1a1b5d450f55c01f72f604320d6): the tokens of the per-layer profile times the layer
   count are split so that ``swa_tokens = full_tokens x swa_full_tokens_ratio`` (0.8 by default,
   ``server_args.py``): ``full = int(tokens x layers / (ratio x swa_layers + full_layers))``,
   both rounded down to the page size; ``max_total_num_tokens`` is then the full layers' count
   ("Use sliding window memory pool. full_layer_tokens=…, swa_layer_tokens=…").

"GB" in SGLang's logs is GiB (``get_available_gpu_memory`` divides by ``1 << 30``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.errors import NotModelledError
from memfit.hardware.catalog import GPU
from memfit.models import ModelSpec
from memfit.serving.layout import LayerKV, kv_layers, parallel_error, rank_weights
from memfit.serving.sglang_defaults import default_mem_fraction_static, gpu_memory_defaults
from memfit.serving.sglang_graphs import (
    attn_state_bytes_per_slot,
    capture_batch_sizes,
    cublas_workspace_bytes,
    keeps_fa3_page_table_copies,
    runs_flashinfer_decode,
    sglang_graph_bytes,
    shares_logits_buffer,
    triton_split_bytes,
)
from memfit.serving.sglang_load import load_overhead_bytes
from memfit.serving.startup import model_dtype, served_as_decoder, vllm_total_bytes
from memfit.spec.serving import DTYPES, VllmConfig
from memfit.spec.sglang import SGLANG_KV_CACHE_DTYPES, SglangConfig
from memfit.units import GiB, MiB

__all__ = [
    "SglangStartup",
    "capture_batch_sizes",
    "default_mem_fraction_static",
    "gpu_memory_defaults",
    "simulate_sglang",
    "sglang_context_length",
]

#: ``max_num_reqs`` when not given: tokens / context_len x 512, clamped to [2048, 4096].
REQS_PER_CONTEXT = 512
MIN_REQS, MAX_REQS = 2048, 4096
#: ReqToTokenPool rows are ``context_len + 4`` int32 entries.
REQ_ROW_EXTRA, REQ_ENTRY_BYTES = 4, 4
#: Memory taken before "Load weight begin" (CUDA context, torch, NCCL; with TP > 1 on NVLink
#: GPUs or two PCIe GPUs, SGLang's custom all-reduce buffers too): total - "avail mem" at load
#: begin in benchmarks/data/sglang_logs.jsonl: 4 x L4 (PCIe, no custom all-reduce): 22.16 (the
#: L4's torch-visible total, memfit.hardware) - 21.63 = 0.53 GiB (the file's "context_gb" 0.73
#: was taken against the 22.36 GiB serving assumed before the catalog's capacity was observed);
#: 8 x H200 (NVLink): 139.80 - 137.29 = 2.51 GiB (sgl-project/sglang#11716).
CONTEXT_BYTES = int(0.53 * GiB)
CONTEXT_TP_BYTES = int(2.5 * GiB)
#: "Load weight end … mem usage" minus the weights memfit counts, for layouts whose load
#: memfit.serving.sglang_load does not replay (MLA, quantized checkpoints or ``--quantization``):
#: 15.54 GiB logged vs 15.29 GiB of QwQ-32B weights per rank on 4 x L4 (benchmarks/data/
#: sglang_logs.jsonl): 0.25 GiB, fitted on that one log (the replay gives 0.22 GiB of
#: allocator tails + 0.03 GiB of fp32 rotary cache for it). Dense and MoE bf16 / fp16
#: decoders use the replay.
LOAD_OVERHEAD_BYTES = int(0.25 * GiB)


@dataclass(frozen=True, kw_only=True)
class SglangStartup:
    """What SGLang does at start-up for one configuration on one GPU (figures per rank)."""

    version: str
    gpu: str
    gpu_memory_mib: int
    total_bytes: int
    context_bytes: int
    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    capture_bs: tuple[int, ...]
    weights_bytes: int
    #: what loading adds beyond the weights (in "Load weight end … mem usage"; not torch's)
    load_overhead_bytes: int
    weight_format: str
    cell_size_bytes: int
    kv_kind: str  # "mha" | "mla"
    kv_cache_dtype: str
    max_total_num_tokens: int
    kv_pool_bytes: int
    req_to_token_bytes: int
    max_running_requests: int
    context_length: int
    page_size: int
    cuda_graph_bytes: int
    starts: bool
    error: str | None
    largest_context_length: int
    smallest_mem_fraction_static: float | None
    notes: tuple[str, ...] = field(default=())
    #: SGLang refuses the configuration before it loads the model (the layout, the context
    #: length): no memory setting starts it
    refused_layout: bool = False

    # -- the Answer protocol (memfit.estimate.answer) -------------------------------------------
    @property
    def engine(self) -> str:
        return "sglang"

    @property
    def peak_allocated_bytes(self) -> int:
        """Torch's tensors once serving: weights, the KV pool and the request table."""
        return self.weights_bytes + self.kv_pool_bytes + self.req_to_token_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self.peak_allocated_bytes

    @property
    def device_used_bytes(self) -> int:
        """nvidia-smi once it serves: the context, the tensors, what loading added and the CUDA
        graphs."""
        return (
            self.context_bytes
            + self.peak_allocated_bytes
            + self.load_overhead_bytes
            + self.cuda_graph_bytes
        )

    @property
    def loaded_bytes(self) -> int:
        """ "Load weight end … mem usage": the weights and what loading added."""
        return self.weights_bytes + self.load_overhead_bytes

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """No measured range: SGLang's own accounting is simulated (docs/serving.md)."""
        return {}

    @property
    def peak_components(self) -> dict[str, int]:
        return {
            "parameters": self.weights_bytes,
            "kv_cache": self.kv_pool_bytes,
            "req_to_token": self.req_to_token_bytes,
            "cuda_graphs": self.cuda_graph_bytes,
        }

    @property
    def engine_reason(self) -> str:
        return f"SGLang {self.version} start-up accounting simulated (memfit.serving.sglang)"

    @property
    def verdict(self) -> None:
        """None: SGLang's question is whether it starts (``starts``, ``error``), not a fit."""
        return None

    @property
    def before_weights_bytes(self) -> int:
        """``total_gpu_memory``: free memory when the weights start loading."""
        return self.total_bytes - self.context_bytes

    @property
    def after_pool_bytes(self) -> int:
        """Free memory after the KV pool and request table ("Memory pool end. avail mem")."""
        return (
            self.before_weights_bytes
            - self.loaded_bytes
            - self.kv_pool_bytes
            - self.req_to_token_bytes
        )

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` record (``memfit sglang``; the CLI adds the ``command``)."""
        return {
            "runtime": "sglang",
            "sglang_version": self.version,
            "gpu": self.gpu,
            "gpu_memory_mib": self.gpu_memory_mib,
            "total_bytes": self.total_bytes,
            "context_bytes": self.context_bytes,
            "mem_fraction_static": self.mem_fraction_static,
            "chunked_prefill_size": self.chunked_prefill_size,
            "cuda_graph_max_bs": self.cuda_graph_max_bs,
            "weights_bytes": self.weights_bytes,
            "load_overhead_bytes": self.load_overhead_bytes,
            "weight_format": self.weight_format,
            "kv_cell_size_bytes": self.cell_size_bytes,
            "kv_kind": self.kv_kind,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_total_num_tokens": self.max_total_num_tokens,
            "kv_cache_bytes": self.kv_pool_bytes,
            "req_to_token_bytes": self.req_to_token_bytes,
            "max_running_requests": self.max_running_requests,
            "context_length": self.context_length,
            "page_size": self.page_size,
            "cuda_graph_bytes": self.cuda_graph_bytes,
            "avail_after_pool_bytes": self.after_pool_bytes,
            "starts": self.starts,
            "error": self.error,
            "largest_context_length": self.largest_context_length,
            "smallest_mem_fraction_static": self.smallest_mem_fraction_static,
            "notes": list(self.notes),
        }

    def log_lines(self) -> list[str]:
        """The lines SGLang logs at start-up, with memfit's figures."""
        g = 1 / GiB
        before = self.before_weights_bytes
        after_w = before - self.loaded_bytes
        lines = [f"Load weight begin. avail mem={before * g:.2f} GB"]
        if after_w < 0:  # the weights do not load: no later line
            return lines
        lines.append(
            f"Load weight end. avail mem={after_w * g:.2f} GB, "
            f"mem usage={self.loaded_bytes * g:.2f} GB."
        )
        if self.max_total_num_tokens <= 0:
            return lines
        if self.kv_kind == "mla":
            lines.append(
                f"KV Cache is allocated. #tokens: {self.max_total_num_tokens}, "
                f"KV size: {self.kv_pool_bytes * g:.2f} GB"
            )
        else:
            half = self.kv_pool_bytes / 2 * g
            lines.append(
                f"KV Cache is allocated. #tokens: {self.max_total_num_tokens}, "
                f"K size: {half:.2f} GB, V size: {half:.2f} GB"
            )
        lines.append(f"Memory pool end. avail mem={self.after_pool_bytes * g:.2f} GB")
        if self.cuda_graph_bytes:
            lines.append(
                f"Capture cuda graph end. mem usage={self.cuda_graph_bytes * g:.2f} GB. "
                f"avail mem={(self.after_pool_bytes - self.cuda_graph_bytes) * g:.2f} GB."
            )
        lines.append(
            f"max_total_num_tokens={self.max_total_num_tokens}, chunked_prefill_size="
            f"{self.chunked_prefill_size}, max_running_requests={self.max_running_requests}, "
            f"context_len={self.context_length}"
        )
        return lines


def sglang_context_length(spec: ModelSpec) -> int | None:
    """SGLang's derived context length (``hf_transformers_utils.get_context_length``): the
    config's positions times a rope-scaling factor, except llama3 / longrope-style scalings
    (those that carry ``original_max_position_embeddings``), which keep it."""
    text = spec.text or spec
    base = text.context_limit
    if base is None:
        return None
    rope = text.get("rope_scaling")
    if isinstance(rope, dict):
        factor = rope.get("factor", 1)
        kind = rope.get("rope_type") or rope.get("type")
        if "original_max_position_embeddings" in rope or kind == "llama3":
            factor = 1
        if isinstance(factor, int | float) and factor > 1:
            base = int(base * factor)
    return base


def simulate_sglang(
    spec: ModelSpec,
    gpu: GPU,
    config: SglangConfig,
    *,
    total_bytes: int | None = None,
    context_bytes: int | None = None,
    gpu_memory_mib: int | None = None,
    windows_host: bool = False,
) -> SglangStartup:
    """Run SGLang's start-up accounting for ``spec`` served with ``config`` on ``gpu``
    (``total_bytes`` / ``context_bytes``: what a log printed, instead of memfit's figures;
    ``gpu_memory_mib``: the ``nvidia-smi`` total SGLang's defaults read, when a log printed it;
    ``windows_host``: SGLang under WSL2 or Docker Desktop, whose load keeps no first-kernels
    memory, :func:`memfit.serving.sglang_load.first_kernels_bytes`)."""
    try:  # an encoder, encoder-decoder or classifier: SGLang's generative path does not serve it
        served_as_decoder(spec)
    except NotModelledError as err:
        raise NotModelledError(str(err).replace("vLLM", "SGLang"), engine="sglang") from err
    notes: list[str] = []
    gpu_mem_mib = gpu_memory_mib or gpu.memory_bytes // MiB
    tp = config.tp_size
    d_chunk, d_bs = gpu_memory_defaults(gpu_mem_mib, tp, config.series)
    chunk = config.chunked_prefill_size or d_chunk
    max_bs = config.cuda_graph_max_bs or d_bs
    frac = config.mem_fraction_static
    if frac is None:
        frac = default_mem_fraction_static(gpu_mem_mib, config, chunk, max_bs)
    vconf = VllmConfig(dtype=config.dtype)  # SGLang takes vLLM's --dtype rule (fp32 -> bf16)
    dtype = model_dtype(spec, vconf, gpu)
    act_bytes = DTYPES[dtype]
    kv_bytes = SGLANG_KV_CACHE_DTYPES[config.kv_cache_dtype] or act_bytes
    kv_dtype = config.kv_cache_dtype if config.kv_cache_dtype != "auto" else dtype
    derived = sglang_context_length(spec)
    ctx = config.context_length or derived
    if ctx is None:
        raise NotModelledError(
            "SGLang: config.json gives no max_position_embeddings; pass --context-length",
            engine="sglang",
        )
    try:  # the layout is vLLM's (memfit.serving.layout); its refusals name SGLang here
        w = rank_weights(spec, tp=tp, pp=1, dtype=dtype, quantization=config.quantization)
        layers = kv_layers(spec, tp=config.attn_tp_size, kv_bytes=kv_bytes)
    except NotModelledError as err:
        raise NotModelledError(str(err).replace("vLLM", "SGLang"), engine="sglang") from err
    if w.note:
        notes.append(w.note)
    hybrid_swa = (
        (spec.model_type or "") in HYBRID_SWA_MODEL_TYPES
        and any(x.kind == "sliding" for x in layers)
        and not config.disable_hybrid_swa_memory
    )
    if any(x.kind == "sliding" for x in layers) and not hybrid_swa:
        notes.append(
            "sliding-window layers are sized as full attention, as SGLang does for "
            f"{spec.model_type} (its SWA pool is for the architectures in is_hybrid_swa_model)"
        )
    cell = sum(x.bytes_per_token for x in layers)
    kv_kind = "mla" if layers and layers[0].kind == "mla" else "mha"
    total = total_bytes or vllm_total_bytes(gpu)
    custom_all_reduce = tp > 1 and (gpu.form_factor == "sxm" or tp == 2)
    if context_bytes is None:
        context_bytes = CONTEXT_TP_BYTES if custom_all_reduce else CONTEXT_BYTES
    context = context_bytes
    before = total - context
    replayed = None
    if config.quantization is None:
        replayed = load_overhead_bytes(
            spec,
            tp=tp,
            dtype_bytes=act_bytes,
            sglang_version=config.sglang_version,
            windows_host=windows_host,
        )
    overhead = LOAD_OVERHEAD_BYTES if replayed is None else replayed
    loaded = w.weights_bytes + overhead
    rest = (before - loaded) - before * (1 - frac)
    tokens = int(rest // cell) if cell else 0
    if config.max_total_tokens is not None:
        tokens = min(tokens, config.max_total_tokens)
    tokens = tokens // config.page_size * config.page_size
    swa_tokens = 0
    if hybrid_swa and tokens > 0:
        tokens, swa_tokens = _split_swa(layers, tokens, config)
        notes.append(
            f"Use sliding window memory pool. full_layer_tokens={tokens}, "
            f"swa_layer_tokens={swa_tokens} (--swa-full-tokens-ratio "
            f"{config.swa_full_tokens_ratio})"
        )
    if config.max_running_requests is not None:
        reqs = config.max_running_requests
    else:
        reqs = min(max(int(max(tokens, 0) / ctx * REQS_PER_CONTEXT), MIN_REQS), MAX_REQS)
    req_bytes = reqs * (ctx + REQ_ROW_EXTRA) * REQ_ENTRY_BYTES
    pool = (tokens + config.page_size) * cell if tokens > 0 else 0
    if swa_tokens:
        pool = _swa_pool_bytes(layers, tokens, swa_tokens, config.page_size)
    capture: tuple[int, ...] = ()
    if not config.disable_cuda_graph:
        capture = capture_batch_sizes(min(max_bs, reqs), config.series, gpu_mem_mib)
    text = spec.text or spec
    n_moe = 0
    if text.n_experts:  # DeepSeek's first_k_dense_replace leading layers are dense
        n_moe = max(0, (text.n_layers or 0) - int(text.raw.get("first_k_dense_replace") or 0))
    backend = config.attention_backend
    # which attention backend SGLang's graphs run (sglang_graphs: FA3's copies, FlashInfer's
    # wrappers): the version, GPU and flag, and the model's kind
    which_backend = (config.sglang_version, gpu.arch, backend)
    arch, mla = _architecture(spec), bool(text.raw.get("kv_lora_rank"))
    workspace = 0
    if backend == "triton" and capture:
        heads = (text.n_heads or 0) // config.attn_tp_size
        head_dim = text.head_dim or ((text.hidden_size or 0) // (text.n_heads or 1))
        dv = int(text.raw.get("kv_lora_rank") or head_dim)  # MLA decodes in the latent
        workspace = triton_split_bytes(max(capture), heads, dv)
    graphs = sglang_graph_bytes(
        spec,
        capture,
        context_len=ctx,
        n_moe_layers=n_moe,
        nccl_in_graph=tp > 1 and not custom_all_reduce,
        shared_logits=shares_logits_buffer(config.sglang_version),
        attn_bytes_per_slot=attn_state_bytes_per_slot(config.sglang_version, gpu.arch, backend),
        attn_workspace_bytes=workspace,
        fa3_copies=keeps_fa3_page_table_copies(*which_backend, architecture=arch, mla=mla),
        page_size=config.page_size,
        cublas_bytes=cublas_workspace_bytes(gpu.compute_capability),
        flashinfer_wrappers=runs_flashinfer_decode(*which_backend, architecture=arch, mla=mla),
    )
    refused = parallel_error(spec, tp=tp)
    if refused is not None:
        notes.append(refused[1].replace("vLLM", "SGLang").replace("--tensor-parallel-size", "--tp"))
    error = _error(config, ctx, derived, before, loaded, tokens, frac, pool, req_bytes, graphs)
    if refused is not None:
        error = refused[0]
    before_loading = refused is not None or (error or "").startswith("ValueError")
    largest = min(tokens, derived or ctx) if tokens > 0 else 0
    fixed = loaded + cell * (ctx + config.page_size) + req_bytes
    smallest = -(-fixed * 1000 // before) / 1000
    return SglangStartup(
        version=config.sglang_version,
        gpu=gpu.name,
        gpu_memory_mib=gpu_mem_mib,
        total_bytes=total,
        context_bytes=context,
        mem_fraction_static=frac,
        chunked_prefill_size=chunk,
        cuda_graph_max_bs=max_bs,
        capture_bs=capture,
        weights_bytes=w.weights_bytes,
        load_overhead_bytes=overhead,
        weight_format=w.format,
        cell_size_bytes=cell,
        kv_kind=kv_kind,
        kv_cache_dtype=kv_dtype,
        max_total_num_tokens=tokens,
        kv_pool_bytes=pool,
        req_to_token_bytes=req_bytes if tokens > 0 else 0,
        max_running_requests=reqs,
        context_length=ctx,
        page_size=config.page_size,
        cuda_graph_bytes=graphs,
        starts=error is None,
        error=error,
        largest_context_length=largest,
        smallest_mem_fraction_static=smallest if smallest < 1 and refused is None else None,
        notes=tuple(notes),
        refused_layout=before_loading,
    )


#: ``is_hybrid_swa_model`` (python/sglang/srt/configs/model_config.py): the architectures whose
#: sliding-window layers get their own, smaller token pool, as memfit's model_type names them.
HYBRID_SWA_MODEL_TYPES = frozenset(
    {"gpt_oss", "llama4", "llama4_text", "gemma4", "gemma4_text", "mimo_v2_flash", "step3p5"}
)


def _architecture(spec: ModelSpec) -> str | None:
    """The first of the checkpoint's ``architectures`` (SGLang picks its default attention backend
    by it), or None where the config names none."""
    names = spec.raw.get("architectures") or (spec.text or spec).raw.get("architectures")
    return str(names[0]) if isinstance(names, list) and names else None


def _split_swa(layers: list[LayerKV], tokens: int, config: SglangConfig) -> tuple[int, int]:
    """(full-layer tokens, sliding-layer tokens) of SGLang's ``set_num_tokens_hybrid_swa``."""
    n_swa = sum(1 for x in layers if x.kind == "sliding")
    n_full = len(layers) - n_swa
    ratio = config.swa_full_tokens_ratio
    full = int(tokens * len(layers) / (ratio * n_swa + n_full))
    swa = int(full * ratio)
    page = config.page_size
    return full // page * page, swa // page * page


def _swa_pool_bytes(layers: list[LayerKV], full: int, swa: int, page: int) -> int:
    """The SWA pool's bytes: each layer holds its kind's token slots (plus one page)."""
    return sum(((swa if x.kind == "sliding" else full) + page) * x.bytes_per_token for x in layers)


def _error(
    config: SglangConfig,
    ctx: int,
    derived: int | None,
    before: float,
    weights: int,
    tokens: int,
    frac: float,
    pool: int,
    req_bytes: int,
    graphs: int,
) -> str | None:
    """SGLang's own error for this start-up, None when it starts."""
    if config.context_length is not None and derived is not None and ctx > derived:
        return (
            f"ValueError: User-specified context_length ({ctx}) is greater than the derived "
            f"context_length ({derived}). This may lead to incorrect model outputs or CUDA "
            "errors. Note that the derived context_length may differ from "
            "max_position_embeddings in the model's config. To allow overriding this maximum, "
            "set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
        )
    if weights > before:
        return (
            f"torch.OutOfMemoryError: CUDA out of memory while loading the weights "
            f"({weights / GiB:.2f} GiB per GPU, {before / GiB:.2f} GiB free)"
        )
    if tokens <= 0:
        return (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={frac}"
        )
    left = before - weights - pool - req_bytes
    if left < 0:
        return (
            f"torch.OutOfMemoryError: CUDA out of memory allocating the request table "
            f"({req_bytes / GiB:.2f} GiB for max_running_requests x (context_len + 4) int32; "
            f"{(left + req_bytes) / GiB:.2f} GiB left after the KV pool): lower "
            "--max-running-requests or --context-length, or --mem-fraction-static"
        )
    if graphs > left:
        return (
            f"Exception: Capture cuda graph failed: CUDA out of memory (capture needs "
            f"~{graphs / GiB:.2f} GiB, {left / GiB:.2f} GiB left after the KV pool). Possible "
            "solutions: 1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) "
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16) 3. disable torch compile "
            "by not using --enable-torch-compile 4. disable CUDA graph by --disable-cuda-graph"
        )
    return None
