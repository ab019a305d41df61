"""A model family's shape, read from config.json: the numbers the closed forms need.

``read_config(config, family, model_type)`` normalises the many spellings of Hugging Face configs
(``n_embd`` / ``hidden_size`` / ``d_model``…) into one :class:`Arch`. Which family a model_type
is, and whether it has a layer program, is the registry's (``registry.py``: ``read_arch``,
``supports``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

#: Families whose config class defaults ``tie_word_embeddings`` to True.
TIED_BY_DEFAULT = ("gemma2", "gpt2", "gpt_bigcode", "opt", "bloom", "phi3", "t5", "falcon")


def _get(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return default


@dataclass(frozen=True, kw_only=True)
class Arch:
    """Dimensions and switches of one transformer. Counts start with ``n_``."""

    family: str
    model_type: str
    hidden: int
    n_layers: int
    n_heads: int
    n_kv: int
    head_dim: int
    ffn: int
    vocab: int
    tie: bool
    act: str
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rot_dim: int = 0
    n_positions: int = 0
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    emb_dropout: float = 0.0
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    n_experts: int = 0
    top_k: int = 0
    n_dec_layers: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kv_dim(self) -> int:
        return self.n_kv * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim


def read_config(config: dict[str, Any], family: str, model_type: str) -> Arch:
    """The :class:`Arch` of a config.json dict of ``family`` (the registry, ``registry.py``,
    maps each model_type to its family and reader)."""
    reader = _READERS.get(family, _read_decoder)
    return reader(config, family, model_type)


def _read_decoder(config: dict[str, Any], family: str, model_type: str) -> Arch:
    h = int(_get(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_get(config, "num_attention_heads", "n_head", "num_heads"))
    kv = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=h // heads))
    ffn = int(_get(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * h))
    layers = int(_get(config, "num_hidden_layers", "n_layer", "num_layers"))
    rope_params = config.get("rope_parameters") or {}
    partial = float(
        _get(config, "partial_rotary_factor", "rotary_pct", default=None)
        or rope_params.get("partial_rotary_factor", 1.0)
    )
    return Arch(
        family=family,
        model_type=model_type,
        hidden=h,
        n_layers=layers,
        n_heads=heads,
        n_kv=kv,
        head_dim=head_dim,
        ffn=ffn,
        vocab=int(config.get("vocab_size", 0)),
        tie=bool(config.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
        act=str(_get(config, "hidden_act", "activation_function", default="silu")),
        qkv_bias=bool(_get(config, "attention_bias", default=model_type == "qwen2")),
        o_bias=bool(_get(config, "attention_bias", default=False)),
        mlp_bias=bool(_get(config, "mlp_bias", default=False)),
        rot_dim=int(head_dim * partial),
        attn_dropout=float(_get(config, "attention_dropout", default=0.0)),
        sliding_window=_get(config, "sliding_window"),
        n_experts=int(_get(config, "num_local_experts", default=0)),
        top_k=int(_get(config, "num_experts_per_tok", default=0)),
        extra=dict(config),
    )


def _read_gpt2(config: dict[str, Any], family: str, model_type: str) -> Arch:
    """GPT-2 / GPT-BigCode: ``n_embd``, ``n_inner`` (None: 4·n_embd), ``*_pdrop`` dropouts;
    BigCode's ``multi_query`` has one key/value head."""
    a = _read_decoder(config, family, model_type)
    h = a.hidden
    return replace(
        a,
        n_kv=1 if config.get("multi_query", model_type == "gpt_bigcode") else a.n_heads,
        ffn=int(config.get("n_inner") or 4 * h),
        tie=bool(config.get("tie_word_embeddings", True)),
        act=str(
            config.get("activation_function")
            or ("gelu_pytorch_tanh" if model_type == "gpt_bigcode" else "gelu_new")
        ),
        n_positions=int(config.get("n_positions", 1024)),
        attn_dropout=float(config.get("attn_pdrop", 0.1)),
        resid_dropout=float(config.get("resid_pdrop", 0.1)),
        emb_dropout=float(config.get("embd_pdrop", 0.1)),
        rot_dim=0,
    )


def _read_neox(config: dict[str, Any], family: str, model_type: str) -> Arch:
    a = _read_decoder(config, family, model_type)
    return replace(
        a,
        tie=bool(config.get("tie_word_embeddings", False)),
        act=str(config.get("hidden_act", "gelu")),
        attn_dropout=float(config.get("attention_dropout", 0.0)),
        resid_dropout=float(config.get("hidden_dropout", 0.0)),
    )


def _read_opt(config: dict[str, Any], family: str, model_type: str) -> Arch:
    a = _read_decoder(config, family, model_type)
    return replace(
        a,
        ffn=int(config.get("ffn_dim", 4 * a.hidden)),
        tie=bool(config.get("tie_word_embeddings", True)),
        act=str(config.get("activation_function", "relu")),
        n_positions=int(config.get("max_position_embeddings", 2048)),
        attn_dropout=float(config.get("attention_dropout", 0.0)),
        resid_dropout=float(config.get("dropout", 0.1)),
        rot_dim=0,
    )


def _read_bert(config: dict[str, Any], family: str, model_type: str) -> Arch:
    a = _read_decoder(config, family, model_type)
    return replace(
        a,
        tie=False,  # the classification head has no LM head
        act=str(config.get("hidden_act", "gelu")),
        n_positions=int(config.get("max_position_embeddings", 512)),
        attn_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
        resid_dropout=float(config.get("hidden_dropout_prob", 0.1)),
        emb_dropout=float(config.get("hidden_dropout_prob", 0.1)),
        rot_dim=0,
    )


def _read_vit(config: dict[str, Any], family: str, model_type: str) -> Arch:
    a = _read_bert(config, family, model_type)
    return replace(
        a,
        vocab=0,
        attn_dropout=float(config.get("attention_probs_dropout_prob", 0.0)),
        resid_dropout=float(config.get("hidden_dropout_prob", 0.0)),
        emb_dropout=float(config.get("hidden_dropout_prob", 0.0)),
    )


def _read_gemma2(config: dict[str, Any], family: str, model_type: str) -> Arch:
    """Gemma 2: Gemma2Config's soft-capping defaults (50 on attention logits, 30 on the final
    logits) apply when config.json omits them."""
    a = _read_decoder(config, family, model_type)
    extra = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, **config}
    return replace(a, act=str(config.get("hidden_activation") or "gelu_pytorch_tanh"), extra=extra)


def _read_phi(config: dict[str, Any], family: str, model_type: str) -> Arch:
    a = _read_decoder(config, family, model_type)
    given = "partial_rotary_factor" in config or "partial_rotary_factor" in (
        config.get("rope_parameters") or {}
    )
    return replace(
        a,
        rot_dim=a.rot_dim if given else a.head_dim // 2,  # PhiConfig's default factor: 0.5
        act=str(config.get("hidden_act", "gelu_new")),
        attn_dropout=float(config.get("attention_dropout", 0.0)),
        resid_dropout=float(config.get("resid_pdrop", 0.0)),
        emb_dropout=float(config.get("embd_pdrop", 0.0)),
        qkv_bias=True,
    )


def _read_bloom(config: dict[str, Any], family: str, model_type: str) -> Arch:
    a = _read_decoder(config, family, model_type)
    return replace(
        a,
        ffn=4 * a.hidden,  # BloomMLP: dense_h_to_4h is always 4·hidden
        attn_dropout=float(config.get("attention_dropout", 0.0)),
        resid_dropout=float(config.get("hidden_dropout", 0.0)),
        rot_dim=0,
    )


_READERS: dict[str, Any] = {
    "bloom": _read_bloom,
    "phi": _read_phi,
    "gemma2": _read_gemma2,
    "vit": _read_vit,
    "bert": _read_bert,
    "gpt2": _read_gpt2,
    "bigcode": _read_gpt2,
    "neox": _read_neox,
    "opt": _read_opt,
}
