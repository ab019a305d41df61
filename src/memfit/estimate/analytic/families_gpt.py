"""LayerNorm decoders with learned positions: GPT-2, StarCoder (GPT-BigCode), OPT — declared over
the block vocabulary, with the layer and embeddings of each family's ``modeling_*.py`` in
transformers 5.23 where they depart from the blocks (residual order, dropout sites, which
locals live how long; GPT-NeoX and Phi: ``families.py``, Falcon and BLOOM:
``families_falcon.py``)."""

from __future__ import annotations

from dataclasses import replace

from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.blocks import Attention, Shared, Work, keep_local, lm_head_and_loss
from memfit.estimate.analytic.decoder import DecoderFamily, DecoderProgram, declare
from memfit.estimate.analytic.graph import Tensor
from memfit.estimate.analytic.mlp import Mlp
from memfit.estimate.analytic.ops import Ops


class GPT2Program(DecoderProgram):
    """``GPT2Block``: pre-LayerNorm, fused ``c_attn`` (Conv1D) split into q/k/v views, learned
    positions, GELU (tanh formula in Python), dropout on embeddings, attention, residuals."""

    def embed_tokens(self, o: Ops, w: Work) -> Tensor:
        a = self.a
        tok = o.embedding(w.tokens, a.vocab, a.hidden)
        pos = o.embedding(w.positions, a.n_positions, a.hidden)  # wpe(position_ids)
        x = o.dropout(o.add(tok, pos), a.emb_dropout)
        o.g.hold(x)
        keep_local(o, w, tok)  # ``inputs_embeds`` / ``position_embeds`` locals
        keep_local(o, w, pos)
        return x

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        hn = self.norm(o, x)
        out = o.dropout(self.attention_block(o, hn, w, sh), a.resid_dropout)
        x = o.add(out, x)
        # GPT2Block's ``hidden_states`` holds each LayerNorm's output until the residual add
        # rebinds it (through the attention, and through the MLP)
        o.g.touch(hn)
        hn = self.norm(o, x)
        m = o.dropout(self.mlp(o, hn), a.resid_dropout)
        out_ = o.add(x, m)
        o.g.touch(out, hn)  # ``attn_output`` is a local of GPT2Block.forward until it returns
        return out_


class BigCodeProgram(GPT2Program):
    """``GPTBigCodeBlock``: GPT-2 with multi-query attention (``c_attn`` → h + 2·head_dim) and
    nn.Linear projections; its eager softmax runs in fp32."""

    def buffer_bytes(self, precision: str) -> int:
        """``GPTBigCodeModel.bias``: a (n_positions, n_positions) bool causal mask buffer."""
        return self.a.n_positions**2


class OPTProgram(DecoderProgram):
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

    @property
    def norm_before(self) -> bool:
        return bool(self.a.extra.get("do_layer_norm_before", True))

    def embed_tokens(self, o: Ops, w: Work) -> Tensor:
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
        return x

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        before = self.norm_before
        hn = self.norm(o, x) if before else x
        out = self.attention_block(o, hn, w, sh)
        o.g.touch(hn)  # the LayerNorm output, the attention's argument, until it returns
        x = o.add(x, o.dropout(out, a.resid_dropout))
        if not before:
            x = self.norm(o, x)
        m = self.norm(o, x) if before else x
        x = o.add(x, o.dropout(self.mlp(o, m), a.resid_dropout))
        return x if before else self.norm(o, x)

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        a = self.a
        if self.norm_before and not a.extra.get("_remove_final_layer_norm", False):
            x = self.norm(o, x)
        if self.proj_dim != a.hidden:
            x = o.linear(x, a.hidden, self.proj_dim, name="project_out")
        return lm_head_and_loss(o, x, w, _with_hidden(a, self.proj_dim))


def _with_hidden(a: Arch, hidden: int) -> Arch:
    return replace(a, hidden=hidden)


#: ``GPT2Block`` (module docstring of ``GPT2Program``).
GPT2 = DecoderFamily(
    name="gpt2",
    model_types=("gpt2",),
    program=GPT2Program,
    norm="layer",
    attention=Attention(
        projections="conv1d",
        names=("c_attn",),
        out_name="c_proj",
        qkv_bias=True,
        out_bias=True,
        rotary="none",
        eager_softmax="value",
    ),
    mlp=Mlp(kind="fc", names=("c_fc", "c_proj"), act=None, bias=True, conv1d=True),
)
#: ``GPTBigCodeBlock``: GPT-2's layout (its weights counted as Conv1D shapes), an fp32 eager
#: softmax.
BIGCODE = declare(
    "bigcode",
    like=GPT2,
    model_types=("gpt_bigcode",),
    program=BigCodeProgram,
    attention={"eager_softmax": "f32"},
)
#: ``OPTDecoderLayer`` (module docstring of ``OPTProgram``).
OPT = DecoderFamily(
    name="opt",
    model_types=("opt",),
    program=OPTProgram,
    norm="layer",
    attention=Attention(
        out_name="out_proj", qkv_bias=True, out_bias=True, scale_q=True, rotary="none"
    ),
    mlp=Mlp(kind="fc", names=("fc1", "fc2"), act=None, default_act="relu", bias=True),
)

__all__ = ["BIGCODE", "GPT2", "OPT", "BigCodeProgram", "GPT2Program", "OPTProgram"]
