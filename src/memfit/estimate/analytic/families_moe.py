"""Mixture-of-experts (Mixtral) and the fused-projection Llama variant (Phi-3)."""

from __future__ import annotations

from memfit.estimate.analytic.attention import attention
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
    rotary_tables,
)
from memfit.estimate.analytic.ops import Ops


class Phi3Program(LlamaProgram):
    """``Phi3DecoderLayer``: Llama with fused ``qkv_proj`` (sliced into q/k/v views) and fused
    ``gate_up_proj`` (chunked), residual dropouts."""

    def qkv(self, o: Ops, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self.a
        total = a.q_dim + 2 * a.kv_dim
        fused = o.linear(x, a.hidden, total, name="qkv_proj")
        o.locals.append(fused)  # ``qkv``, whose views q/k/v are: alive until attention returns
        return (
            o.slice(fused, a.q_dim, total),
            o.slice(fused, a.kv_dim, total),
            o.slice(fused, a.kv_dim, total),
        )

    def mlp(self, o: Ops, x: Tensor) -> Tensor:
        a = self.a
        fused = o.linear(x, a.hidden, 2 * a.ffn, name="gate_up_proj")
        gate, up = o.split(fused, [a.ffn, a.ffn])
        out = o.linear(o.mul(up, o.act(gate, "silu")), a.ffn, a.hidden, name="down_proj")
        o.g.touch(gate)  # a view of the fused output, a local until the MLP returns
        return out


class MixtralProgram(LlamaProgram):
    """``MixtralSparseMoeBlock``: a router (``gate``: h → E, fp32 softmax, top-k, renormalised)
    and E SwiGLU experts stored as 3-D parameters. Expert ``e`` runs on the tokens routed to it
    (``hidden_states[token_idx]``) and its output, scaled by the routing weight (fp32), is
    ``index_add_``-ed into a zero tensor. Summed over experts the saved tensors cover
    ``top_k × tokens`` rows whatever the routing; memfit's trace (fake tensors, no routing values)
    runs them as one expert call on all ``top_k × tokens`` rows, and so does this program."""

    def mlp(self, o: Ops, x: Tensor) -> Tensor:
        a = self.a
        e, k, h, f = a.n_experts, a.top_k, a.hidden, a.ffn
        tokens = x.numel // h
        logits = o.linear(x, h, e, name="gate")
        probs = o.g.op([o.cast(logits, "f32")], [(tokens * e, "f32")])[0]  # softmax(.float())
        o.save_outputs(probs)
        vals, idx = o.g.op([probs], [(tokens * k, "f32"), (tokens * k, "i64")])
        o.save_outputs(idx)
        denom = o.g.op([vals], [(tokens, "f32")])[0]
        weights = o.g.op([vals, denom], [(tokens * k, "f32")], saves=[vals, denom])[0]
        out = o.new(tokens * h, x.dtype)  # zeros_like(hidden_states)
        mask = o.new(tokens * k * (e + 1), "i64")  # one_hot(top_k_index, E + 1)
        rows = k * tokens
        gate_up = o.weight(e, 2 * f, h)
        down = o.weight(e, h, f)
        w_gu = o.g.op([gate_up], [(2 * f * h, gate_up.dtype)], view_of=gate_up)[0]
        w_dn = o.g.op([down], [(h * f, down.dtype)], view_of=down)[0]
        cur = o.g.op([x], [(rows * h, x.dtype)])[0]  # hidden_states[token_idx]
        gu = _linear_w(o, cur, w_gu, h, 2 * f)
        g_, up = o.split(gu, [f, f])
        act = o.mul(o.act(g_, "silu"), up)
        y = _linear_w(o, act, w_dn, f, h)
        wsel = o.g.op([weights], [(rows, "f32")])[0]  # top_k_weights[token_idx, top_k_pos, None]
        y = o.cast(o.mul(y, wsel), x.dtype)
        (res,) = o.g.op([out, y], [(tokens * h, x.dtype)])  # index_add_ (in place)
        o.g.touch(mask, cur)
        return res


def _linear_w(o: Ops, x: Tensor, w: Tensor, n_in: int, n_out: int) -> Tensor:
    """``F.linear(x, W[e])`` with a selected expert weight (a view of the 3-D parameter)."""
    xi, wi = o.autocast_input(x), o.autocast_weight(w)
    (out,) = o.g.op(
        [xi, wi],
        [(x.numel // n_in * n_out, xi.dtype)],
        saves=[xi if wi.rg else None, wi if xi.rg else None],  # type: ignore[list-item]
        matmul=True,
    )
    return out


class Gemma2Program(LlamaProgram):
    """``Gemma2DecoderLayer``: four RMSNorms (``(1 + w)``, fp32), embeddings scaled by
    sqrt(hidden), GeGLU (tanh GELU), attention logits soft-capped (transformers then runs eager
    attention: SDPA has no soft-capping), alternating sliding-window / full layers, final logits
    soft-capped (``tanh(logits / 30) * 30``)."""

    norm_style = "gemma"

    @property
    def softcap(self) -> float | None:
        return self.a.extra.get("attn_logit_softcapping")

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        x = o.embedding(w.tokens, a.vocab, a.hidden)
        keep_local(o, w, x)  # ``inputs_embeds``: a local of ``Gemma2Model.forward``
        x = o.unary(x)  # * normalizer
        o.g.hold(x)
        shared = Shared()
        shared.cos, shared.sin = rotary_tables(o, w, a.head_dim, x.dtype)
        if self._eager(w) and w.q_len > 1:
            shared.mask = eager_mask(o, w, x.dtype)
            o.g.hold(eager_mask(o, w, x.dtype))  # the sliding-window mask
        return x, shared

    def _eager(self, w: Work) -> bool:
        return w.impl == "eager" or bool(self.softcap)

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        sh = super().shared_for_layer(o, w, x_dtype)
        if self._eager(w) and w.q_len > 1 and sh.mask is None:
            sh.mask = o.g.external(w.batch * w.q_len * w.kv_len, x_dtype)
        return sh

    def attention_block(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        a = self.a
        q, k, v = self.qkv(o, x)
        assert sh.cos is not None and sh.sin is not None
        q = rope(o, q, sh.cos, sh.sin, a.head_dim, a.head_dim)
        k = rope(o, k, sh.cos, sh.sin, a.head_dim, a.head_dim)
        k, v = cache_kv(o, w, k, v)
        out = attention(
            o,
            q,
            k,
            v,
            attn_shape(a, w),
            impl="eager" if self._eager(w) else w.impl,
            mask=sh.mask,
            softcap=self.softcap,
        )
        out = o.linear(out, a.q_dim, a.hidden, name="o_proj")
        o.release_locals(q, k, v)
        return out

    def mlp(self, o: Ops, x: Tensor) -> Tensor:
        a = self.a
        gate = o.act(o.linear(x, a.hidden, a.ffn, name="gate_proj"), "gelu_tanh")
        up = o.linear(x, a.hidden, a.ffn, name="up_proj")
        return o.linear(o.mul(gate, up), a.ffn, a.hidden, name="down_proj")

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        h = self.a.hidden
        # Each sub-block's input (the pre-norm output) lives until the sub-block returns, and its
        # output, the post-norm's argument, until that norm returns.
        hn = o.rms_norm(x, h, style="gemma")
        att = self.attention_block(o, hn, w, sh)
        o.g.touch(hn)
        y = o.rms_norm(att, h, style="gemma")
        o.g.touch(att)
        x = o.add(x, y)
        hn = o.rms_norm(x, h, style="gemma")
        m = self.mlp(o, hn)
        o.g.touch(hn)
        y = o.rms_norm(m, h, style="gemma")
        o.g.touch(m)
        return o.add(x, y)

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        return lm_head_and_loss(o, o.rms_norm(x, self.a.hidden, style="gemma"), w, self.a)
