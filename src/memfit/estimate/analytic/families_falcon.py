"""Falcon and BLOOM: fused-QKV decoders whose attention code HF keeps in the modeling file.

Falcon (``modeling_falcon.py``, rotary variants: falcon-7b's multi-query, falcon-40b's
``new_decoder_architecture``) always materialises the causal mask (``allow_is_causal_skip=False``:
a bool mask for SDPA, an additive float mask for eager), so SDPA runs the memory-efficient kernel
with the K/V head repeated. BLOOM (``modeling_bloom.py``) has no SDPA path: ALiBi enters as the
``baddbmm`` bias of the scores, the softmax runs in fp32, and its GELU is a custom autograd
Function whose forward and backward evaluate the tanh formula in temporaries.
"""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import _softmax, attention
from memfit.estimate.analytic.families import (
    LlamaProgram,
    Shared,
    Tensor,
    Work,
    attn_shape,
    cache_kv,
    eager_mask,
    keep_local,
    lm_head_and_loss,
    rope,
)
from memfit.estimate.analytic.families_gpt import ACT_KIND
from memfit.estimate.analytic.graph import DTYPE_BYTES
from memfit.estimate.analytic.ops import Ops

#: ``bloom_gelu_forward`` / ``bloom_gelu_back`` (modeling_bloom.py) evaluated left to right: the
#: most intermediate-sized temporaries alive at once, besides the input and the result. Forward:
#: ``x * 0.5``, ``0.79788456 * x``, ``0.044715 * x`` and its product with ``x``. Backward:
#: ``tanh_out``, ``0.5 * x``, ``1 - tanh_out²``, ``0.1070322243 * x`` and its product with ``x``.
BLOOM_GELU_FWD_TEMPS = 3
BLOOM_GELU_BWD_TEMPS = 4


def falcon_shape(config: dict[str, Any]) -> tuple[int, int]:
    """(fused QKV width in heads, K/V heads the attention sees) of a Falcon config."""
    heads = int(config.get("num_attention_heads", 71))
    if config.get("new_decoder_architecture"):
        kv = int(config.get("num_kv_heads") or heads)
        return heads + 2 * kv, heads  # K/V broadcast to every query head before attention
    if config.get("multi_query", True):
        return heads + 2, 1
    return 3 * heads, heads


def previous_attn_weights(o: Ops, w: Work, a: Arch) -> list[Tensor]:
    """Eager Falcon/BLOOM blocks return ``(hidden_states, attn_weights)`` and the model's loop
    keeps that tuple in ``outputs`` until the next block returns: under no_grad the previous
    block's attention probabilities (compute dtype) are alive through this block. (Training saves
    them for ``bmm``'s backward anyway.) Counted as a tensor of that size alive from the block's
    start; every block is alike, so the first block's peak stands for all."""
    if w.train:
        return []
    return [o.new(w.batch * a.n_heads * w.q_len * w.kv_len, o.cdtype)]


class FalconProgram(LlamaProgram):
    """``FalconDecoderLayer`` (rotary): LayerNorm, ``FalconLinear`` fused QKV (``x @ W.T``, then
    ``+ bias``), heads transposed and reshaped into copies, rotary q/k, attention on the
    materialised mask, ``dense``; the MLP reads the same LayerNorm output (``parallel_attn``) or a
    second one after the attention residual; ``mlp_output += attention_output`` in place."""

    def __init__(self, a: Arch) -> None:
        super().__init__(a)
        e = a.extra
        if e.get("alibi"):
            raise SpecError(
                "Falcon with alibi=true is not modelled by the analytic engine; use --engine trace"
            )
        self.new_arch = bool(e.get("new_decoder_architecture", False))
        self.parallel = bool(e.get("parallel_attn", True))
        self.bias = bool(e.get("bias", False))
        self.fused_heads, _ = falcon_shape(e)
        n_ln = e.get("num_ln_in_parallel_attn")
        self.two_ln = self.new_arch and (n_ln is None or int(n_ln) == 2)

    def mask_dtype(self, w: Work, x_dtype: str) -> str | None:
        """``create_causal_mask(..., allow_is_causal_skip=False)``: always a (B, 1, q, kv) mask."""
        return x_dtype if w.impl == "eager" else "bool"

    def _linear(self, o: Ops, x: Tensor, n_in: int, n_out: int, name: str) -> Tensor:
        """``FalconLinear``: ``input @ weight.T`` then ``+ bias`` (a second tensor)."""
        out = o.linear(x, n_in, n_out, name=name)
        if self.bias:
            out = o.add(out, o.weight(n_out))
        return out

    def _qkv(self, o: Ops, hn: Tensor, w: Work) -> tuple[Tensor, Tensor, Tensor]:
        a = self.a
        d = a.head_dim
        fused = self._linear(o, hn, a.hidden, self.fused_heads * d, "query_key_value")
        per_head = fused.numel // self.fused_heads
        q_view = o.g.op([fused], [(per_head * a.n_heads, fused.dtype)], view_of=fused)[0]
        n_kv_fused = (self.fused_heads - a.n_heads) // 2
        if self.new_arch or a.n_kv == 1:
            # ``qkv[..., [-2], :]`` / ``[-1]``: advanced indexing copies K and V.
            k, v = (o.unary(o.slice(fused, n_kv_fused, self.fused_heads)) for _ in range(2))
        else:
            k, v = (o.slice(fused, a.n_heads, self.fused_heads) for _ in range(2))
        if self.new_arch:  # broadcast_to + flatten(2, 3): copies with every query head
            q_view = o.unary(q_view)
            k, v = (o.g.op([t], [(per_head * a.n_heads, t.dtype)])[0] for t in (k, v))
        # ``.transpose(1, 2).reshape(B, heads, S, D)``: a copy unless a single head.
        q = o.unary(q_view)
        if a.n_kv > 1:
            k, v = o.unary(k), o.unary(v)
        return q, k, v

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        prev = previous_attn_weights(o, w, a) if w.impl == "eager" else []
        hn = o.layer_norm(x, h)
        hn_mlp = o.layer_norm(x, h) if self.two_ln else hn
        q, k, v = self._qkv(o, hn, w)
        assert sh.cos is not None and sh.sin is not None
        q = rope(o, q, sh.cos, sh.sin, a.head_dim, a.head_dim)
        k = rope(o, k, sh.cos, sh.sin, a.head_dim, a.head_dim)
        k, v = cache_kv(o, w, k, v)
        self._probs: list[Tensor] = []
        if w.impl == "eager":
            out = self._eager(o, q, k, v, w, sh.mask)
        else:
            # flash takes the single K/V head natively and handles the causal mask itself
            mask = sh.mask if w.impl != "flash" else None
            out = attention(o, q, k, v, attn_shape(a, w), impl=w.impl, mask=mask)
        out = self._linear(o, out, a.q_dim, h, "dense")
        o.release_locals(q, k, v)
        if not self.new_arch and not self.parallel:
            x = o.add(x, o.dropout(out, float(a.extra.get("attention_dropout", 0.0))))
            hn_mlp = o.layer_norm(x, h)
        m = self._linear(o, hn_mlp, h, a.ffn, "dense_h_to_4h")
        m = o.act(m, ACT_KIND.get(a.act, "gelu"))
        m = self._linear(o, m, a.ffn, h, "dense_4h_to_h")
        if self.new_arch or self.parallel:
            # ``mlp_output += attention_output``: in place (m's storage), AddBackward saves nothing
            (m,) = o.g.op([m, out], [(m.numel, m.dtype)], view_of=m)
        out_ = o.add(x, o.dropout(m, a.resid_dropout))
        o.g.touch(hn, *prev, *self._probs)
        return out_

    def _eager(
        self, o: Ops, q: Tensor, k: Tensor, v: Tensor, w: Work, mask: Tensor | None
    ) -> Tensor:
        """``query @ key.T`` (matmul broadcasts the K/V heads: an expanded copy), ``/=`` in place,
        ``softmax(scores + mask, dtype=hidden dtype)``, ``@ value``, heads merged (a copy)."""
        a = self.a
        n_rep = a.n_heads // a.n_kv
        if n_rep > 1:
            k = o.g.op([k], [(k.numel * n_rep, k.dtype)])[0]
        scores = w.batch * a.n_heads * w.q_len * w.kv_len
        att = o.matmul(q, k, scores)
        raw = att  # ``attention_scores`` keeps the product until the softmax is assigned to it
        if mask is not None:
            att = o.add(att, mask)
        probs = _softmax(o, att, o.pdtype)  # dtype=hidden_states.dtype (fp32 under autocast)
        o.g.touch(raw)
        self._probs = [probs]  # returned as ``attn_weights`` (see previous_attn_weights)
        if n_rep > 1:
            v = o.g.op([v], [(v.numel * n_rep, v.dtype)])[0]
        out = o.matmul(probs, v, w.batch * a.n_heads * w.q_len * a.head_dim)
        return o.unary(out)

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        return lm_head_and_loss(o, o.layer_norm(x, self.a.hidden), w, self.a)


class BloomProgram(LlamaProgram):
    """``BloomBlock``: LayerNorm, fused QKV viewed per head, ALiBi ``baddbmm`` scores, the
    additive causal mask, fp32 softmax cast back, ``bmm`` with V, heads merged (a copy), ``dense``
    + residual, post-attention LayerNorm, ``dense_h_to_4h`` → BloomGelu → ``dense_4h_to_h`` +
    residual. Embeddings: word embeddings then ``word_embeddings_layernorm``."""

    def buffer_bytes(self, precision: str) -> int:
        return 0

    def mask_dtype(self, w: Work, x_dtype: str) -> str | None:
        return x_dtype if w.q_len > 1 else None  # eager attention: the additive float mask

    def _alibi_numel(self, w: Work) -> int:
        return w.batch * self.a.n_heads * w.kv_len

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        tok = o.embedding(w.tokens, a.vocab, a.hidden)
        keep_local(o, w, tok)  # ``inputs_embeds``
        x = o.layer_norm(tok, a.hidden)
        o.g.hold(x)
        shared = Shared()
        # alibi = (slopes[:, None, None] * arange(kv)).repeat(B, 1, 1).to(dtype)
        n = self._alibi_numel(w)
        prod = o.new(a.n_heads * w.kv_len, "f32")
        rep = o.new(n, "f32")
        o.g.touch(prod)
        alibi = o.cast(rep, x.dtype)
        o.g.hold(alibi)
        shared.bias = alibi
        dtype = self.mask_dtype(w, x.dtype)
        if dtype:
            shared.mask = eager_mask(o, w, dtype)
        return x, shared

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        shared = Shared(bias=o.g.external(self._alibi_numel(w), x_dtype))
        dtype = self.mask_dtype(w, x_dtype)
        if dtype:
            shared.mask = o.g.external(w.batch * w.q_len * w.kv_len, dtype)
        return shared

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        prev = previous_attn_weights(o, w, a)
        hn = o.layer_norm(x, h)
        fused = o.linear(hn, h, 3 * h, bias=True, name="query_key_value")
        q, k, v = o.split(fused, [h, h, h])  # views (B, H, S, D) of the fused output
        k, v = cache_kv(o, w, k, v)
        q = o.unary(q)  # reshape(B·H, S, D) of a strided view: a copy
        if not w.use_cache:
            k, v = o.unary(k), o.unary(v)
        scores = w.batch * a.n_heads * w.q_len * w.kv_len
        alibi = sh.bias
        assert alibi is not None
        qi, ki = o._ac(q), o._ac(k)
        (att,) = o.g.op(
            [o._ac(alibi), qi, ki], [(scores, qi.dtype)], saves=[qi, ki], matmul=True
        )  # alibi.baddbmm(q, k.T)
        scores_t = att  # ``attention_scores`` and ``attn_weights`` stay locals to the end
        if sh.mask is not None:
            att = o.add(att, sh.mask)
        probs = _softmax(o, att, "f32")  # softmax(dtype=float32): the input cast, then softmax
        probs = o.cast(probs, q.dtype)
        probs = o.dropout(probs, a.attn_dropout)
        ctx = o.matmul(probs, v, w.batch * a.n_heads * w.q_len * a.head_dim)
        ctx = o.unary(ctx)  # _merge_heads: permute + reshape, a copy
        out = o.linear(ctx, h, h, bias=True, name="dense")
        x = o.add(x, o.dropout(out, a.resid_dropout))  # dropout_add inside BloomAttention
        o.g.touch(q, k, v, scores_t, att)
        hn2 = o.layer_norm(x, h)
        m = o.linear(hn2, h, a.ffn, bias=True, name="dense_h_to_4h")
        m = self._gelu(o, m)
        m = o.linear(m, a.ffn, h, bias=True, name="dense_4h_to_h")
        out_ = o.add(x, o.dropout(m, a.resid_dropout))
        o.g.touch(probs, *prev)  # this block's ``attn_weights``, returned with its output
        return out_

    def _gelu(self, o: Ops, x: Tensor) -> Tensor:
        """``GeLUFunction``: a custom autograd Function saving its input; its Python forward and
        backward hold a few intermediate-sized temporaries (``BLOOM_GELU_*_TEMPS``)."""
        size = x.numel * DTYPE_BYTES[x.dtype]
        (out,) = o.g.op(
            [x],
            [(x.numel, x.dtype)],
            saves=[x],
            fwd_workspace=BLOOM_GELU_FWD_TEMPS * size,
            bwd_workspace=BLOOM_GELU_BWD_TEMPS * size,
        )
        return out

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        return lm_head_and_loss(o, o.layer_norm(x, self.a.hidden), w, self.a)
