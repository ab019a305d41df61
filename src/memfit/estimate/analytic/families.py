"""Layer programs: each family's forward as Hugging Face transformers 5 writes it, op by op.

A program has three blocks — ``embed`` (token/position embeddings and the tensors every layer
shares: rotary tables, masks), ``layer`` (one repeated block; ``period`` > 1 when layers alternate,
e.g. Gemma 2's sliding/full attention) and ``head`` (final norm, LM head or classifier, loss) —
recorded on an :class:`~memfit.estimate.analytic.ops.Ops`. Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", eq. 1) count ``sbh(34 + 5as/h)`` bytes per
layer for GPT-3 in fp16 with dropout; the programs reproduce that count op by op and add what
Hugging Face's code keeps beyond it (fp32 RMSNorm upcasts, SwiGLU's third matmul, rotary copies).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import AttnShape, attention
from memfit.estimate.analytic.graph import KV, Tensor
from memfit.estimate.analytic.ops import Ops, promote


@dataclass(frozen=True, kw_only=True)
class Work:
    """What one pass runs: ``batch`` sequences of ``q_len`` new tokens attending to ``kv_len``
    (``kv_len == q_len`` for training and prefill; decode has ``q_len == 1``)."""

    batch: int
    q_len: int
    kv_len: int
    impl: str  # eager | sdpa | flash
    task: str  # causal-lm | seq-cls | seq2seq | image-cls
    train: bool
    use_cache: bool = False  # the model keeps K/V in a DynamicCache
    logits_to_keep: int = 0  # 0: all positions; generate() keeps 1
    checkpointed: bool = False  # layers run under activation checkpointing (training)

    @property
    def tokens(self) -> int:
        return self.batch * self.q_len


@dataclass
class Shared:
    """Tensors the embed block makes for every layer (seen by layers as external tensors)."""

    cos: Tensor | None = None
    sin: Tensor | None = None
    mask: Tensor | None = None
    bias: Tensor | None = None  # BLOOM's ALiBi bias, T5's position bias


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
    """``LlamaRotaryEmbedding.forward``: (1, S, D) cos and sin in the hidden states' dtype
    (position_ids has batch 1)."""
    n = w.kv_len * head_dim if w.q_len > 1 else head_dim
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


# ---------------------------------------------------------------------- llama family
class LlamaProgram:
    """Llama, Mistral, Qwen2 (``LlamaDecoderLayer``): pre-RMSNorm, rotary q/k, SwiGLU MLP."""

    period = 1
    norm_style = "llama"

    def __init__(self, a: Arch) -> None:
        self.a = a
        #: ``config.use_cache`` (default True): the causal LM returns a DynamicCache.
        self.use_cache = bool(a.extra.get("use_cache", True))

    tasks: tuple[str, ...] = ("causal-lm",)

    def q_len(self, seq_len: int) -> int:
        """Tokens per sequence the model runs (vision models fix it from the image size)."""
        return seq_len

    def input_bytes(self, batch: int, seq_len: int, train: bool) -> int:
        """The step's inputs: int64 ``input_ids`` (``labels`` is the same tensor)."""
        return batch * seq_len * 8

    @property
    def embed_dim(self) -> int:
        """Width of the token embedding (the LM head's input when tied)."""
        return self.a.hidden

    def buffer_bytes(self, precision: str) -> int:
        """Module buffers (counted with parameters): the rotary ``inv_freq`` (fp32, D/2)."""
        rd = self.a.rot_dim or self.a.head_dim
        return 4 * (rd // 2) * 2 if rd else 0

    @property
    def window(self) -> int | None:
        """The sliding attention window, where the config enables one."""
        a = self.a
        if a.model_type == "qwen2" and not a.extra.get("use_sliding_window", False):
            return None
        return int(a.sliding_window) if a.sliding_window else None

    def mask_dtype(self, w: Work, x_dtype: str) -> str | None:
        """The (B, 1, S, S) mask transformers builds: an additive float mask for eager attention;
        for SDPA a bool mask only when a sliding window cuts into the sequence (else None and
        ``is_causal``)."""
        if w.q_len <= 1:
            return None
        if w.impl == "eager":
            return x_dtype
        if self.window is not None and w.kv_len > self.window:
            return "bool"
        return None

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        x = o.embedding(w.tokens, a.vocab, a.hidden)
        o.g.hold(x)
        keep_local(o, w, x)  # ``inputs_embeds``: a local of ``LlamaModel.forward``
        shared = Shared()
        shared.cos, shared.sin = rotary_tables(o, w, a.rot_dim or a.head_dim, x.dtype)
        dtype = self.mask_dtype(w, x.dtype)
        if dtype:
            shared.mask = eager_mask(o, w, dtype)
        return x, shared

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        a = self.a
        n = (w.kv_len if w.q_len > 1 else 1) * (a.rot_dim or a.head_dim)
        shared = Shared(cos=o.g.external(n, x_dtype), sin=o.g.external(n, x_dtype))
        dtype = self.mask_dtype(w, x_dtype)
        if dtype:
            shared.mask = o.g.external(w.batch * w.q_len * w.kv_len, dtype)
        return shared

    def qkv(self, o: Ops, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self.a
        h = a.hidden
        q = o.linear(x, h, a.q_dim, bias=a.qkv_bias, name="q_proj")
        k = o.linear(x, h, a.kv_dim, bias=a.qkv_bias, name="k_proj")
        v = o.linear(x, h, a.kv_dim, bias=a.qkv_bias, name="v_proj")
        return q, k, v

    def attention_block(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        a = self.a
        h = a.hidden
        q, k, v = self.qkv(o, x)
        assert sh.cos is not None and sh.sin is not None
        rd = a.rot_dim or a.head_dim
        q = rope(o, q, sh.cos, sh.sin, rd, a.head_dim)
        k = rope(o, k, sh.cos, sh.sin, rd, a.head_dim)
        k, v = cache_kv(o, w, k, v)
        out = attention(
            o, q, k, v, attn_shape(a, w), impl=w.impl, mask=sh.mask, dropout_p=a.attn_dropout
        )
        out = o.linear(out, a.q_dim, h, bias=a.o_bias, name="o_proj")
        o.release_locals(q, k, v)
        return out

    def mlp(self, o: Ops, x: Tensor) -> Tensor:
        a = self.a
        gate = o.linear(x, a.hidden, a.ffn, bias=a.mlp_bias, name="gate_proj")
        act = o.act(gate, "silu")
        up = o.linear(x, a.hidden, a.ffn, bias=a.mlp_bias, name="up_proj")
        return o.linear(o.mul(act, up), a.ffn, a.hidden, bias=a.mlp_bias, name="down_proj")

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        h = self.a.hidden
        hn = o.rms_norm(x, h, style=self.norm_style)
        y = self.attention_block(o, hn, w, sh)
        o.g.touch(hn)  # the caller's ``hidden_states`` until the sub-block returns
        x = o.add(x, y)
        hn = o.rms_norm(x, h, style=self.norm_style)
        y = self.mlp(o, hn)
        o.g.touch(hn)
        return o.add(x, y)

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        a = self.a
        x = o.rms_norm(x, a.hidden, style=self.norm_style)
        return lm_head_and_loss(o, x, w, a)


def lm_head_and_loss(o: Ops, x: Tensor, w: Work, a: Arch, *, bias: bool = False) -> list[Tensor]:
    """LM head then ``ForCausalLMLoss``: ``logits.float()``, shifted labels, cross-entropy
    (LogSoftmaxBackward saves the fp32 log-probabilities). The logits stay referenced by the
    model output (``out.logits``) until the step ends. Inference keeps ``logits_to_keep`` rows and
    ``generate()`` copies the last one to fp32."""
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
