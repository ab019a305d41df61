"""A decoder LLM's dimensions and parameter counts as the parallel closed form needs them.

Read from the :class:`~memfit.models.model_spec.ModelSpec` (the one reader of config.json).
Parameters are split the way Megatron-core counts them (``compute_weight_and_optimizer_memory``
in ``megatron/training/theoretical_memory_usage.py``, NVIDIA/Megatron-LM 00caa53): per layer an
attention block, an MLP (dense, or routed experts + shared experts + a router for a MoE
layer) and norms; the embeddings and the output head (one matrix each, ``vocab x hidden``).

The attention block's count is what is left of the model's own parameter count
(``ModelSpec.n_params``, memfit's counter for every family) after the embeddings, head, MLPs and
norms, so multi-head latent attention (DeepSeek) or QKV biases are counted without a formula
per family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.errors import NotModelledError
from memfit.models.model_spec import ModelSpec

#: Gated MLPs (SwiGLU / GeGLU) have three matrices, plain ones two.
GATED_MATRICES, PLAIN_MATRICES = 3, 2


@dataclass(frozen=True, kw_only=True)
class DecoderShape:
    """Dimensions (``n_`` counts, widths in elements) and per-part parameter counts."""

    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    gated: bool
    n_experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int  # all shared experts together (0: none)
    n_dense_layers: int  # leading dense layers of a MoE model (DeepSeek first_k_dense_replace)
    attention_params: int  # one layer's attention block (with its biases, without norms)
    norm_params: int  # one layer's norms
    model_type: str = ""  # config.json's (what --compile's measured ratios are keyed by)

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return GATED_MATRICES if self.gated else PLAIN_MATRICES

    @property
    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        return self.mlp_matrices * self.hidden * self.expert_ffn

    @property
    def shared_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.shared_ffn

    @property
    def router_params(self) -> int:
        return self.hidden * self.n_experts

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe and layer >= self.n_dense_layers


def read_shape(spec: ModelSpec) -> DecoderShape:
    """The :class:`DecoderShape` of a decoder-only LLM; NotModelledError for anything else."""
    why = _not_modelled(spec)
    if why:
        raise NotModelledError(
            f"model_type {spec.model_type!r}: {why}; the parallel closed form (pp/cp/ep > 1, "
            "--sp, --float8) models decoder-only language models",
            engine="analytic",
        )
    raw: Any = spec.raw
    h, n_layers = int(spec.hidden_size or 0), int(spec.n_layers or 0)
    heads = int(spec.n_heads or 0)
    kv = int(spec.n_kv_heads or heads)
    head_dim = int(spec.head_dim or h // max(heads, 1))
    n_experts = int(spec.n_experts or 0)
    top_k = int(spec.n_experts_per_token or (1 if n_experts else 0))
    expert_ffn = int(spec.expert_intermediate_size or spec.intermediate_size or 0)
    shared = int(spec.shared_expert_intermediate_size or 0)
    if not shared and spec.n_shared_experts:
        shared = int(spec.n_shared_experts) * expert_ffn
    dense_first = int(raw.get("first_k_dense_replace") or 0) if n_experts else 0
    gated = spec.mlp_gated is not False
    ffn = int(spec.intermediate_size or 4 * h)
    tied = bool(spec.tie_word_embeddings)
    norm = 2 * h  # two RMSNorm / LayerNorm weights (their biases are noise at this scale)
    shape = DecoderShape(
        hidden=h,
        n_layers=n_layers,
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=head_dim,
        ffn=ffn,
        vocab=int(spec.vocab_size or 0),
        tied=tied,
        gated=gated,
        n_experts=n_experts,
        top_k=top_k,
        expert_ffn=expert_ffn,
        shared_ffn=shared,
        n_dense_layers=dense_first,
        attention_params=0,
        norm_params=norm,
        model_type=str(spec.model_type or ""),
    )
    attention = _attention_params(spec, shape)
    return DecoderShape(**{**shape.__dict__, "attention_params": attention})


def _not_modelled(spec: ModelSpec) -> str | None:
    if spec.is_encoder_decoder or spec.text is not None or spec.vision is not None:
        return "an encoder-decoder or multimodal model"
    if spec.task != "causal-lm":
        return f"task {spec.task!r} (not a causal LM)"
    need = ("hidden_size", "n_layers", "n_heads", "vocab_size")
    missing = [n for n in need if getattr(spec, n) is None]
    return f"the config gives no {', '.join(missing)}" if missing else None


def _attention_params(spec: ModelSpec, s: DecoderShape) -> int:
    """One layer's attention block: the model's count less everything else, per layer; the
    standard q/k/v/o count where the model has no counter."""
    standard = 2 * s.hidden * s.q_dim + 2 * s.hidden * s.kv_dim
    total = spec.n_params
    if total is None:
        return standard
    heads = s.embedding_params * (1 if s.tied else 2) + s.hidden  # + final norm
    n_moe = s.n_layers - s.n_dense_layers if s.moe else 0
    mlps = (s.n_layers - n_moe) * s.dense_mlp_params
    mlps += n_moe * (s.n_experts * s.expert_params + s.shared_params + s.router_params)
    rest = total - heads - mlps - s.n_layers * s.norm_params
    per_layer = rest // max(s.n_layers, 1)
    return per_layer if per_layer > 0 else standard


__all__ = ["DecoderShape", "read_shape"]
