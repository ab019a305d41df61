"""LayerNorm decoder families: GPT-2, StarCoder (GPT-BigCode), GPT-NeoX/Pythia, OPT, Phi (Falcon
and BLOOM: ``families_falcon.py``) — each ``layer`` follows its ``modeling_*.py`` in
transformers 5 (residual order, fused QKV projections split into views, learned or rotary
positions, dropout sites)."""

from __future__ import annotations

from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import AttnShape, attention
from memfit.estimate.analytic.families import (
    LlamaProgram,
    Shared,
    Tensor,
    Work,
    attn_shape,
    cache_kv,
    eager_mask,
    lm_head_and_loss,
    rope,
    rotary_tables,
)
from memfit.estimate.analytic.ops import Ops


def keep_local(o: Ops, w: Work, x: Tensor) -> None:
    """A tensor a local of ``*Model.forward`` keeps until it returns (see families_enc)."""
    from memfit.estimate.analytic.families_enc import keep_local as keep

    keep(o, w, x)


#: ``activation_function`` / ``hidden_act`` spellings → the op (``ops.Ops.act``) that runs.
ACT_KIND = {
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_new",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


class GPT2Program(LlamaProgram):
    """``GPT2Block``: pre-LayerNorm, fused ``c_attn`` (Conv1D) split into q/k/v views, learned
    positions, GELU (tanh formula in Python), dropout on embeddings, attention, residuals."""

    #: ``eager_attention_forward``'s softmax (``attention.EAGER_SOFTMAX``)
    eager_softmax = "value"

    def buffer_bytes(self, precision: str) -> int:
        return 0

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        tok = o.embedding(w.tokens, a.vocab, a.hidden)
        pos = o.embedding(w.q_len, a.n_positions, a.hidden)
        x = o.dropout(o.add(tok, pos), a.emb_dropout)
        o.g.hold(x)
        keep_local(o, w, tok)  # ``inputs_embeds`` / ``position_embeds`` locals
        keep_local(o, w, pos)
        shared = Shared()
        if w.impl == "eager" and w.q_len > 1:
            shared.mask = eager_mask(o, w, x.dtype)
        return x, shared

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        if w.impl == "eager" and w.q_len > 1:
            return Shared(mask=o.g.external(w.batch * w.q_len * w.kv_len, x_dtype))
        return Shared()

    def qkv(self, o: Ops, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self.a
        fused = o.linear(x, a.hidden, a.q_dim + 2 * a.kv_dim, bias=True, conv1d=True, name="c_attn")
        q, k, v = o.split(fused, [a.q_dim, a.kv_dim, a.kv_dim])
        return q, k, v

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        hn = o.layer_norm(x, h)
        q, k, v = self.qkv(o, hn)
        k, v = cache_kv(o, w, k, v)
        out = attention(
            o,
            q,
            k,
            v,
            attn_shape(a, w),
            impl=w.impl,
            mask=sh.mask,
            dropout_p=a.attn_dropout,
            eager_softmax=self.eager_softmax,
        )
        out = o.linear(out, a.q_dim, h, bias=True, conv1d=True, name="c_proj")
        o.release_locals(q, k, v)
        out = o.dropout(out, a.resid_dropout)
        x = o.add(out, x)
        # GPT2Block's ``hidden_states`` holds each LayerNorm's output until the residual add
        # rebinds it (through the attention, and through the MLP)
        o.g.touch(hn)
        hn = o.layer_norm(x, h)
        m = o.linear(hn, h, a.ffn, bias=True, conv1d=True, name="c_fc")
        m = o.act(m, ACT_KIND.get(a.act, "gelu"))
        m = o.linear(m, a.ffn, h, bias=True, conv1d=True, name="c_proj")
        m = o.dropout(m, a.resid_dropout)
        out_ = o.add(x, m)
        o.g.touch(out, hn)  # ``attn_output`` is a local of GPT2Block.forward until it returns
        return out_

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        return lm_head_and_loss(o, o.layer_norm(x, self.a.hidden), w, self.a)


class BigCodeProgram(GPT2Program):
    """``GPTBigCodeBlock``: GPT-2 with multi-query attention (``c_attn`` → h + 2·head_dim) and
    nn.Linear projections; its eager softmax runs in fp32."""

    eager_softmax = "f32"

    def buffer_bytes(self, precision: str) -> int:
        """``GPTBigCodeModel.bias``: a (n_positions, n_positions) bool causal mask buffer."""
        return self.a.n_positions**2


class NeoXProgram(LlamaProgram):
    """``GPTNeoXLayer``: parallel residual ``x + attn(ln1(x)) + mlp(ln2(x))``, fused
    ``query_key_value`` chunked into q/k/v views, partial rotary (``rotary_pct``)."""

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        x, shared = super().embed(o, w)
        return x, shared

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        hn = o.layer_norm(x, h)
        fused = o.linear(hn, h, 3 * a.q_dim, bias=True, name="query_key_value")
        q, k, v = o.split(fused, [a.q_dim, a.q_dim, a.q_dim])
        assert sh.cos is not None and sh.sin is not None
        q = rope(o, q, sh.cos, sh.sin, a.rot_dim, a.head_dim)
        k = rope(o, k, sh.cos, sh.sin, a.rot_dim, a.head_dim)
        k, v = cache_kv(o, w, k, v)
        out = attention(
            o,
            q,
            k,
            v,
            attn_shape(a, w),
            impl=w.impl,
            mask=sh.mask,
            q_head_major=a.rot_dim != a.head_dim,
        )
        out = o.linear(out, a.q_dim, h, bias=True, name="dense")
        # GPTNeoXAttention's ``qkv`` local (q/k/v are its views) and the LayerNorm output, the
        # attention's argument, until the attention returns
        o.release_locals(q, k, v, fused, hn)
        out = o.dropout(out, a.resid_dropout)
        if a.extra.get("use_parallel_residual", True):
            m = self._mlp_of_norm(o, x)
            m = o.dropout(m, a.resid_dropout)
            return o.add(o.add(m, out), x)
        x = o.add(out, x)
        m = o.dropout(self._mlp_of_norm(o, x), a.resid_dropout)
        return o.add(m, x)

    def _mlp_of_norm(self, o: Ops, x: Tensor) -> Tensor:
        """``self.mlp(self.post_attention_layernorm(x))``: the LayerNorm output is the MLP's
        argument, alive until the MLP returns."""
        hn = o.layer_norm(x, self.a.hidden)
        m = self.mlp(o, hn)
        o.g.touch(hn)
        return m

    def mlp(self, o: Ops, x: Tensor) -> Tensor:
        a = self.a
        m = o.linear(x, a.hidden, a.ffn, bias=True, name="dense_h_to_4h")
        m = o.act(m, ACT_KIND.get(a.act, "gelu"))
        return o.linear(m, a.ffn, a.hidden, bias=True, name="dense_4h_to_h")

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        return lm_head_and_loss(o, o.layer_norm(x, self.a.hidden), w, self.a)


class OPTProgram(GPT2Program):
    """``OPTDecoderLayer``: q/k/v/out projections with bias, ``q_proj(x) * scaling``, ReLU MLP,
    learned positions from a cumsum of the attention mask (offset 2), LayerNorm before
    (``do_layer_norm_before``) or after each block, ``project_in``/``project_out`` when
    ``word_embed_proj_dim`` differs from the hidden size (OPT-350m)."""

    @property
    def proj_dim(self) -> int:
        return int(self.a.extra.get("word_embed_proj_dim") or self.a.hidden)

    @property
    def embed_dim(self) -> int:
        return self.proj_dim

    def buffer_bytes(self, precision: str) -> int:
        return 0

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        tok = o.embedding(w.tokens, a.vocab, self.proj_dim)
        ones = o.new(w.batch * w.kv_len, "f32")  # position_attention_mask = torch.ones(...)
        cums = o.new(w.batch * w.kv_len, "f32")  # cumsum
        pid = o.new(w.tokens, "i64")  # (cumsum * mask - 1).long()
        o.g.touch(cums)
        pos = o.embedding(w.tokens, a.n_positions + 2, a.hidden)
        if w.train:
            o.g.touch(ones, pid)
        else:  # locals of OPTDecoder.forward until it returns (see keep_local)
            o.g.hold(ones, pid)
        if self.proj_dim != a.hidden:
            tok = o.linear(tok, self.proj_dim, a.hidden, name="project_in")
        x = o.add(tok, pos)
        o.g.hold(x)
        keep_local(o, w, tok)  # ``inputs_embeds`` (rebound to project_in's output) and
        keep_local(o, w, pos)  # ``pos_embeds`` locals
        shared = Shared()
        if w.impl == "eager" and w.q_len > 1:
            shared.mask = eager_mask(o, w, x.dtype)
        return x, shared

    def qkv(self, o: Ops, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self.a
        q = o.unary(o.linear(x, a.hidden, a.q_dim, bias=True, name="q_proj"))  # * scaling
        k = o.linear(x, a.hidden, a.kv_dim, bias=True, name="k_proj")
        v = o.linear(x, a.hidden, a.kv_dim, bias=True, name="v_proj")
        return q, k, v

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        before = bool(a.extra.get("do_layer_norm_before", True))
        hn = o.layer_norm(x, h) if before else x
        q, k, v = self.qkv(o, hn)
        k, v = cache_kv(o, w, k, v)
        out = attention(
            o, q, k, v, attn_shape(a, w), impl=w.impl, mask=sh.mask, dropout_p=a.attn_dropout
        )
        out = o.linear(out, a.q_dim, h, bias=True, name="out_proj")
        o.release_locals(q, k, v, hn)  # and the LayerNorm output, the attention's argument
        out = o.dropout(out, a.resid_dropout)
        x = o.add(x, out)
        if not before:
            x = o.layer_norm(x, h)
        m = o.layer_norm(x, h) if before else x
        m = o.linear(m, h, a.ffn, bias=True, name="fc1")
        m = o.act(m, ACT_KIND.get(a.act, "relu"))
        m = o.linear(m, a.ffn, h, bias=True, name="fc2")
        m = o.dropout(m, a.resid_dropout)
        x = o.add(x, m)
        return x if before else o.layer_norm(x, h)

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        a = self.a
        if a.extra.get("do_layer_norm_before", True) and not a.extra.get(
            "_remove_final_layer_norm", False
        ):
            x = o.layer_norm(x, a.hidden)
        if self.proj_dim != a.hidden:
            x = o.linear(x, a.hidden, self.proj_dim, name="project_out")
        return lm_head_and_loss(o, x, w, _with_hidden(a, self.proj_dim))


def _with_hidden(a: Arch, hidden: int) -> Arch:
    from dataclasses import replace

    return replace(a, hidden=hidden)


__all__ = [
    "ACT_KIND",
    "AttnShape",
    "BigCodeProgram",
    "GPT2Program",
    "NeoXProgram",
    "OPTProgram",
    "rotary_tables",
]


class PhiProgram(NeoXProgram):
    """``PhiDecoderLayer`` (Phi-1/2): one LayerNorm feeding attention and MLP in parallel,
    q/k/v/dense projections with bias, partial rotary (``partial_rotary_factor``), GELU-tanh MLP,
    residual dropout on both branches, an LM head with bias."""

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        hn = o.layer_norm(x, h)
        q = o.linear(hn, h, a.q_dim, bias=True, name="q_proj")
        k = o.linear(hn, h, a.kv_dim, bias=True, name="k_proj")
        v = o.linear(hn, h, a.kv_dim, bias=True, name="v_proj")
        assert sh.cos is not None and sh.sin is not None
        # ``query_pass``/``key_pass`` (views of the projections, empty under full rotary) stay
        # locals of PhiAttention: the q/k projections live until it returns
        projections = [q, k]
        q = rope(o, q, sh.cos, sh.sin, a.rot_dim, a.head_dim)
        k = rope(o, k, sh.cos, sh.sin, a.rot_dim, a.head_dim)
        k, v = cache_kv(o, w, k, v)
        out = attention(
            o,
            q,
            k,
            v,
            attn_shape(a, w),
            impl=w.impl,
            mask=sh.mask,
            dropout_p=a.attn_dropout,
            q_head_major=a.rot_dim != a.head_dim,
        )
        out = o.linear(out, a.q_dim, h, bias=True, name="dense")
        o.release_locals(q, k, v, *projections)
        out = o.dropout(out, a.resid_dropout)
        m = o.linear(hn, h, a.ffn, bias=True, name="fc1")
        m = o.act(m, ACT_KIND.get(a.act, "gelu_new"))
        m = o.dropout(o.linear(m, a.ffn, h, bias=True, name="fc2"), a.resid_dropout)
        out = o.add(o.add(out, m), x)
        o.g.touch(hn)  # PhiDecoderLayer's ``hidden_states`` until the sum rebinds it
        return out

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        return lm_head_and_loss(o, o.layer_norm(x, self.a.hidden), w, self.a, bias=True)
