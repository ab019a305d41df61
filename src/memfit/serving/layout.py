"""What one vLLM rank holds of a model: weight bytes (TP/PP split, vocab padding, quantized
linears) and its attention layers' KV cache layout (full, sliding window, MLA latent).

Read from :class:`~memfit.models.ModelSpec` only (torch-free). vLLM's layers, as in
``vllm/model_executor/layers/``: ``VocabParallelEmbedding`` / ``ParallelLMHead`` pad the vocabulary
to a multiple of 64 (``DEFAULT_VOCAB_PADDING_SIZE``) and split it across TP ranks;
``QKVParallelLinear`` splits query heads and splits K/V heads, replicating them when TP exceeds the
K/V head count; ``RowParallelLinear`` / ``MergedColumnParallelLinear`` split the MLP; norms are
replicated; one ``RotaryEmbedding`` ``cos_sin_cache`` of ``max_position x rotary_dim`` in the model
dtype per distinct rope is shared by the layers (``get_rope`` caches instances; a linear scaling
multiplies the rows, Gemma 3's sliding layers have their own). Pipeline stages take layers as
``vllm/distributed/utils.py:get_pp_indices`` splits them (the remainder to the stages before the
last); the first stage holds the embedding, the last the final norm and lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.models import ModelSpec
from memfit.models.checkpoint_quant import checkpoint_format
from memfit.serving.ignored import unquantized_linear_params
from memfit.serving.mxfp4 import mxfp4_experts
from memfit.serving.params import attention_shape, decoder_params
from memfit.serving.vision import vision_tower

__all__ = [
    "LayerKV",
    "RankWeights",
    "kv_layers",
    "linear_bytes_per_param",
    "parallel_error",
    "quantization_error",
    "rank_weights",
]

#: vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE.
VOCAB_PADDING = 64
#: Model types whose rotary cache vLLM builds in fp32 (``get_rope(..., dtype=torch.float32)`` in
#: ``vllm/model_executor/models/gpt_oss.py``, commit 0025d69b): costed at 4 bytes an element.
ROPE_FP32 = ("gpt_oss",)
#: GPTQ / AWQ default group size (AutoGPTQ, AutoAWQ).
DEFAULT_GROUP = 128
#: ``--quantization`` methods that, on a config without quantization_config, size the usual
#: 4-bit checkpoint of the model (AutoAWQ / AutoGPTQ defaults: 4 bits, group 128).
OFFLINE_VARIANTS = {
    "awq": ("int4-awq", "AutoAWQ"),
    "awq_marlin": ("int4-awq", "AutoAWQ"),
    "gptq": ("int4-gptq", "AutoGPTQ"),
    "gptq_marlin": ("int4-gptq", "AutoGPTQ"),
}
#: bitsandbytes 4-bit: one fp32 absmax per 64 weights (blocksize 64).
BNB4_BLOCK = 64


@dataclass(frozen=True, kw_only=True)
class RankWeights:
    """Weight bytes on the fullest rank, and how they were counted."""

    weights_bytes: int
    linear_params: int
    embedding_params: int
    format: str  # "bf16", "fp8", "int4-gptq g128"…
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class LayerKV:
    """One attention layer's per-token KV bytes on a rank, and its window (None: full)."""

    kind: str  # "full" | "sliding" | "mla"
    bytes_per_token: int
    window: int | None = None


def _model_bytes(dtype: str) -> int:
    return 4 if dtype in ("float", "float32") else 2


def linear_bytes_per_param(quant: str | None, group_size: int | None, dtype: str) -> float:
    """Bytes per weight of a quantized linear layer, scales and zero points included."""
    g = group_size or DEFAULT_GROUP
    if quant is None:
        return float(_model_bytes(dtype))
    if quant in ("fp8", "int8"):
        return 1.0  # one byte per weight; per-tensor / per-channel scales are negligible
    if quant in ("int4-gptq", "int4-awq"):
        return 0.5 + 2.0 / g + 0.5 / g  # 4-bit packed, fp16 scale and packed 4-bit zero per group
    if quant in ("nf4", "fp4", "nf4-dq"):
        return 0.5 + 4.0 / BNB4_BLOCK
    raise NotModelledError(f"weight format {quant!r} is not modelled for vLLM", engine="vllm")


def weight_format(
    spec: ModelSpec, quantization: str | None
) -> tuple[str | None, int | None, str | None]:
    """(memfit quant name, group size, note) from ``--quantization`` and the checkpoint's own
    quantization_config (vLLM reads the latter; the flag must agree with it)."""
    fmt = checkpoint_format(spec.quantization)
    ct = _compressed_tensors_int(spec)
    if ct is not None:
        return ct
    if spec.quantization is not None and (spec.quantization.method or "") == "fbgemm_fp8":
        return "fp8", None, "checkpoint quantization_config: fbgemm_fp8 (FBGEMMFp8Config)"
    if fmt is not None and fmt.quant is None:
        raise NotModelledError(f"vLLM: {fmt.why}", engine="vllm")
    if fmt is not None and fmt.quant == "mxfp4":
        return "mxfp4", None, "checkpoint quantization_config: mxfp4 experts (Mxfp4MoEMethod)"
    if fmt is not None:
        return fmt.quant, fmt.group_size, f"checkpoint quantization_config: {fmt.described}"
    if quantization is None:
        return None, None, None
    if quantization == "fp8":
        return "fp8", None, "--quantization fp8: weights cast to fp8 at load (online, dynamic)"
    if quantization == "bitsandbytes":
        return "nf4", None, "--quantization bitsandbytes: in-flight 4-bit"
    if quantization in OFFLINE_VARIANTS:  # a variant of this model, quantized the usual way
        quant, bits_note = OFFLINE_VARIANTS[quantization]
        return (
            quant,
            DEFAULT_GROUP,
            f"--quantization {quantization} on a config without quantization_config: sized as "
            f"the {bits_note} checkpoint of this model (4-bit weights, group {DEFAULT_GROUP}, fp16 "
            "scales and packed zeros; embeddings and lm_head in the model dtype); pass the "
            "quantized checkpoint's hub id or config for its own group size",
        )
    raise SpecError(
        f"--quantization {quantization} needs a checkpoint quantized that way (config.json has no "
        f"quantization_config); pass its hub id, or --quantization fp8 for online FP8"
    )


def _compressed_tensors_int(spec: ModelSpec) -> tuple[str, int | None, str] | None:
    """compressed-tensors integer weights (w8a8 / w4a16), which vLLM serves and the HF-side
    reader leaves unmodelled: int8 -> 1 byte; int4 -> GPTQ-like packing with group scales."""
    q = spec.quantization
    if q is None or (q.method or "").lower() != "compressed-tensors":
        return None
    groups = q.raw.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        w = group.get("weights") if isinstance(group, dict) else None
        if isinstance(w, dict) and w.get("type") == "int":
            bits, size = w.get("num_bits"), w.get("group_size")
            note = f"checkpoint quantization_config: compressed-tensors int{bits}"
            if bits == 8:
                return "int8", None, note
            if bits == 4:
                return "int4-gptq", size if isinstance(size, int) and size > 0 else None, note
    return None


#: The lowest CUDA compute capability (major * 10 + minor) of each quantization method vLLM
#: loads, as its quantization configs return it (``get_min_capability`` in
#: ``vllm/model_executor/layers/quantization/{fp8,awq,gptq,bitsandbytes}.py``); a GPU below it is
#: refused when the weights are loaded ("The quantization method X is not supported for the
#: current GPU. Minimum capability: M. Current capability: C.", vLLM's ``get_quant_config``).
VLLM_MIN_CAPABILITY = {"fp8": 80, "awq": 75, "gptq": 60, "bitsandbytes": 70, "mxfp4": 80}


def quantization_error(quantization: str | None, gpu: Any) -> tuple[str, str] | None:
    """vLLM's refusal of ``quantization`` on ``gpu`` (too old a compute capability), or None."""
    need = VLLM_MIN_CAPABILITY.get(str(quantization).lower()) if quantization else None
    cc = getattr(gpu, "compute_capability", None)
    if need is None or cc is None:
        return None
    have = cc[0] * 10 + cc[1]
    if have >= need:
        return None
    return (
        f"ValueError: The quantization method {quantization} is not supported for the current "
        f"GPU. Minimum capability: {need}. Current capability: {have}.",
        f"vLLM refuses --quantization {quantization} on {gpu.name} (compute capability "
        f"{cc[0]}.{cc[1]}, needs {need // 10}.{need % 10}): serve the 16-bit weights, another "
        "format, or a newer GPU",
    )


def parallel_error(spec: ModelSpec, *, tp: int) -> tuple[str, str] | None:
    """vLLM's own refusal of tensor parallel size ``tp`` for this model, before it loads anything:
    ``(vLLM's error, memfit's note with the sizes that work)``, or None when vLLM accepts it.

    - ``vllm/config/model.py`` ``ModelConfig.verify_with_parallel_config`` (``vllm/config.py``
      before 0.10): ``total_num_attention_heads % tensor_parallel_size != 0`` raises
      ``ValueError("Total number of attention heads (H) must be divisible by tensor parallel size
      (TP).")`` when the engine config is built;
    - ``vllm/model_executor/layers/linear.py`` ``QKVParallelLinear.__init__``: the K/V heads are
      split (``divide(total_num_kv_heads, tp_size)``) or, when TP is larger, replicated
      (``divide(tp_size, total_num_kv_heads)``); ``divide`` asserts exact division
      (``vllm/distributed/utils.py`` ``ensure_divisibility``: "A is not divisible by B") while the
      model is built. MLA models (a ``kv_lora_rank``) keep one latent, not split by TP.
    """
    text = spec.text or spec
    heads, kv = text.n_heads, text.n_kv_heads
    if heads and heads % tp:
        works = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0 and n <= 64)
        return (
            f"ValueError: Total number of attention heads ({heads}) must be divisible by tensor "
            f"parallel size ({tp}).",
            f"vLLM refuses this layout before loading the model: --tensor-parallel-size must "
            f"divide the {heads} attention heads ({works})",
        )
    lora_rank = spec.get("kv_lora_rank")
    if kv and not (isinstance(lora_rank, int) and lora_rank > 0):
        big, small = (tp, kv) if tp >= kv else (kv, tp)
        if big % small:
            return (
                f"AssertionError: {big} is not divisible by {small}",
                f"vLLM refuses this layout while building the model (QKVParallelLinear): "
                f"{kv} key/value heads are split over --tensor-parallel-size or replicated "
                f"across it, so one must divide the other",
            )
    return None


def pp_layer_counts(n_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as ``get_pp_indices`` splits them."""
    counts = [n_layers // pp] * pp
    for i in range(2, n_layers % pp + 2):
        counts[-i] += 1
    return counts


def rank_weights(
    spec: ModelSpec,
    *,
    tp: int,
    pp: int,
    dtype: str,
    quantization: str | None,
    compute_capability: tuple[int, int] | None = None,
    vllm_minor: int | None = None,
) -> RankWeights:
    """Weight bytes of the fullest rank (the last pipeline stage, or the first if it holds more).
    ``compute_capability``: the GPU's, which picks the MXFP4 MoE backend (and its padding);
    ``vllm_minor``: the vLLM release, which picks how MXFP4 experts are held
    (memfit.serving.mxfp4)."""
    text = spec.text or spec
    h, v, n_layers = text.hidden_size, text.vocab_size, text.n_layers
    n_params = spec.n_params if spec.n_params is not None else decoder_params(spec)
    if h is None or v is None or n_layers is None or n_params is None:
        raise NotModelledError(
            f"vLLM serving of {spec.model_type!r} is not modelled: its config lacks hidden_size "
            "/ vocab_size / layer count / attention heads, or memfit cannot count its parameters",
            engine="vllm",
        )
    tied = bool(text.tie_word_embeddings)
    embed = v * h
    heads = embed if not tied else 0
    norms = (2 * n_layers + 1) * h
    quant, group, note = weight_format(spec, quantization)
    experts = (
        mxfp4_experts(spec, tp=tp, cc=compute_capability, vllm_minor=vllm_minor)
        if quant == "mxfp4"
        else None
    )
    linear = max(0, n_params - embed - heads - norms - (experts.logical_params if experts else 0))
    per_layer = linear / n_layers
    kv_extra = 0.0  # K/V projections replicated when TP exceeds the K/V heads
    _, kv, hd = attention_shape(text)
    if kv and hd and tp > kv:
        kv_extra = 2 * h * hd * (tp // kv - 1) * kv / tp  # per rank, per layer
    padded = -(-v // (VOCAB_PADDING * tp)) * VOCAB_PADDING * tp
    if experts is not None:  # MXFP4 quantizes the experts only: the rest stays in the model dtype
        note = f"{note}; {experts.backend}"
    b_lin = linear_bytes_per_param(None if experts else quant, group, dtype)
    b_model = _model_bytes(dtype)
    skipped = unquantized_linear_params(spec) if quant is not None and not experts else 0
    if skipped:
        note = (
            f"{note}; {skipped / 1e9:.2f} B linear weights the quantization_config leaves "
            "unquantized, in the model dtype"
        )
    skipped_per_layer = skipped / n_layers * (b_model - b_lin)  # extra bytes, before TP
    rope = _rope_cache_params(text) * (4 / b_model if text.model_type in ROPE_FP32 else 1)
    vision, note = _vision(spec, tp, note)
    stages = pp_layer_counts(n_layers, pp)
    best = 0
    for i, n in enumerate(stages):
        lin = n * (per_layer / tp + kv_extra)
        emb = (padded // tp) * h * ((i == 0) + (i == pp - 1 and (not tied or pp > 1)))
        if pp == 1 and tied:
            emb = (padded // tp) * h
        other = 2 * n * h + (h if i == pp - 1 else 0) + rope + (vision if i == 0 else 0)
        total = int(lin * b_lin + (emb + other) * b_model + n * skipped_per_layer / tp)
        total += n * experts.bytes_per_layer if experts else 0
        best = max(best, total)
    label = quant or ("fp32" if b_model == 4 else "16-bit")
    if quant in ("int4-gptq", "int4-awq"):
        label += f" g{group or DEFAULT_GROUP}"
    return RankWeights(
        weights_bytes=best,
        linear_params=int(linear),
        embedding_params=embed + heads,
        format=label,
        note=note,
    )


def _vision(spec: ModelSpec, tp: int, note: str | None) -> tuple[int, str | None]:
    """Parameters of the vision tower + projector on a first-stage rank (memfit.serving.vision),
    in the model dtype, and the note that says so; 0 for a text model. A config whose parameter
    count already holds its towers (``spec.n_params``) adds nothing here."""
    if spec.vision is None or spec.n_params is not None:
        return 0, note
    tower = vision_tower(spec)
    if tower is None:
        said = (
            f"the vision tower ({spec.vision.model_type}) of this checkpoint is not counted: "
            "memfit counts Gemma 3's SigLIP and Mistral 3's Pixtral towers"
        )
        return 0, f"{note}; {said}" if note else said
    said = (
        f"{tower.kind} vision tower + projector ({tower.n_params / 1e9:.2f} B parameters) in "
        "the model dtype"
    )
    return tower.rank_params(tp), f"{note}; {said}" if note else said


def _rope_cache_params(spec: ModelSpec) -> int:
    """Elements of the rotary ``cos_sin_cache`` buffers: max_position x rotary_dim for each
    distinct rope ``get_rope`` builds (it caches one instance per configuration). A ``linear``
    rope_scaling multiplies the rows by its factor (``LinearScalingRotaryEmbedding.
    _compute_cos_sin_cache``: ``max_len = max_position_embeddings * scaling_factor``,
    vllm/model_executor/layers/rotary_embedding/linear_scaling_rope.py); Gemma 3's sliding layers
    (``rope_local_base_freq``) get a second, unscaled rope (``config.rope_parameters[layer_type]``
    in vllm/model_executor/models/gemma3.py; both read in the v0.33.0 and v0.34.0 sdists)."""
    if spec.rotary_dim is None or spec.max_positions is None:
        return 0
    rows = spec.max_positions
    rope = spec.get("rope_scaling")
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) == "linear":
        factor = rope.get("factor")
        if isinstance(factor, int | float) and factor > 1:
            rows = int(spec.max_positions * factor)
    if spec.get("rope_local_base_freq") is not None and spec.sliding_window:
        rows += spec.max_positions  # the sliding layers' own, unscaled rope
    return rows * spec.rotary_dim


def kv_layers(spec: ModelSpec, *, tp: int, kv_bytes: int) -> list[LayerKV]:
    """One LayerKV per attention layer, per rank (all pipeline stages together)."""
    text = spec.text or spec
    n_layers = text.n_layers
    _, kv, hd = attention_shape(text)
    if spec.is_encoder_decoder:
        raise NotModelledError(
            "vLLM: encoder-decoder models are not modelled (vLLM V1 serves decoder-only and "
            "multimodal decoders)",
            engine="vllm",
        )
    if n_layers is None:
        raise NotModelledError("vLLM: the config gives no layer count", engine="vllm")
    lora_rank = spec.get("kv_lora_rank")
    if isinstance(lora_rank, int) and lora_rank > 0:  # MLA: one latent + rope key, not TP-split
        rope = int(spec.get("qk_rope_head_dim", 64))
        return [LayerKV(kind="mla", bytes_per_token=(lora_rank + rope) * kv_bytes)] * n_layers
    if kv is None or hd is None:
        raise NotModelledError(
            f"vLLM serving of {spec.model_type!r} is not modelled: its config gives no K/V heads "
            "or head_dim",
            engine="vllm",
        )
    per_rank_heads = max(1, kv // tp)
    per_token = 2 * per_rank_heads * hd * kv_bytes
    kinds = _layer_kinds(text, n_layers)
    return [
        LayerKV(
            kind=k,
            bytes_per_token=per_token,
            window=text.sliding_window if k == "sliding" else None,
        )
        for k in kinds
    ]


def _layer_kinds(spec: ModelSpec, n_layers: int) -> list[str]:
    """``full`` / ``sliding`` per layer: ``layer_types`` where the config lists them, else every
    layer slides when the config sets a ``sliding_window`` (Mistral v0.1, Phi-3)."""
    if spec.sliding_window is None:
        return ["full"] * n_layers
    if spec.layer_types is not None and len(spec.layer_types) == n_layers:
        return ["sliding" if "sliding" in t else "full" for t in spec.layer_types]
    return ["sliding"] * n_layers
