"""The block vocabulary of the analytic layer programs, as Hugging Face transformers 5.23 writes
each block, op by op.

A family (``decoder.py``, ``families*.py``) is declared over these blocks:

* :class:`Attention` — the q/k/v projection layout (``separate`` q/k/v projections, Phi-3's
  ``fused-slices``, GPT-NeoX's ``fused-chunks``, GPT-2's ``conv1d``), biases, rotary positions
  (``none``, ``config``, ``partial`` with head-major q, ``full``), per-head q/k norms (Qwen3),
  logit soft-capping (Gemma 2), the sliding window, attention dropout, the eager softmax; MHA,
  GQA and MQA follow from the head counts, eager/SDPA/flash from the workload
  (``attention.py``). Its pieces — :func:`project_qkv` (with the q/k norms),
  :func:`apply_rotary`, :func:`cache_kv`, :func:`attend`, :func:`project_out` — make the one
  attention block every rotary and learned-position decoder runs
  (``decoder.DecoderProgram.attention_block``).
* MLPs (``mlp.py``): gated (SwiGLU/GeGLU), gated with a fused projection, plain ``fc``, MoE.
* Norms: :data:`NORMS` (``rms``: ``LlamaRMSNorm``; ``rms-gemma``: ``(1 + w)``; ``rms-olmo``:
  ``Olmo2RMSNorm``, the weight applied in fp32; ``layer``).
* Pieces every program shares: :class:`Work` (what one pass runs), :class:`Shared` (what the
  embed block makes for every layer), :func:`rotary_tables`, :func:`rope`, :func:`cache_kv`,
  :func:`eager_mask`, :func:`keep_local`, :func:`lm_head_and_loss`.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
eq. 1) count ``sbh(34 + 5as/h)`` bytes per layer for GPT-3 in fp16 with dropout; the blocks
reproduce that count op by op and add what Hugging Face's code keeps beyond it (fp32 RMSNorm
upcasts, SwiGLU's third matmul, rotary copies).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import EAGER_SOFTMAX, AttnShape, attention
from memfit.estimate.analytic.graph import KV, Tensor
from memfit.estimate.analytic.loss import head_loss
from memfit.estimate.analytic.ops import Ops, promote


@dataclass(frozen=True, kw_only=True)
class Work:
    """What one pass runs: ``batch`` sequences of ``q_len`` new tokens attending to ``kv_len``
    (``kv_len == q_len`` for training and prefill; decode has ``q_len == 1``)."""

    batch: int
    q_len: int
    kv_len: int
    impl: str  # eager | sdpa | flash
    task: str  # causal-lm | seq-cls | seq2seq | image-cls | clip
    train: bool
    use_cache: bool = False  # the model keeps K/V in a DynamicCache
    logits_to_keep: int = 0  # 0: all positions; generate() keeps 1
    checkpointed: bool = False  # layers run under activation checkpointing (training)
    loss: str = "full"  # the training cross-entropy (rules.LOSSES; loss.py)
    #: ``generate()`` passes (B, S) ``position_ids`` (from its all-ones attention mask); a plain
    #: forward (training, classifiers) builds (1, S) ones from ``cache_position``
    batched_positions: bool = False

    @property
    def tokens(self) -> int:
        return self.batch * self.q_len

    @property
    def positions(self) -> int:
        """Elements of this pass's ``position_ids``: the rotary tables and learned position
        embeddings have this many rows."""
        return (self.batch if self.batched_positions else 1) * self.q_len


@dataclass
class Shared:
    """Tensors the embed block makes for every layer (seen by layers as external tensors)."""

    cos: Tensor | None = None
    sin: Tensor | None = None
    mask: Tensor | None = None
    bias: Tensor | None = None  # BLOOM's ALiBi bias, T5's position bias


# ---------------------------------------------------------------------- the vocabulary
#: q/k/v projection layouts: three Linear layers (``names``: q, k, v); one fused Linear
#: (``names[0]``) sliced into views (Phi-3 ``qkv_proj``: the fused output is a local until the
#: attention returns), chunked into views (GPT-NeoX ``query_key_value``: likewise) or split from
#: a ``Conv1D`` (GPT-2 ``c_attn``).
PROJECTIONS = ("separate", "fused-slices", "fused-chunks", "conv1d")
#: Rotary positions: ``none`` (learned positions or none), ``config`` (the config's rotary width,
#: default the whole head: Llama), ``partial`` (``Arch.rot_dim``; q is then laid out head-major:
#: GPT-NeoX, Phi), ``full`` (the whole head whatever the config: Gemma 2, Falcon).
ROTARY = ("none", "config", "partial", "full")
#: Sliding window: ``config`` (``sliding_window`` when set: Mistral), ``switched`` (only with
#: ``use_sliding_window: true``: Qwen2, Qwen3), ``none``.
WINDOWS = ("config", "switched", "none")
#: Norms: ``rms`` (``LlamaRMSNorm``), ``rms-gemma`` (``Gemma2RMSNorm``: ``(1 + w)``),
#: ``rms-olmo`` (``Olmo2RMSNorm``: ``(w * x_normed_fp32).to(dtype)``), ``layer``.
NORMS = ("rms", "rms-gemma", "rms-olmo", "layer")
#: What a q/k norm normalises over: ``head`` (each head: Qwen3, Gemma 3) or ``all`` (the whole
#: projection before the heads are split: OLMo 2's ``q_norm(num_heads * head_dim)``).
QK_NORM_OVER = ("head", "all")


@dataclass(frozen=True, kw_only=True)
class Attention:
    """How a layer's self-attention is laid out (see the module docstring). ``None`` biases take
    the config's (``Arch.qkv_bias``, ``Arch.o_bias``)."""

    projections: str = "separate"
    names: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    out_name: str = "o_proj"
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    #: OPT: ``q_proj(x) * scaling`` (a new tensor)
    scale_q: bool = False
    #: Phi: the q/k projections (whose views ``query_pass``/``key_pass`` are) stay locals until
    #: the attention returns
    keep_projections: bool = False
    rotary: str = "config"
    #: a norm (``NORMS``) over each head of q and of k, right after its projection (Qwen3)
    qk_norm: str | None = None
    qk_norm_over: str = "head"
    #: config key of the attention-logit soft-cap (Gemma 2); a capped attention runs eager
    softcap: str | None = None
    window: str = "config"
    #: the config's attention dropout applies (``Arch.attn_dropout``)
    dropout: bool = True
    #: how ``eager_attention_forward`` normalises the scores (``attention.EAGER_SOFTMAX``)
    eager_softmax: str = "f32"

    def __post_init__(self) -> None:
        problems = [
            f"{name} ({value!r}) must be one of {', '.join(allowed)}"
            for name, value, allowed in (
                ("projections", self.projections, PROJECTIONS),
                ("rotary", self.rotary, ROTARY),
                ("window", self.window, WINDOWS),
                ("eager_softmax", self.eager_softmax, EAGER_SOFTMAX),
                ("qk_norm_over", self.qk_norm_over, QK_NORM_OVER),
            )
            if value not in allowed
        ]
        if self.qk_norm is not None and self.qk_norm not in NORMS:
            problems.append(f"qk_norm ({self.qk_norm!r}) must be None or one of {', '.join(NORMS)}")
        n_names = 3 if self.projections == "separate" else 1
        if len(self.names) != n_names:
            problems.append(
                f"names ({self.names!r}) must name {n_names} Linear layer(s) for "
                f"projections {self.projections!r}"
            )
        if problems:
            raise SpecError("Attention: " + "; ".join(problems))

    def rot_dim(self, a: Arch) -> int:
        """Width of each head's rotary part (0: no rotary)."""
        if self.rotary == "none":
            return 0
        if self.rotary == "full":
            return a.head_dim
        if self.rotary == "partial":
            return a.rot_dim
        return a.rot_dim or a.head_dim

    def table_dim(self, a: Arch) -> int:
        """Width of the rotary cos/sin tables (and of the ``inv_freq`` buffer)."""
        if self.rotary in ("none", "full"):
            return self.rot_dim(a)
        return a.rot_dim or a.head_dim

    def window_of(self, a: Arch) -> int | None:
        """The sliding attention window, where the config enables one."""
        if self.window == "none":
            return None
        if self.window == "switched" and not a.extra.get("use_sliding_window", False):
            return None
        return int(a.sliding_window) if a.sliding_window else None


# ---------------------------------------------------------------------- pieces
def keep_local(o: Ops, w: Work, x: Tensor) -> None:
    """``inputs_embeds`` stays referenced by a local of ``*Model.forward`` until the forward
    returns. Training saves it anyway (the first layer's norm); under no_grad it is one more
    tensor of its size alive through the forward: counted by holding a copy."""
    if not w.train and x.dtype != "i64":
        o.g.hold(o.new(x.numel, x.dtype))


def rope(o: Ops, x: Tensor, cos: Tensor, sin: Tensor, rot_dim: int, head_dim: int) -> Tensor:
    """``apply_rotary_pos_emb``: ``x * cos + rotate_half(x) * sin`` (rotate_half: a negated half and
    a cat); the muls save cos/sin only. Partial rotary slices first and cats the pass-through."""
    part = x.numel * rot_dim // head_dim
    xr = x if rot_dim == head_dim else o.slice(x, rot_dim, head_dim)
    neg = o.g.op([xr], [(part // 2, xr.dtype)])[0]
    rot = o.g.op([neg, xr], [(part, xr.dtype)])[0]  # cat((-x2, x1))
    a = o.mul(xr, cos)
    c = o.mul(rot, sin)
    out = o.add(a, c)
    if rot_dim != head_dim:
        x_pass = o.slice(x, head_dim - rot_dim, head_dim)
        out = o.g.op([out, x_pass], [(x.numel, out.dtype)])[0]  # cat((x_rot, x_pass))
    return out


def rotary_tables(o: Ops, w: Work, head_dim: int, dtype: str) -> tuple[Tensor, Tensor]:
    """``LlamaRotaryEmbedding.forward``: cos and sin in the hidden states' dtype, (1, S, D) for a
    plain forward, (B, S, D) under ``generate()`` (its position_ids are (B, S))."""
    n = w.positions * head_dim  # the positions of this pass's tokens (a decode step: one)
    cos, sin = o.new(n, dtype), o.new(n, dtype)
    o.g.hold(cos, sin)
    return cos, sin


def attn_shape(a: Arch, w: Work) -> AttnShape:
    return AttnShape(
        batch=w.batch,
        n_heads=a.n_heads,
        n_kv=a.n_kv,
        head_dim=a.head_dim,
        q_len=w.q_len,
        kv_len=w.kv_len,
    )


def cache_kv(o: Ops, w: Work, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``DynamicLayer.update``: ``torch.cat`` of the stored keys/values and the new ones (a copy,
    also on the first call, which cats to an empty tensor). The cache lives until the model output
    is dropped: the end of the training step (``use_cache`` is on unless checkpointing), or the
    end of generation (labelled ``kv_cache``)."""
    if not w.use_cache:
        return k, v
    old_len = w.kv_len - w.q_len
    out = []
    for t in (k, v):
        per_token = t.numel // w.q_len
        # ``lazy_initialization`` makes both empty caches in the keys' dtype and ``cat``
        # promotes: under autocast, fp32 rotary keys make the value cache fp32 too
        dtype = promote(k.dtype, t.dtype)
        parts = [t]
        if old_len > 0:
            parts.insert(0, o.g.input(per_token * old_len, dtype, rg=False, comp=KV))
        (c,) = o.g.op(parts, [(per_token * w.kv_len, dtype)])
        if not w.train:
            c.storage.comp = KV
        o.g.hold(c)
        out.append(c)
    return out[0], out[1]


def eager_mask(o: Ops, w: Work, dtype: str) -> Tensor:
    """The (B, 1, S, S) additive float mask transformers builds for eager attention."""
    t = o.new(w.batch * w.q_len * w.kv_len, dtype)
    o.g.hold(t)
    return t


def norm(o: Ops, x: Tensor, dim: int, kind: str) -> Tensor:
    """One of :data:`NORMS` over the last ``dim`` elements of ``x``."""
    if kind == "layer":
        return o.layer_norm(x, dim)
    style = {"rms-gemma": "gemma", "rms-olmo": "olmo"}.get(kind, "llama")
    return o.rms_norm(x, dim, style=style)


# ---------------------------------------------------------------------- attention
def project_qkv(o: Ops, x: Tensor, a: Arch, spec: Attention) -> tuple[Tensor, Tensor, Tensor]:
    """The q, k, v projections of ``spec.projections`` (and the q/k norms of ``spec.qk_norm``,
    each right after its projection: ``q_norm(q_proj(x).view(...))``)."""
    h = a.hidden
    bias = a.qkv_bias if spec.qkv_bias is None else spec.qkv_bias
    if spec.projections == "separate":
        q = o.linear(x, h, a.q_dim, bias=bias, name=spec.names[0])
        if spec.scale_q:
            q = o.unary(q)  # * scaling
        whole = spec.qk_norm_over == "all"
        if spec.qk_norm:
            q = norm(o, q, a.q_dim if whole else a.head_dim, spec.qk_norm)
        k = o.linear(x, h, a.kv_dim, bias=bias, name=spec.names[1])
        if spec.qk_norm:
            k = norm(o, k, a.kv_dim if whole else a.head_dim, spec.qk_norm)
        v = o.linear(x, h, a.kv_dim, bias=bias, name=spec.names[2])
        if spec.keep_projections:
            o.locals += [q, k]
        return q, k, v
    total = a.q_dim + 2 * a.kv_dim
    conv1d = spec.projections == "conv1d"
    fused = o.linear(x, h, total, bias=bias, conv1d=conv1d, name=spec.names[0])
    if spec.projections == "fused-slices":
        o.locals.append(fused)  # ``qkv``, whose views q/k/v are: alive until attention returns
        return (
            o.slice(fused, a.q_dim, total),
            o.slice(fused, a.kv_dim, total),
            o.slice(fused, a.kv_dim, total),
        )
    q, k, v = o.split(fused, [a.q_dim, a.kv_dim, a.kv_dim])
    if spec.projections == "fused-chunks":
        o.locals.append(fused)
    return q, k, v


def attend(
    o: Ops, q: Tensor, k: Tensor, v: Tensor, a: Arch, spec: Attention, w: Work, sh: Shared
) -> Tensor:
    """The attention core (``attention.attention``) with the family's options."""
    rot = spec.rot_dim(a)
    return attention(
        o,
        q,
        k,
        v,
        attn_shape(a, w),
        impl=w.impl,
        mask=sh.mask,
        dropout_p=a.attn_dropout if spec.dropout else 0.0,
        softcap=a.extra.get(spec.softcap) if spec.softcap else None,
        q_head_major=spec.rotary == "partial" and rot != a.head_dim,
        eager_softmax=spec.eager_softmax,
    )


def project_out(o: Ops, x: Tensor, a: Arch, spec: Attention) -> Tensor:
    bias = a.o_bias if spec.out_bias is None else spec.out_bias
    conv1d = spec.projections == "conv1d"
    return o.linear(x, a.q_dim, a.hidden, bias=bias, conv1d=conv1d, name=spec.out_name)


def apply_rotary(
    o: Ops, q: Tensor, k: Tensor, a: Arch, spec: Attention, sh: Shared
) -> tuple[Tensor, Tensor]:
    """Rotary q and k (``spec.rotary`` ``none``: as they are)."""
    rot = spec.rot_dim(a)
    if not rot and spec.rotary != "partial":
        return q, k
    if sh.cos is None or sh.sin is None:
        raise SpecError(f"rotary {spec.rotary!r} attention needs the embed block's cos/sin tables")
    return rope(o, q, sh.cos, sh.sin, rot, a.head_dim), rope(o, k, sh.cos, sh.sin, rot, a.head_dim)


# ---------------------------------------------------------------------- head
def lm_head_and_loss(o: Ops, x: Tensor, w: Work, a: Arch, *, bias: bool = False) -> list[Tensor]:
    """LM head then ``ForCausalLMLoss``: ``logits.float()``, shifted labels, cross-entropy
    (LogSoftmaxBackward saves the fp32 log-probabilities). The logits stay referenced by the
    model output (``out.logits``) until the step ends. Inference keeps ``logits_to_keep`` rows and
    ``generate()`` copies the last one to fp32."""
    if w.train and w.loss != "full":
        return head_loss(o, x, w.tokens, a, kind=w.loss, bias=bias)
    keep = w.logits_to_keep
    hidden = x
    if keep:
        x = o.unary(x)  # hidden_states[:, -keep:, :] (a view; a copy under no_grad is freed)
        x.numel = w.batch * keep * a.hidden
    logits = o.linear(
        x, a.hidden, a.vocab, bias=bias, name="lm_head", trainable=o.lm_head_trainable
    )
    if a.tie and o.existing_grads:
        # Tied weight: one AccumulateGrad node, whose input buffer holds this gradient until the
        # embedding's arrives (then .grad += their sum).
        o.g.nodes[-1].inputs[1].hold_grad = True
    cap = a.extra.get("final_logit_softcapping")
    if cap:  # Gemma 2: logits = tanh(logits / cap) * cap
        (t,) = o.g.op([o.unary(logits)], [(logits.numel, logits.dtype)])
        o.save_outputs(t)
        logits = o.unary(t)
    o.g.hold(logits)
    if not w.train:
        if keep:  # generate(): next_token_logits = logits[:, -1, :].to(copy=True, dtype=fp32)
            o.g.hold(o.unary(logits, dtype="f32"))
        o.g.touch(hidden)
        return [logits]
    lf = o.cast(logits, "f32")
    labels = o.new(w.tokens, "i64")  # nn.functional.pad(labels, (0, 1)) then a contiguous slice
    (logp,) = o.g.op([lf], [(lf.numel, "f32")])
    o.save_outputs(logp)
    (loss,) = o.g.op([logp, labels], [(1, "f32")])
    o.g.hold(loss)
    o.g.touch(hidden)  # ``outputs.last_hidden_state``: referenced until the forward returns
    return [logits, loss]


__all__ = [
    "NORMS",
    "PROJECTIONS",
    "QK_NORM_OVER",
    "ROTARY",
    "WINDOWS",
    "Attention",
    "Shared",
    "Work",
    "apply_rotary",
    "attend",
    "attn_shape",
    "cache_kv",
    "eager_mask",
    "keep_local",
    "lm_head_and_loss",
    "norm",
    "project_out",
    "project_qkv",
    "rope",
    "rotary_tables",
]
