"""A model family's shape as the closed forms need it: an analytic view of the ModelSpec.

``read_config(config, family)`` reads the :class:`~memfit.models.model_spec.ModelSpec` (where
the many spellings of Hugging Face configs and the config classes' defaults are resolved) and
keeps what the layer programs of ``family`` read, in their names. Which family a model_type is,
and whether it has a program, is the registry's (``registry.py``: ``read_arch``, ``supports``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from memfit.errors import SpecError
from memfit.models.model_spec import ModelSpec


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
    #: Width of one routed expert's gated MLP where it differs from ``ffn`` (the dense MLP's).
    expert_ffn: int = 0
    n_dec_layers: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kv_dim(self) -> int:
        return self.n_kv * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim


def read_config(config: dict[str, Any] | ModelSpec, family: str) -> Arch:
    """The :class:`Arch` of ``family`` viewed from a config.json dict or its ModelSpec. Which
    family a model_type is, and whether it has a program, is the registry's (``registry.py``:
    ``read_arch``, ``supports``)."""
    return _VIEWS.get(family, _decoder)(ModelSpec.of(config), family)


def _need(spec: ModelSpec, *names: str) -> list[int]:
    """The named counts; SpecError naming the first the config leaves unknown."""
    values = [getattr(spec, n) for n in names]
    for name, value in zip(names, values, strict=True):
        if value is None:
            raise SpecError(
                f"model_type {spec.model_type!r}: the config gives no {name} (nor does its "
                "config class default one); add it to config.json or use --engine trace"
            )
    return values


def _decoder(spec: ModelSpec, family: str) -> Arch:
    """The Llama-style view: the spec's fields as they are; an unknown ``intermediate_size``
    is 4·hidden, no dropout where the config gives none."""
    h, layers, heads, kv, head_dim = _need(
        spec, "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim"
    )
    return Arch(
        family=family,
        model_type=spec.model_type or "",
        hidden=h,
        n_layers=layers,
        n_heads=heads,
        n_kv=kv,
        head_dim=head_dim,
        ffn=spec.intermediate_size or 4 * h,
        vocab=spec.vocab_size or 0,
        tie=bool(spec.tie_word_embeddings),
        act=spec.hidden_act or "silu",
        qkv_bias=bool(spec.qkv_bias),
        o_bias=bool(spec.o_bias),
        mlp_bias=bool(spec.mlp_bias),
        rot_dim=spec.rotary_dim or 0,
        n_positions=0,
        attn_dropout=spec.attention_dropout or 0.0,
        sliding_window=spec.sliding_window,
        layer_types=spec.layer_types or (),
        n_experts=spec.n_experts or 0,
        top_k=spec.n_experts_per_token or 0,
        expert_ffn=spec.expert_intermediate_size or 0,
        extra=dict(spec.raw),
    )


def _learned(spec: ModelSpec, family: str, *, emb_dropout: bool = True) -> Arch:
    """GPT-2 / BigCode / OPT / BERT / ViT: learned positions, no rotary, the spec's residual
    (and embedding) dropouts."""
    return replace(
        _decoder(spec, family),
        n_positions=spec.max_positions or 0,
        resid_dropout=spec.hidden_dropout or 0.0,
        emb_dropout=(spec.embedding_dropout or 0.0) if emb_dropout else 0.0,
        rot_dim=0,
    )


def _opt(spec: ModelSpec, family: str) -> Arch:
    return _learned(spec, family, emb_dropout=False)


def _bert(spec: ModelSpec, family: str) -> Arch:
    """BERT / RoBERTa / ViT: ``tie`` is False since the classification head has no LM head."""
    return replace(_learned(spec, family), tie=False)


def _residual(spec: ModelSpec, family: str) -> Arch:
    """NeoX / Phi / Falcon / BLOOM: the spec's residual dropout (``hidden_dropout``,
    ``resid_pdrop``); Phi's embedding dropout."""
    a = _decoder(spec, family)
    return replace(
        a, resid_dropout=spec.hidden_dropout or 0.0, emb_dropout=spec.embedding_dropout or 0.0
    )


def _falcon(spec: ModelSpec, family: str) -> Arch:
    """Falcon: K/V heads as the attention sees them (every query head under
    ``new_decoder_architecture``: K/V are broadcast before attention), rotary over the whole
    head (``rot_dim`` is kept for the ALiBi variant too; its program ignores it)."""
    a = _residual(spec, family)
    n_kv = a.n_heads if spec.get("new_decoder_architecture") else a.n_kv
    return replace(a, n_kv=n_kv, rot_dim=a.head_dim)


def _bloom(spec: ModelSpec, family: str) -> Arch:
    return replace(_residual(spec, family), rot_dim=0)


def _gemma2(spec: ModelSpec, family: str) -> Arch:
    """Gemma 2: the soft-capping values (Gemma2Config's 50 / 30 when config.json omits them)
    travel in ``extra``, where the program reads them."""
    a = _decoder(spec, family)
    caps = {
        "attn_logit_softcapping": spec.attn_logit_softcapping,
        "final_logit_softcapping": spec.final_logit_softcapping,
    }
    return replace(a, extra={**a.extra, **caps})


def _t5(spec: ModelSpec, family: str) -> Arch:
    """T5: encoder layers and decoder layers, ``d_kv`` heads, one dropout; ``extra`` carries
    the gated feed-forward switch, whether the decoder output is scaled by ``d_model ** -0.5``
    (unless config.json says ``tie_word_embeddings: false``: T5 v1.1, Flan-T5; the weights are
    tied whatever it says) and the relative-position buckets."""
    a = _decoder(spec, family)
    p = spec.hidden_dropout or 0.0
    extra = {
        **a.extra,
        "_gated": bool(spec.mlp_gated),
        "_scale_decoder_outputs": spec.get("tie_word_embeddings") is not False,
        "_buckets": int(spec.get("relative_attention_num_buckets", 32)),
    }
    return replace(
        a,
        n_dec_layers=spec.n_decoder_layers or a.n_layers,
        n_kv=a.n_heads,
        attn_dropout=p,
        resid_dropout=p,
        emb_dropout=p,
        rot_dim=0,
        sliding_window=None,
        extra=extra,
    )


def _whisper(spec: ModelSpec, family: str) -> Arch:
    """Whisper (``WhisperConfig``, transformers 5.23 configuration_whisper.py): ``d_model``,
    encoder and decoder depths, heads and feed-forward widths, and its defaults where the
    config.json leaves them out. The Arch's heads and ``ffn`` are the encoder's; ``extra`` keeps
    the decoder's, the mel bins and the position counts."""

    def num(key: str, default: Any) -> Any:
        value = spec.get(key)
        return default if value is None else value

    d = int(num("d_model", 384))
    heads = int(num("encoder_attention_heads", 6))
    dec_heads = int(num("decoder_attention_heads", 6))
    ffn = int(num("encoder_ffn_dim", 1536))
    dec_ffn = int(num("decoder_ffn_dim", 1536))
    if d % heads or d % dec_heads:
        raise SpecError(
            f"model_type 'whisper': encoder/decoder attention heads ({heads}, {dec_heads}) must "
            f"divide d_model ({d})"
        )
    p = float(num("dropout", 0.0))
    return Arch(
        family=family,
        model_type="whisper",
        hidden=d,
        n_layers=int(num("encoder_layers", 4)),
        n_dec_layers=int(num("decoder_layers", 4)),
        n_heads=heads,
        n_kv=heads,
        head_dim=d // heads,
        ffn=ffn,
        vocab=int(num("vocab_size", 51865)),
        tie=True,
        act=str(num("activation_function", "gelu")),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        n_positions=int(num("max_target_positions", 448)),
        attn_dropout=float(num("attention_dropout", 0.0)),
        resid_dropout=p,
        emb_dropout=p,
        extra={
            **dict(spec.raw),
            "_mels": int(num("num_mel_bins", 80)),
            "_dec_heads": dec_heads,
            "_dec_ffn": dec_ffn,
            "_source_positions": int(num("max_source_positions", 1500)),
            "_act_dropout": float(num("activation_dropout", 0.0)),
            "_scale_embedding": bool(num("scale_embedding", False)),
        },
    )


def _clip(spec: ModelSpec, family: str) -> Arch:
    """CLIP: the text tower's dimensions (the trace's first layer stack; ``freeze_layers`` is
    checked against it); ``extra`` keeps the whole config for the CLIP program."""
    if spec.text is None:
        raise SpecError("model_type 'clip': the config has no text_config; use --engine trace")
    a = _learned(spec.text, family)
    return replace(
        a,
        model_type=spec.model_type or "",
        tie=False,
        resid_dropout=0.0,
        emb_dropout=0.0,
        extra=dict(spec.raw),
    )


_VIEWS: dict[str, Callable[[ModelSpec, str], Arch]] = {
    "t5": _t5,
    "whisper": _whisper,
    "clip": _clip,
    "falcon": _falcon,
    "bloom": _bloom,
    "phi": _residual,
    "neox": _residual,
    "gemma2": _gemma2,
    "vit": _bert,
    "bert": _bert,
    "gpt2": _learned,
    "bigcode": _learned,
    "opt": _opt,
}
