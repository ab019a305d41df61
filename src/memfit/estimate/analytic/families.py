"""The rotary decoder families, declared over the block vocabulary (``blocks.py``, ``mlp.py``;
what a declaration means: ``decoder.py``).

Each declaration follows its ``modeling_*.py`` in transformers 5.23. A new decoder that differs
from one of these in a block is one :func:`~memfit.estimate.analytic.decoder.declare` call here
(the registry, ``registry.py``, picks up every declaration of this module): Qwen3 below is Qwen2
with per-head q/k RMSNorms.
"""

from __future__ import annotations

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.blocks import Attention, Shared, Work, eager_mask, rotary_tables
from memfit.estimate.analytic.decoder import DecoderFamily, DecoderProgram, declare
from memfit.estimate.analytic.graph import Tensor
from memfit.estimate.analytic.mlp import Mlp
from memfit.estimate.analytic.ops import Ops


class Gemma2Program(DecoderProgram):
    """``Gemma2Model``'s masks: soft-capped attention logits make transformers run eager
    attention (SDPA has no soft-capping), so the model builds the full and the sliding-window
    float masks; a layer reads one, as an SDPA layer would read the bool sliding mask."""

    def eager(self, w: Work) -> bool:
        cap = self.family.attention.softcap
        return w.impl == "eager" or bool(cap and self.a.extra.get(cap))

    def embed_masks(self, o: Ops, w: Work, shared: Shared, x_dtype: str) -> None:
        if self.eager(w) and w.q_len > 1:
            shared.mask = eager_mask(o, w, x_dtype)
            o.g.hold(eager_mask(o, w, x_dtype))  # the sliding-window mask

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        sh = super().shared_for_layer(o, w, x_dtype)
        if self.eager(w) and w.q_len > 1 and sh.mask is None:
            sh.mask = o.g.external(w.batch * w.q_len * w.kv_len, x_dtype)
        return sh


class Gemma3Program(Gemma2Program):
    """``Gemma3TextModel``: Gemma 2's layer without the soft-caps (so SDPA runs unless eager is
    asked), per-head q/k norms, and two rotary tables — the global one and the sliding layers'
    local one (``rope_local_base_freq``) — computed once per forward, each with its
    ``inv_freq`` buffers (one table where ``layer_types`` has one type). Masks: eager builds
    the full and the sliding float masks (Gemma 2's pair); SDPA the sliding bool mask only when
    the sequence outruns the window. The sliding layers' ``DynamicSlidingWindowLayer`` keeps
    ``full[:, :, -window + 1:]``, a view of the whole ``cat``: a prefill's (and a training
    step's) cache is as long as a full layer's."""

    @property
    def n_rotary_tables(self) -> int:
        """One rotary table per layer type the config has (transformers 5.23,
        ``Gemma3RotaryEmbedding``: buffers for ``sorted(set(config.layer_types))``, and
        ``Gemma3TextModel.forward`` computes ``position_embeddings`` for
        ``set(config.layer_types)``): a model cut to its first layers (all sliding) has one."""
        types = set(self.a.layer_types)
        return len(types) if types else 2

    def buffer_bytes(self, precision: str) -> int:
        # the tables' inv_freq buffers; the fp32 embed_scale
        return self.n_rotary_tables * super().buffer_bytes(precision) + 4

    def embed_masks(self, o: Ops, w: Work, shared: Shared, x_dtype: str) -> None:
        if self.eager(w):
            super().embed_masks(o, w, shared, x_dtype)
        else:
            DecoderProgram.embed_masks(self, o, w, shared, x_dtype)

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        if self.eager(w):
            return super().shared_for_layer(o, w, x_dtype)
        return DecoderProgram.shared_for_layer(self, o, w, x_dtype)

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        x, shared = super().embed(o, w)
        if self.n_rotary_tables > 1:
            rd = self.family.attention.table_dim(self.a)
            rotary_tables(o, w, rd, x.dtype)  # the local table (held through the forward)
        return x, shared


class Qwen3MoeProgram(DecoderProgram):
    """``Qwen3MoeModel``: every layer sparse unless the config makes some dense
    (``mlp_only_layers``, ``decoder_sparse_step`` > 1) — those mixed stacks are not modelled.
    Formats whose checkpoints store the 3-D experts quantized (Qwen3-30B-A3B-FP8's block-wise
    FP8, GPTQ / AWQ per expert) store them so (``mlp.sparse_moe``); bitsandbytes quantizes
    ``nn.Linear`` only, so its formats leave the experts in the compute dtype."""

    def __init__(self, a: Arch, family: DecoderFamily) -> None:
        super().__init__(a, family)
        dense = a.extra.get("mlp_only_layers") or []
        step = a.extra.get("decoder_sparse_step", 1)
        if dense or step != 1 or not a.n_experts:
            raise SpecError(
                f"model_type 'qwen3_moe' with dense layers (mlp_only_layers={dense!r}, "
                f"decoder_sparse_step={step!r}, num_experts={a.n_experts}) is not modelled by the "
                "analytic engine; use --engine trace"
            )


#: ``LlamaDecoderLayer`` (Llama, Mistral): pre-RMSNorm, rotary q/k, SwiGLU MLP; Mistral's
#: ``sliding_window`` from its config.
LLAMA = DecoderFamily(name="llama", model_types=("llama", "mistral"))
#: Qwen2: Llama whose sliding window is on only with ``use_sliding_window`` (its q/k/v biases
#: are the config's ``attention_bias``, default on: ``arch.read_config``).
QWEN2 = declare("qwen2", like=LLAMA, attention={"window": "switched"})
#: Qwen3 (dense): Qwen2 with ``q_norm``/``k_norm``, a Qwen3RMSNorm over each head of q and k
#: before the rotary embedding (``Qwen3Attention``); no q/k/v bias unless the config says so.
QWEN3 = declare("qwen3", like=QWEN2, attention={"qk_norm": "rms"})
#: ``Phi3DecoderLayer``: Llama with a fused ``qkv_proj`` (sliced into q/k/v views) and a fused
#: ``gate_up_proj`` (chunked).
PHI3 = declare(
    "phi3",
    like=LLAMA,
    attention={"projections": "fused-slices", "names": ("qkv_proj",), "qkv_bias": False},
    mlp={"kind": "gated-fused", "names": ("gate_up_proj", "down_proj"), "bias": False},
)
#: ``MixtralDecoderLayer``: Llama with ``MixtralSparseMoeBlock`` (``mlp.sparse_moe``).
MIXTRAL = declare("mixtral", like=LLAMA, mlp=Mlp(kind="moe", names=("gate",)))
#: ``Qwen3MoeDecoderLayer``: Qwen3's attention (per-head q/k norms) and
#: ``Qwen3MoeSparseMoeBlock``: a router (``gate``) and ``num_experts`` SwiGLU experts of
#: ``moe_intermediate_size`` as 3-D parameters (``Qwen3MoeExperts``), top-k weights renormalised
#: only with ``norm_topk_prob`` and cast to the logits' dtype; no shared expert.
QWEN3_MOE = declare(
    "qwen3_moe",
    like=QWEN3,
    program=Qwen3MoeProgram,
    mlp=Mlp(kind="moe", names=("gate",), moe_routing="qwen3"),
)
#: ``Olmo2DecoderLayer``: Llama's blocks with the norms after each sub-block
#: (``post_attention_layernorm``, ``post_feedforward_layernorm``: ``post-norm``), an
#: ``Olmo2RMSNorm`` (the weight applied in fp32) everywhere, and q/k norms over the whole
#: q / k projection before the heads are split.
OLMO2 = declare(
    "olmo2",
    like=LLAMA,
    norm="rms-olmo",
    residual="post-norm",
    attention={"qk_norm": "rms-olmo", "qk_norm_over": "all"},
)
#: ``Gemma2DecoderLayer``: four RMSNorms (``(1 + w)``, fp32) around both sub-blocks, embeddings
#: scaled by sqrt(hidden), GeGLU (tanh GELU), attention logits soft-capped, rotary over the whole
#: head; the final logits' soft-cap is the LM head's (``blocks.lm_head_and_loss``).
GEMMA2 = declare(
    "gemma2",
    like=LLAMA,
    program=Gemma2Program,
    norm="rms-gemma",
    residual="sandwich",
    embedding="scaled-tokens",
    attention={"rotary": "full", "softcap": "attn_logit_softcapping"},
    mlp={"act": "gelu_tanh", "bias": False},
)
#: ``Gemma3DecoderLayer`` (text): Gemma 2's sandwich layer with Gemma-style RMSNorms over each
#: head of q and k (``q_norm``/``k_norm``), no soft-capping by default, five sliding layers to one
#: full (``layer_types``), two rotary tables (``Gemma3Program``).
GEMMA3 = declare(
    "gemma3_text",
    like=GEMMA2,
    program=Gemma3Program,
    attention={"qk_norm": "rms-gemma"},
)
#: ``GPTNeoXLayer``: parallel residual over two LayerNorms, fused ``query_key_value`` chunked
#: into q/k/v views, partial rotary (``rotary_pct``), GELU MLP with biases.
NEOX = DecoderFamily(
    name="neox",
    model_types=("gpt_neox",),
    norm="layer",
    residual="parallel",
    attention=Attention(
        projections="fused-chunks",
        names=("query_key_value",),
        out_name="dense",
        qkv_bias=True,
        out_bias=True,
        rotary="partial",
    ),
    mlp=Mlp(kind="fc", names=("dense_h_to_4h", "dense_4h_to_h"), act=None, bias=True),
)
#: ``PhiDecoderLayer`` (Phi-1/2): one LayerNorm feeding attention and MLP in parallel, q/k/v/dense
#: projections with bias, partial rotary (``partial_rotary_factor``), GELU-tanh MLP, residual
#: dropout on both branches, an LM head with bias.
PHI = DecoderFamily(
    name="phi",
    model_types=("phi",),
    norm="layer",
    residual="parallel-shared-norm",
    lm_head_bias=True,
    attention=Attention(
        out_name="dense", qkv_bias=True, out_bias=True, rotary="partial", keep_projections=True
    ),
    mlp=Mlp(kind="fc", names=("fc1", "fc2"), act=None, default_act="gelu_new", bias=True),
)

__all__ = [
    "GEMMA2",
    "GEMMA3",
    "LLAMA",
    "MIXTRAL",
    "NEOX",
    "OLMO2",
    "PHI",
    "PHI3",
    "QWEN2",
    "QWEN3",
    "QWEN3_MOE",
    "Gemma2Program",
    "Gemma3Program",
    "Qwen3MoeProgram",
]
