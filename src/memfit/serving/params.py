"""Parameters of a decoder-only LM that memfit's per-family counters do not know, counted from the
config's shape fields as vLLM's generic decoder layers hold them (torch-free).

Used by :func:`memfit.serving.layout.rank_weights` when ``ModelSpec.n_params`` is None (a
``model_type`` without a counter in :mod:`memfit.models.param_count`, e.g. ``qwen2_moe``). The
layer is the one vLLM's Llama-like models build (``vllm/model_executor/models/llama.py``,
``qwen2_moe.py``, ``mixtral.py``): ``QKVParallelLinear`` (query heads x head_dim, K/V heads x
head_dim; biases where ``attention_bias`` / ``qkv_bias`` is set or the Qwen2 family, which always
has them), the output projection, a gated MLP (gate, up, down) or a sparse MoE block (a router,
``n_experts`` gated experts of the expert intermediate size, and the shared expert(s) with, in
Qwen2-MoE, a one-output ``shared_expert_gate``), two norms a layer and the final norm; the
embedding and, unless tied, the lm_head. Which layers are sparse follows the config:
``decoder_sparse_step`` / ``mlp_only_layers`` (Qwen2-MoE), ``first_k_dense_replace`` /
``moe_layer_freq`` (DeepSeek), every layer otherwise.
"""

from __future__ import annotations

from memfit.models import ModelSpec

__all__ = ["attention_shape", "decoder_params"]

#: Families whose QKV projection always has a bias (vLLM ``Qwen2Attention``: ``bias=True``).
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")


def _sparse_layers(spec: ModelSpec, n_layers: int) -> list[bool]:
    step = spec.get("decoder_sparse_step")
    dense_only = spec.get("mlp_only_layers") or []
    first = int(spec.get("first_k_dense_replace") or 0)
    freq = int(spec.get("moe_layer_freq") or 1)
    out = []
    for i in range(n_layers):
        sparse = i >= first and (i - first) % max(freq, 1) == 0
        if isinstance(step, int) and step > 0:
            sparse = sparse and (i + 1) % step == 0
        out.append(sparse and i not in dense_only)
    return out


#: Config keys for the query heads where ``num_attention_heads`` is absent (MPT, DBRX: n_heads;
#: XGLM: attention_heads).
HEAD_KEYS = ("n_heads", "attention_heads", "num_heads", "n_head")


def attention_shape(text: ModelSpec) -> tuple[int | None, int | None, int | None]:
    """(query heads, K/V heads, head_dim), with the fallbacks transformers' configs imply:
    K/V heads default to the query heads, head_dim to hidden_size / heads."""
    heads = text.n_heads
    for key in HEAD_KEYS:
        value = text.get(key)
        if heads is None and isinstance(value, int) and value > 0:
            heads = value
    kv = text.n_kv_heads or heads
    hd = text.head_dim or text.get("head_dim")
    if not isinstance(hd, int) or hd <= 0:
        hd = text.hidden_size // heads if text.hidden_size and heads else None
    return heads, kv, hd


def decoder_params(spec: ModelSpec) -> int | None:
    """Parameters of ``spec`` as a generic decoder (module docstring); None without the shape."""
    text = spec.text or spec
    h, v, n = text.hidden_size, text.vocab_size, text.n_layers
    heads, kv, hd = attention_shape(text)
    if not (h and v and n and heads and kv and hd):
        return None
    bias = bool(text.get("attention_bias") or text.get("qkv_bias"))
    bias = bias or (text.model_type or "") in QKV_BIAS_TYPES
    attn = h * (heads + 2 * kv) * hd + heads * hd * h + ((heads + 2 * kv) * hd if bias else 0)
    inter = text.intermediate_size or 4 * h
    dense_mlp = 3 * h * inter
    e = text.n_experts or 0
    sparse_mlp = dense_mlp
    if e > 0:
        ei = text.expert_intermediate_size or inter
        shared_i = text.shared_expert_intermediate_size or 0
        n_shared = text.n_shared_experts or (1 if shared_i else 0)
        shared = 3 * h * (shared_i or ei) * n_shared
        gate = h if text.get("shared_expert_intermediate_size") else 0  # Qwen2-MoE's gate
        sparse_mlp = h * e + e * 3 * h * ei + shared + gate
    kinds = _sparse_layers(text, n) if e > 0 else [False] * n
    layers = sum(attn + (sparse_mlp if s else dense_mlp) + 2 * h for s in kinds)
    head = 0 if text.tie_word_embeddings else v * h
    return v * h + layers + h + head
