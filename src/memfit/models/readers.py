"""How a config.json's keys become :class:`~memfit.models.model_spec.ModelSpec` fields.

Three layers, applied in this order by :func:`read_fields`:

1. :data:`KEY_TABLE`: each canonical field and the spellings Hugging Face configs use for it
   (``hidden_size`` / ``n_embd`` / ``d_model``…); the first spelling with a value wins;
2. :data:`FAMILY_DEFAULTS`: for a known ``model_type``, the default its transformers config class
   (5.23, ``models/<type>/configuration_<type>.py``) gives a field the config.json leaves out;
3. the registered per-family readers (:func:`reader`), for what no key table can say: GPT-2's
   ``n_inner: null`` meaning 4·``n_embd``, BigCode's and Falcon's multi-query K/V, T5's
   ``feed_forward_proj``, Phi's half-rotary default, Gemma 2's alternating layers…

A field nothing sets stays None: unknown, never a made-up number. The universal rules of the
config classes (K/V heads default to the query heads, ``head_dim`` to ``hidden_size / heads``)
apply last, in :mod:`memfit.models.model_spec`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: canonical field → the config.json spellings of it, in the order they are tried.
KEY_TABLE: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    # the trace engine rewrites the layer count under the key it was read from
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "n_decoder_layers": ("num_decoder_layers",),
    "n_heads": ("num_attention_heads", "n_head", "num_heads"),
    "n_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim", "d_kv"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff"),
    "vocab_size": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions", "max_sequence_length"),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "hidden_act": ("hidden_activation", "hidden_act", "activation_function", "activation"),
    "qkv_bias": ("qkv_bias", "attention_bias"),
    "o_bias": ("attention_bias",),
    "mlp_bias": ("mlp_bias",),
    "partial_rotary_factor": ("partial_rotary_factor", "rotary_pct"),
    "sliding_window": ("sliding_window",),
    "layer_types": ("layer_types",),
    "n_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "n_experts_per_token": ("num_experts_per_tok",),
    "expert_intermediate_size": ("moe_intermediate_size",),
    "n_shared_experts": ("n_shared_experts",),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "is_encoder_decoder": ("is_encoder_decoder",),
    "dtype": ("torch_dtype", "dtype"),
    "attention_dropout": ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"),
    "hidden_dropout": ("hidden_dropout", "resid_pdrop", "hidden_dropout_prob"),
    "embedding_dropout": ("embd_pdrop",),
    "attn_logit_softcapping": ("attn_logit_softcapping",),
    "final_logit_softcapping": ("final_logit_softcapping",),
}

_LLAMA: dict[str, Any] = {
    "hidden_act": "silu",
    "mlp_gated": True,
    "qkv_bias": False,
    "o_bias": False,
}
_LLAMA |= {"mlp_bias": False, "attention_dropout": 0.0, "partial_rotary_factor": 1.0}
_LLAMA |= {"tie_word_embeddings": False}
_ENCODER: dict[str, Any] = {
    "hidden_act": "gelu",
    "qkv_bias": True,
    "o_bias": True,
    "mlp_bias": True,
}
_ENCODER |= {"mlp_gated": False, "tie_word_embeddings": True}
_GPT2: dict[str, Any] = {"hidden_size": 768, "n_layers": 12, "n_heads": 12, "vocab_size": 50257}
_GPT2 |= {"max_positions": 1024, "tie_word_embeddings": True, "attention_dropout": 0.1}
_GPT2 |= {"hidden_dropout": 0.1, "embedding_dropout": 0.1, "mlp_gated": False}
_GPT2 |= {"qkv_bias": True, "o_bias": True, "mlp_bias": True}

#: model_type → field defaults of its transformers 5.23 config class (``XConfig()``'s attribute
#: for the field; ``tests/models/test_model_spec.py`` checks every entry against transformers).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # LlamaConfig: 4096 wide, 32 layers/heads, 11008 MLP, 32000 tokens, 2048 positions
    "llama": _LLAMA
    | {"hidden_size": 4096, "n_layers": 32, "n_heads": 32, "intermediate_size": 11008}
    | {"vocab_size": 32000, "max_positions": 2048},
    # MistralConfig: 8 K/V heads, 14336 MLP, 131072 positions, a 4096-token sliding window
    "mistral": _LLAMA
    | {"hidden_size": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8}
    | {"intermediate_size": 14336, "vocab_size": 32000, "max_positions": 131072}
    | {"sliding_window": 4096},
    # MixtralConfig: Mistral's shape, 8 experts of which 2 per token
    "mixtral": _LLAMA
    | {"hidden_size": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8}
    | {"intermediate_size": 14336, "vocab_size": 32000, "max_positions": 131072}
    | {"n_experts": 8, "n_experts_per_token": 2},
    # Qwen2Config: q/k/v with bias, o without (Qwen2Attention), 151936 tokens
    "qwen2": _LLAMA
    | {"hidden_size": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32}
    | {"intermediate_size": 22016, "vocab_size": 151936, "max_positions": 32768}
    | {"qkv_bias": True},
    # Qwen3Config: Qwen2's shape with head_dim 128 whatever the width, no q/k/v bias
    "qwen3": _LLAMA
    | {"hidden_size": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "head_dim": 128}
    | {"intermediate_size": 22016, "vocab_size": 151936, "max_positions": 32768},
    # Gemma2Config: head_dim 256 whatever the width, tied, soft-capping 50 (scores) / 30 (logits)
    "gemma2": _LLAMA
    | {"hidden_size": 2304, "n_layers": 26, "n_heads": 8, "n_kv_heads": 4, "head_dim": 256}
    | {"intermediate_size": 9216, "vocab_size": 256000, "max_positions": 8192}
    | {"tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh", "sliding_window": 4096}
    | {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    # Gemma3TextConfig: Gemma 2's shape with no soft-capping, 262208 tokens, five sliding layers
    # to one full
    "gemma3_text": _LLAMA
    | {"hidden_size": 2304, "n_layers": 26, "n_heads": 8, "n_kv_heads": 4, "head_dim": 256}
    | {"intermediate_size": 9216, "vocab_size": 262208, "max_positions": 131072}
    | {"tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh", "sliding_window": 4096},
    # Qwen3MoeConfig: 128 experts of 768, 8 per token; head_dim from the width; untied
    "qwen3_moe": _LLAMA
    | {"hidden_size": 2048, "n_layers": 24, "n_heads": 32, "n_kv_heads": 4}
    | {"intermediate_size": 6144, "vocab_size": 151936, "max_positions": 32768}
    | {"n_experts": 128, "n_experts_per_token": 8, "expert_intermediate_size": 768},
    # Olmo2Config: Llama's 7B shape with 50304 tokens
    "olmo2": _LLAMA
    | {"hidden_size": 4096, "n_layers": 32, "n_heads": 32, "intermediate_size": 11008}
    | {"vocab_size": 50304, "max_positions": 2048},
    # Phi3Config: fused qkv_proj and gate_up_proj, no biases, untied
    "phi3": _LLAMA
    | {"hidden_size": 3072, "n_layers": 32, "n_heads": 32, "intermediate_size": 8192}
    | {"vocab_size": 32064, "max_positions": 4096, "hidden_dropout": 0.0}
    | {"embedding_dropout": 0.0},
    # PhiConfig: biases everywhere, a plain fc1/fc2 MLP, rotary on half of each head
    "phi": {"hidden_size": 2048, "n_layers": 24, "n_heads": 32, "intermediate_size": 8192}
    | {"vocab_size": 51200, "max_positions": 2048, "tie_word_embeddings": False}
    | {"hidden_act": "gelu_new", "qkv_bias": True, "o_bias": True, "mlp_bias": True}
    | {"mlp_gated": False, "partial_rotary_factor": 0.5, "attention_dropout": 0.0}
    | {"hidden_dropout": 0.0, "embedding_dropout": 0.0},
    # GPT2Config / GPTBigCodeConfig
    "gpt2": _GPT2 | {"hidden_act": "gelu_new"},
    "gpt_bigcode": _GPT2 | {"hidden_act": "gelu_pytorch_tanh"},
    # GPTNeoXConfig: rotary on a quarter of each head (rotary_pct 0.25), untied
    "gpt_neox": {"hidden_size": 6144, "n_layers": 44, "n_heads": 64}
    | {"intermediate_size": 24576, "vocab_size": 50432, "max_positions": 2048}
    | {"tie_word_embeddings": False, "hidden_act": "gelu", "qkv_bias": True, "o_bias": True}
    | {"mlp_bias": True, "mlp_gated": False, "partial_rotary_factor": 0.25}
    | {"attention_dropout": 0.0, "hidden_dropout": 0.0},
    # FalconConfig: falcon-7b's shape, multi-query, no biases (``bias``), tied
    "falcon": {"hidden_size": 4544, "n_layers": 32, "n_heads": 71, "vocab_size": 65024}
    | {"max_positions": 2048, "tie_word_embeddings": True, "hidden_act": "gelu"}
    | {"mlp_gated": False, "partial_rotary_factor": 1.0, "attention_dropout": 0.0}
    | {"hidden_dropout": 0.0},
    # OPTConfig: 125m's shape, biases (``enable_bias``), tied, residual dropout 0.1 (``dropout``)
    "opt": {"hidden_size": 768, "n_layers": 12, "n_heads": 12, "intermediate_size": 3072}
    | {"vocab_size": 50272, "max_positions": 2048, "tie_word_embeddings": True}
    | {"hidden_act": "relu", "mlp_gated": False, "attention_dropout": 0.0},
    # BloomConfig: the config class's tiny test shape (64 wide, 2 layers, 8 heads), ALiBi, tied
    "bloom": {"hidden_size": 64, "n_layers": 2, "n_heads": 8, "vocab_size": 250880}
    | {"tie_word_embeddings": True, "qkv_bias": True, "o_bias": True, "mlp_bias": True}
    | {"mlp_gated": False, "attention_dropout": 0.0, "hidden_dropout": 0.0},
    # BertConfig / RobertaConfig / ViTConfig (ViT has no LM head and no tie attribute: False)
    "bert": _ENCODER
    | {"hidden_size": 768, "n_layers": 12, "n_heads": 12, "intermediate_size": 3072}
    | {"vocab_size": 30522, "max_positions": 512, "attention_dropout": 0.1}
    | {"hidden_dropout": 0.1},
    "roberta": _ENCODER
    | {"hidden_size": 768, "n_layers": 12, "n_heads": 12, "intermediate_size": 3072}
    | {"vocab_size": 50265, "max_positions": 512, "attention_dropout": 0.1}
    | {"hidden_dropout": 0.1},
    "vit": _ENCODER
    | {"hidden_size": 768, "n_layers": 12, "n_heads": 12, "intermediate_size": 3072}
    | {"attention_dropout": 0.0, "hidden_dropout": 0.0, "tie_word_embeddings": False},
    # T5Config: 512 wide, 8 heads of 64 (d_kv), 6 + 6 layers, relu MLP of 2048, dropout 0.1
    "t5": {"hidden_size": 512, "n_layers": 6, "n_heads": 8, "head_dim": 64}
    | {"intermediate_size": 2048, "vocab_size": 32128, "tie_word_embeddings": True}
    | {"qkv_bias": False, "o_bias": False, "mlp_bias": False, "is_encoder_decoder": True},
    # CLIPConfig has no tie attribute (CLIPModel has no LM head); the towers' defaults below
    "clip": {"tie_word_embeddings": False},
    # CLIPTextConfig / CLIPVisionConfig
    "clip_text_model": {"hidden_size": 512, "n_layers": 12, "n_heads": 8}
    | {"intermediate_size": 2048, "vocab_size": 49408, "max_positions": 77}
    | {"hidden_act": "quick_gelu", "attention_dropout": 0.0},
    "clip_vision_model": {"hidden_size": 768, "n_layers": 12, "n_heads": 12}
    | {"intermediate_size": 3072, "hidden_act": "quick_gelu", "attention_dropout": 0.0},
}
for _name in ("clip_text_model", "clip_vision_model"):
    FAMILY_DEFAULTS[_name] |= {"qkv_bias": True, "o_bias": True, "mlp_bias": True}
    FAMILY_DEFAULTS[_name] |= {"mlp_gated": False, "tie_word_embeddings": False}
FAMILY_DEFAULTS["roberta"]["tie_word_embeddings"] = True

#: A per-family reader: (the config, the fields read so far) → updates ``fields`` in place.
Reader = Callable[[Mapping[str, Any], dict[str, Any]], None]
READERS: dict[str, Reader] = {}

#: model_type -> config.json spellings of :data:`KEY_TABLE` its transformers config class never
#: reads (5.23): a config may carry them (transformers keeps unknown keys as attributes), but the
#: model is built from the class's own key, so they are skipped. GPT2MLP / GPTBigCodeMLP size
#: their MLP from ``n_inner`` (null: 4·n_embd) and GPT2Attention has one K/V head per query head
#: (``models/gpt2/modeling_gpt2.py``; BigCode's K/V heads come from ``multi_query``); FalconMLP
#: reads ``ffn_hidden_size`` and its K/V heads come from ``num_kv_heads`` / ``multi_query``
#: (``models/falcon/configuration_falcon.py``); OPT's MLP is ``ffn_dim`` wide; GPT-NeoX and OPT
#: have no grouped K/V. Found by the fast-path grid (issue 32): the tiny configs carry these
#: keys, and the analytic engine built a 1-K/V-head, 64-wide MLP where transformers builds 2 and
#: 128.
IGNORED_KEYS: dict[str, frozenset[str]] = {
    "gpt2": frozenset({"intermediate_size", "num_key_value_heads", "num_kv_heads"}),
    "gpt_bigcode": frozenset({"intermediate_size", "num_key_value_heads", "num_kv_heads"}),
    "falcon": frozenset({"intermediate_size", "num_key_value_heads"}),
    "gpt_neox": frozenset({"num_key_value_heads", "num_kv_heads"}),
    "opt": frozenset({"intermediate_size", "num_key_value_heads", "num_kv_heads"}),
}


def reader(*model_types: str) -> Callable[[Reader], Reader]:
    """Register a reader for ``model_types`` (run after the key table and the defaults)."""

    def register(fn: Reader) -> Reader:
        for t in model_types:
            READERS[t] = fn
        return fn

    return register


def first_given(config: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str | None, Any]:
    """(key, value) of the first spelling with a value; (first present key, None) when the
    config spells the field but as null; (None, None) when it does not name the field."""
    present = None
    for key in keys:
        if key in config:
            if config[key] is not None:
                return key, config[key]
            present = present or key
    return present, None


def read_fields(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The canonical fields of ``config`` (not yet validated) and the key each came from."""
    fields: dict[str, Any] = {}
    keys: dict[str, str] = {}
    defaults = FAMILY_DEFAULTS.get(str(config.get("model_type")), {})
    ignored = IGNORED_KEYS.get(str(config.get("model_type")), frozenset())
    for name, spellings in KEY_TABLE.items():
        spellings = tuple(k for k in spellings if k not in ignored)
        key, value = first_given(config, spellings)
        if key is None and name == "partial_rotary_factor":  # transformers 5 saves it here
            rope = config.get("rope_parameters")
            if isinstance(rope, Mapping) and rope.get(name) is not None:
                key, value = "rope_parameters", rope[name]
        if key is None:
            value = defaults.get(name)
        else:
            keys[name] = key
        fields[name] = value
    for name, value in defaults.items():
        if name not in KEY_TABLE:
            fields.setdefault(name, value)
    fields.setdefault("mlp_gated", None)
    if (read := READERS.get(str(config.get("model_type")))) is not None:
        read(config, fields)
    return fields, keys


# --------------------------------------------------------------------------- per-family readers
@reader("gpt2", "gpt_bigcode")
def _gpt2(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """``n_inner: null`` is 4·n_embd (GPT2MLP); BigCode's ``multi_query`` (default True) has one
    K/V head; GPT-2 learns ``n_positions`` positions; no rotary."""
    if f["intermediate_size"] is None and f["hidden_size"] is not None:
        f["intermediate_size"] = 4 * f["hidden_size"]
    if config.get("model_type") == "gpt_bigcode":
        f["n_kv_heads"] = 1 if config.get("multi_query", True) else f["n_heads"]
    if config.get("n_positions") is not None:
        f["max_positions"] = config["n_positions"]
    f["partial_rotary_factor"] = None


@reader("falcon")
def _falcon(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """FalconConfig: ``ffn_hidden_size`` null is 4·hidden; K/V heads: ``num_kv_heads`` under
    ``new_decoder_architecture``, one with ``multi_query`` (default), else one per query head;
    ``bias`` (default False) on every linear; rotary unless ``alibi``."""
    h, heads = f["hidden_size"], f["n_heads"]
    if f["intermediate_size"] is None and h is not None:
        f["intermediate_size"] = 4 * h
    if config.get("new_decoder_architecture"):
        f["n_kv_heads"] = config.get("num_kv_heads") or heads
    else:
        f["n_kv_heads"] = 1 if config.get("multi_query", True) else heads
    bias = bool(config.get("bias", False))
    f["qkv_bias"] = f["o_bias"] = f["mlp_bias"] = bias
    if config.get("alibi"):
        f["partial_rotary_factor"] = None


@reader("opt")
def _opt(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """OPTConfig: ``enable_bias`` (default True) on every linear; ``dropout`` (default 0.1) on
    the residual branches and the embeddings; learned positions, no rotary."""
    bias = bool(config.get("enable_bias", True))
    f["qkv_bias"] = f["o_bias"] = f["mlp_bias"] = bias
    dropout = config.get("dropout", 0.1)
    f["hidden_dropout"] = f["embedding_dropout"] = dropout
    f["partial_rotary_factor"] = None


@reader("bloom")
def _bloom(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """BloomMLP is always 4·hidden (``n_inner`` is ignored); ALiBi, not rotary; no activation
    key (BloomGelu, a tanh GELU written out)."""
    if f["hidden_size"] is not None:
        f["intermediate_size"] = 4 * f["hidden_size"]
    f["hidden_act"] = None
    f["partial_rotary_factor"] = None


@reader("bert", "roberta", "vit")
def _encoder(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """BERT-style encoders: ``hidden_dropout_prob`` also drops the embeddings; ViT's
    ``qkv_bias`` covers only q/k/v; learned (BERT) or patch (ViT) positions, no rotary."""
    f["embedding_dropout"] = f["hidden_dropout"]
    f["o_bias"] = f["mlp_bias"] = True
    if config.get("model_type") == "vit":
        f["vocab_size"] = None  # pixels in, no token embedding
        f["max_positions"] = None
    f["partial_rotary_factor"] = None


@reader("gemma2")
def _gemma2(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """Gemma2Config.__post_init__: layers alternate sliding and full attention, starting with
    sliding (``layer_types`` when config.json does not give them). Gemma2MLP's activation is
    ``hidden_activation``; a ``hidden_act`` beside it is not a Gemma2Config field."""
    f["hidden_act"] = config.get("hidden_activation") or "gelu_pytorch_tanh"
    if f["layer_types"] is None and isinstance(f["n_layers"], int):
        f["layer_types"] = [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(f["n_layers"])
        ]


@reader("gemma3_text")
def _gemma3(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """Gemma3TextConfig.__post_init__: ``sliding_window_pattern`` (default 6) sets the layer
    types when config.json gives none: every pattern-th layer full, the others sliding;
    the MLP's activation is ``hidden_activation``."""
    f["hidden_act"] = config.get("hidden_activation") or "gelu_pytorch_tanh"
    pattern = config.get("sliding_window_pattern", 6)
    if f["layer_types"] is None and isinstance(f["n_layers"], int) and isinstance(pattern, int):
        f["layer_types"] = [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(f["n_layers"])
        ]


@reader("qwen2", "qwen3", "qwen3_moe")
def _qwen2(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """Qwen2Config / Qwen3Config.__post_init__: ``sliding_window`` is None unless
    ``use_sliding_window``;
    layers from ``max_window_layers`` (default 28) on slide when it is set."""
    if not config.get("use_sliding_window", False):
        f["sliding_window"] = None
    elif "sliding_window" not in config:
        f["sliding_window"] = 4096  # Qwen2Config.sliding_window
    if f["layer_types"] is None and isinstance(f["n_layers"], int):
        start, window = config.get("max_window_layers", 28), f["sliding_window"]
        f["layer_types"] = [
            "sliding_attention" if window is not None and i >= start else "full_attention"
            for i in range(f["n_layers"])
        ]


@reader("mixtral")
def _mixtral(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """MixtralSparseMoeBlock: every expert is a gated MLP of ``intermediate_size``."""
    f["expert_intermediate_size"] = f["intermediate_size"]


@reader("t5")
def _t5(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """T5Config: ``num_decoder_layers`` null is ``num_layers``; ``feed_forward_proj``
    (default ``relu``) is ``[gated-]act`` and ``gated-gelu`` means ``gelu_new``; one
    ``dropout_rate`` (default 0.1) everywhere; the config class forces ``tie_word_embeddings``
    to True (the decoder output is scaled unless config.json said False); relative position
    buckets, no rotary, no learned positions."""
    if f["n_decoder_layers"] is None:
        f["n_decoder_layers"] = f["n_layers"]
    proj = str(config.get("feed_forward_proj") or "relu")
    f["mlp_gated"] = proj.startswith("gated-")
    f["hidden_act"] = "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1]
    p = config.get("dropout_rate", 0.1)
    f["attention_dropout"] = f["hidden_dropout"] = f["embedding_dropout"] = p
    f["tie_word_embeddings"] = True
    f["partial_rotary_factor"] = None
