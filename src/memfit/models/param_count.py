"""Exact parameter counts from a :class:`~memfit.models.model_spec.ModelSpec`'s layout.

Each counter writes out the modules transformers 5.23 builds (``models/<type>/modeling_<type>.py``)
for the task memfit traces — ``XForCausalLM``, ``XForSequenceClassification`` with two labels,
``ViTForImageClassification``, ``T5ForConditionalGeneration``, ``CLIPModel`` — and counts tied
weights once, as ``sum(p.numel() for p in model.parameters())`` does. A layout field the spec
leaves unknown, a family without a counter or a task its counter does not build answer None.
``tests/models/test_model_spec.py`` holds every bundled config to the count of the model
transformers builds on the meta device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memfit.models.model_spec import ModelSpec

Counter = Callable[["ModelSpec", str], int]
COUNTERS: dict[str, Counter] = {}
#: labels of the classification heads memfit builds (trace/build.py: ``num_labels = 2``)
SEQ_CLS_LABELS = 2


class _Unknown(Exception):
    """A field the count needs is None, or the counter does not build this task."""


def count_params(spec: ModelSpec, task: str) -> int | None:
    counter = COUNTERS.get(spec.model_type or "")
    if counter is None:
        return None
    try:
        return counter(spec, task)
    except _Unknown:
        return None


def _counter(*model_types: str) -> Callable[[Counter], Counter]:
    def register(fn: Counter) -> Counter:
        for t in model_types:
            COUNTERS[t] = fn
        return fn

    return register


def _need(*values: int | None) -> list[int]:
    if any(v is None for v in values):
        raise _Unknown
    return [int(v) for v in values]  # type: ignore[arg-type]


def _task(task: str, *allowed: str) -> None:
    if task not in allowed:
        raise _Unknown


def _linear(n_in: int, n_out: int, bias: bool | None) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _lm_head(s: ModelSpec, width: int, vocab: int, bias: bool = False) -> int:
    """The LM head: shared with the input embedding when tied (counted there)."""
    return 0 if s.tie_word_embeddings else _linear(width, vocab, bias)


def _attention(s: ModelSpec, h: int) -> int:
    """q/k/v/o projections of ``n_heads`` query and ``n_kv_heads`` K/V heads."""
    heads, kv, d = _need(s.n_heads, s.n_kv_heads, s.head_dim)
    qkv = _linear(h, heads * d, s.qkv_bias) + 2 * _linear(h, kv * d, s.qkv_bias)
    return qkv + _linear(heads * d, h, s.o_bias)


def _mlp(s: ModelSpec, h: int, f: int) -> int:
    """gate/up/down (gated) or up/down."""
    n_in = 2 if s.mlp_gated else 1
    return n_in * _linear(h, f, s.mlp_bias) + _linear(f, h, s.mlp_bias)


#: RMSNorm weights per decoder layer: input and post-attention (Gemma 2 adds pre- and
#: post-feed-forward norms, ``Gemma2DecoderLayer``).
NORMS_PER_LAYER = {"gemma2": 4, "gemma3_text": 4}
#: Per-head RMSNorms over q and k (``Qwen3Attention.q_norm`` / ``k_norm``: ``head_dim`` each).
QK_NORMS = ("qwen3", "qwen3_moe", "gemma3_text")
#: MoE families whose every layer is a router and ``n_experts`` gated MLPs of
#: ``expert_intermediate_size`` (3-D parameters), no shared expert.
ROUTED_ONLY = ("mixtral", "qwen3_moe")


@_counter(
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "mixtral", "qwen3_moe"
)
@_counter("olmo2")
def _llama(s: ModelSpec, task: str) -> int:
    """``LlamaForCausalLM`` and its relatives (Phi-3 fuses qkv and gate/up: same counts;
    Mixtral's sparse block holds a router and ``n_experts`` gated MLPs)."""
    _task(task, "causal-lm")
    h, n, v = _need(s.hidden_size, s.n_layers, s.vocab_size)
    if s.model_type in ROUTED_ONLY:
        e, f = _need(s.n_experts, s.expert_intermediate_size)
        mlp = h * e + e * 3 * h * f
    else:
        mlp = _mlp(s, h, *_need(s.intermediate_size))
    layer = _attention(s, h) + mlp + NORMS_PER_LAYER.get(s.model_type or "", 2) * h
    if s.model_type in QK_NORMS:
        layer += 2 * _need(s.head_dim)[0]
    if s.model_type == "olmo2":  # q_norm / k_norm over the whole q / k projection
        layer += _need(s.kv_dim)[0] + _need(s.n_heads)[0] * _need(s.head_dim)[0]
    return v * h + n * layer + h + _lm_head(s, h, v)


@_counter("gpt_oss")
def _gpt_oss(s: ModelSpec, task: str) -> int:
    """``GptOssForCausalLM``: q/k/v/o with bias (``attention_bias``), one attention sink per
    head, a router with bias, experts ``gate_up_proj`` (E, h, 2f) and ``down_proj`` (E, f, h)
    with biases, two RMSNorms a layer."""
    _task(task, "causal-lm")
    h, n, v, e, f, heads = _need(
        s.hidden_size, s.n_layers, s.vocab_size, s.n_experts, s.intermediate_size, s.n_heads
    )
    experts = e * (h * 2 * f + 2 * f) + e * (f * h + h)
    layer = _attention(s, h) + heads + (h * e + e) + experts + 2 * h
    return v * h + n * layer + h + _lm_head(s, h, v)


@_counter("deepseek_v2", "deepseek_v3")
def _deepseek(s: ModelSpec, task: str) -> int:
    """``DeepseekV2/V3ForCausalLM``: multi-head latent attention (q through ``q_lora_rank`` when
    set, the compressed K/V latent and its norm, ``kv_b_proj`` back to the heads), the first
    ``first_k_dense_replace`` layers a dense gated MLP, the others (every ``moe_layer_freq``-th)
    a router, ``n_routed_experts`` experts and ``n_shared_experts`` merged into one MLP. The MTP
    layer (``num_nextn_predict_layers``) is not built by transformers."""
    _task(task, "causal-lm")
    h, n, v, heads, f = _need(
        s.hidden_size, s.n_layers, s.vocab_size, s.n_heads, s.intermediate_size
    )
    nope, rope, vd, kvr = (
        int(s.get(k) or 0)
        for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")
    )
    qr = s.raw.get("q_lora_rank", 1536)  # absent: DeepseekV2/V3Config.q_lora_rank
    bias = bool(s.get("attention_bias", False))
    qk = nope + rope
    q = _linear(h, qr, bias) + qr + qr * heads * qk if qr else h * heads * qk
    attn = (
        q
        + _linear(h, kvr + rope, bias)
        + kvr
        + kvr * heads * (nope + vd)
        + _linear(heads * vd, h, bias)
    )
    e, fe = _need(s.n_experts, s.expert_intermediate_size)
    shared = int(s.get("n_shared_experts") or 0)
    first, freq = int(s.get("first_k_dense_replace") or 0), int(s.get("moe_layer_freq") or 1)
    moe = h * e + e * 3 * h * fe + (3 * h * fe * shared if shared else 0)
    total = 0
    for i in range(n):
        routed = e > 0 and i >= first and i % freq == 0
        total += attn + 2 * h + (moe if routed else 3 * h * f)
    return v * h + total + h + _lm_head(s, h, v)


@_counter("llama4_text")
def _llama4(s: ModelSpec, task: str) -> int:
    """``Llama4ForCausalLM`` (text): Llama attention (its q/k norm is a weightless L2 norm), the
    ``moe_layers`` a router, ``num_local_experts`` experts of ``intermediate_size`` (3-D) and a
    shared gated MLP of the same width, the other layers a gated MLP of
    ``intermediate_size_mlp``."""
    _task(task, "causal-lm")
    h, n, v, e, f = _need(s.hidden_size, s.n_layers, s.vocab_size, s.n_experts, s.intermediate_size)
    f_mlp = int(s.get("intermediate_size_mlp") or 0)
    moe_layers = s.get("moe_layers")
    if moe_layers is None:
        step = int(s.get("interleave_moe_layer_step") or 1)
        moe_layers = list(range(step - 1, n, step))
    moe = h * e + e * 3 * h * f + 3 * h * f
    total = 0
    for i in range(n):
        total += _attention(s, h) + 2 * h + (moe if i in moe_layers else 3 * h * f_mlp)
    return v * h + total + h + _lm_head(s, h, v)


@_counter("phi")
def _phi(s: ModelSpec, task: str) -> int:
    """``PhiForCausalLM``: one LayerNorm per (parallel) layer, fc1/fc2, optional q/k
    LayerNorms over the head width (``qk_layernorm``), an LM head with bias."""
    _task(task, "causal-lm")
    h, n, v, f, d = _need(s.hidden_size, s.n_layers, s.vocab_size, s.intermediate_size, s.head_dim)
    qk_norms = 2 * 2 * d if s.get("qk_layernorm", False) else 0
    layer = 2 * h + _attention(s, h) + qk_norms + _mlp(s, h, f)
    return v * h + n * layer + 2 * h + _lm_head(s, h, v, bias=True)


@_counter("gpt2", "gpt_bigcode")
def _gpt2(s: ModelSpec, task: str) -> int:
    """``GPT2LMHeadModel`` / ``GPTBigCodeForCausalLM``: token and learned position tables,
    fused ``c_attn`` (q plus ``n_kv_heads`` K/V heads), LayerNorms with bias."""
    _task(task, "causal-lm")
    h, n, v, p, f, kv_dim = _need(
        s.hidden_size, s.n_layers, s.vocab_size, s.max_positions, s.intermediate_size, s.kv_dim
    )
    layer = 2 * 2 * h + _linear(h, h + 2 * kv_dim, True) + _linear(h, h, True) + _mlp(s, h, f)
    return v * h + p * h + n * layer + 2 * h + _lm_head(s, h, v)


@_counter("gpt_neox")
def _neox(s: ModelSpec, task: str) -> int:
    """``GPTNeoXForCausalLM``: fused query_key_value, ``embed_out`` (untied by default)."""
    _task(task, "causal-lm")
    h, n, v, f = _need(s.hidden_size, s.n_layers, s.vocab_size, s.intermediate_size)
    layer = 2 * 2 * h + _attention(s, h) + _mlp(s, h, f)
    return v * h + n * layer + 2 * h + _lm_head(s, h, v)


@_counter("falcon")
def _falcon(s: ModelSpec, task: str) -> int:
    """``FalconForCausalLM``: fused query_key_value of ``n_heads + 2·n_kv_heads`` heads; one
    LayerNorm per parallel layer (two under ``new_decoder_architecture``:
    ``num_ln_in_parallel_attn``), two when ``parallel_attn`` is off."""
    _task(task, "causal-lm")
    h, n, v, f, heads, kv, d = _need(
        s.hidden_size,
        s.n_layers,
        s.vocab_size,
        s.intermediate_size,
        s.n_heads,
        s.n_kv_heads,
        s.head_dim,
    )
    new_arch = bool(s.get("new_decoder_architecture", False))
    n_ln = 2 if not s.get("parallel_attn", True) else s.get("num_ln_in_parallel_attn")
    n_ln = n_ln or (2 if new_arch else 1)
    qkv = _linear(h, (heads + 2 * kv) * d, s.qkv_bias)
    layer = n_ln * 2 * h + qkv + _linear(h, h, s.o_bias) + _mlp(s, h, f)
    return v * h + n * layer + 2 * h + _lm_head(s, h, v)


@_counter("opt")
def _opt(s: ModelSpec, task: str) -> int:
    """``OPTForCausalLM``: embeddings of ``word_embed_proj_dim`` projected in and out when it is
    not the width, positions offset by 2, a final LayerNorm only with ``do_layer_norm_before``."""
    _task(task, "causal-lm")
    h, n, v, p, f = _need(
        s.hidden_size, s.n_layers, s.vocab_size, s.max_positions, s.intermediate_size
    )
    w = int(s.get("word_embed_proj_dim", h))
    ln = 2 * h if s.get("layer_norm_elementwise_affine", True) else 0
    layer = _attention(s, h) + _mlp(s, h, f) + 2 * ln
    total = v * w + (p + 2) * h + n * layer + (2 * w * h if w != h else 0)
    final = s.get("do_layer_norm_before", True) and not s.get("_remove_final_layer_norm", False)
    return total + (ln if final else 0) + _lm_head(s, w, v)


@_counter("bloom")
def _bloom(s: ModelSpec, task: str) -> int:
    """``BloomForCausalLM``: a LayerNorm after the embedding, fused query_key_value."""
    _task(task, "causal-lm")
    h, n, v, f = _need(s.hidden_size, s.n_layers, s.vocab_size, s.intermediate_size)
    layer = 2 * 2 * h + _attention(s, h) + _mlp(s, h, f)
    return v * h + 2 * h + n * layer + 2 * h + _lm_head(s, h, v)


def _encoder_layer(s: ModelSpec, h: int, f: int) -> int:
    """BERT / ViT / CLIP layer: q/k/v/output projections, two LayerNorms, an up/down MLP."""
    return _attention(s, h) + 2 * 2 * h + _mlp(s, h, f)


@_counter("bert", "roberta")
def _bert(s: ModelSpec, task: str) -> int:
    """``BertForSequenceClassification`` (pooler + classifier) and
    ``RobertaForSequenceClassification`` (no pooler; dense + out_proj head), two labels."""
    _task(task, "seq-cls")
    h, n, v, p, f = _need(
        s.hidden_size, s.n_layers, s.vocab_size, s.max_positions, s.intermediate_size
    )
    embeddings = (v + p + int(s.get("type_vocab_size", 2))) * h + 2 * h
    head = _linear(h, h, True) + _linear(h, SEQ_CLS_LABELS, True)  # pooler or head.dense
    return embeddings + n * _encoder_layer(s, h, f) + head


def _n_labels(s: ModelSpec) -> int:
    """``PreTrainedConfig.num_labels``: the ``id2label`` entries, else 2."""
    labels = s.get("id2label")
    return len(labels) if isinstance(labels, dict) else int(s.get("num_labels", 2))


def _patches(s: ModelSpec, patch_default: int) -> tuple[int, int]:
    """(patch positions, patch-embedding weights) of a ViT-style input (square images)."""
    size, patch = int(s.get("image_size", 224)), int(s.get("patch_size", patch_default))
    channels, h = int(s.get("num_channels", 3)), _need(s.hidden_size)[0]
    return (size // patch) ** 2, channels * patch * patch * h


@_counter("vit")
def _vit(s: ModelSpec, task: str) -> int:
    """``ViTForImageClassification``: class token, positions, a patch convolution with bias,
    a final LayerNorm, no pooler, a classifier over ``num_labels``."""
    _task(task, "image-cls")
    h, n, f = _need(s.hidden_size, s.n_layers, s.intermediate_size)
    n_patches, conv = _patches(s, 16)  # ViTConfig.patch_size
    embeddings = h + (n_patches + 1) * h + conv + h
    return embeddings + n * _encoder_layer(s, h, f) + 2 * h + _linear(h, _n_labels(s), True)


@_counter("t5")
def _t5(s: ModelSpec, task: str) -> int:
    """``T5ForConditionalGeneration``: one shared embedding (also the LM head: T5Config ties
    it), bias-free projections of ``n_heads·head_dim``, RMS LayerNorm weights, the relative
    position bias in each stack's first layer, cross-attention in every decoder layer."""
    _task(task, "seq2seq")
    d, enc, dec, v, ff, heads, d_kv = _need(
        s.hidden_size,
        s.n_layers,
        s.n_decoder_layers,
        s.vocab_size,
        s.intermediate_size,
        s.n_heads,
        s.head_dim,
    )
    attn = 4 * d * heads * d_kv
    mlp = (3 if s.mlp_gated else 2) * d * ff
    bias = int(s.get("relative_attention_num_buckets", 32)) * heads
    encoder = enc * (attn + mlp + 2 * d) + bias + d
    decoder = dec * (2 * attn + mlp + 3 * d) + bias + d
    return v * d + encoder + decoder


@_counter("clip")
def _clip(s: ModelSpec, task: str) -> int:
    """``CLIPModel``: the text tower (tokens, 77 learned positions, final LayerNorm), the
    vision tower (class embedding, a bias-free patch convolution, pre/post LayerNorms), two
    bias-free projections to ``projection_dim`` (CLIPConfig: 512) and ``logit_scale``."""
    _task(task, "clip")
    t, vis = s.text, s.vision
    if t is None or vis is None:
        raise _Unknown
    ht, nt, vt, pt, ft = _need(
        t.hidden_size, t.n_layers, t.vocab_size, t.max_positions, t.intermediate_size
    )
    hv, nv, fv = _need(vis.hidden_size, vis.n_layers, vis.intermediate_size)
    text = (vt + pt) * ht + nt * _encoder_layer(t, ht, ft) + 2 * ht
    n_patches, conv = _patches(vis, 32)  # CLIPVisionConfig.patch_size
    vision = hv + conv + (n_patches + 1) * hv + 2 * 2 * hv + nv * _encoder_layer(vis, hv, fv)
    proj = int(s.get("projection_dim", 512))
    return text + vision + (ht + hv) * proj + 1
