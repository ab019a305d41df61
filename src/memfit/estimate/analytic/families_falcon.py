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
from memfit.estimate.analytic.attention import attention, choose_kernel, softmax
from memfit.estimate.analytic.blocks import (
    Attention,
    Shared,
    Work,
    attn_shape,
    cache_kv,
    eager_mask,
    keep_local,
    lm_head_and_loss,
    rotary_tables,
)
from memfit.estimate.analytic.decoder import DecoderFamily, DecoderProgram
from memfit.estimate.analytic.graph import DTYPE_BYTES, Tensor
from memfit.estimate.analytic.mlp import ACT_KIND
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


def previous_attn_weights(o: Ops, w: Work, a: Arch, dtype: str) -> list[Tensor]:
    """Eager Falcon/BLOOM blocks return ``(hidden_states, attn_weights)`` and the model's loop
    keeps that tuple in ``outputs`` until the next block returns: under no_grad the previous
    block's attention probabilities (``dtype``: Falcon's softmax returns the hidden states' dtype,
    BLOOM casts to the query's) are alive through this block. (Training saves them for ``bmm``'s
    backward anyway.) Counted as a tensor of that size alive from the block's start; every block
    is alike, so the first block's peak stands for all."""
    if w.train:
        return []
    return [o.new(w.batch * a.n_heads * w.q_len * w.kv_len, dtype)]


class FalconProgram(DecoderProgram):
    """``FalconDecoderLayer`` (rotary): LayerNorm, ``FalconLinear`` fused QKV (``x @ W.T``, then
    ``+ bias``), heads transposed and reshaped into copies, rotary q/k, attention on the
    materialised mask, ``dense``; the MLP reads the same LayerNorm output (``parallel_attn``) or a
    second one after the attention residual; ``mlp_output += attention_output`` in place."""

    def __init__(self, a: Arch, family: DecoderFamily) -> None:
        super().__init__(a, family)
        e = a.extra
        self.new_arch = bool(e.get("new_decoder_architecture", False))
        self.parallel = bool(e.get("parallel_attn", True))
        self.bias = bool(e.get("bias", False))
        self.fused_heads, _ = falcon_shape(e)
        n_ln = e.get("num_ln_in_parallel_attn")
        self.two_ln = self.new_arch and (n_ln is None or int(n_ln) == 2)

    def mask_dtype(self, w: Work, x_dtype: str) -> str | None:
        """``create_causal_mask(..., allow_is_causal_skip=False)``: always a (B, 1, q, kv) mask."""
        return x_dtype if w.impl == "eager" else "bool"

    def embed_masks(self, o: Ops, w: Work, shared: Shared, x_dtype: str) -> None:
        """An inference pass's SDPA bool mask (``sdpa_mask`` without a padding mask: the causal
        (1, 1, S, S) mask expanded over the batch, stride 0) holds S x S bytes, as the trace
        shows (falcon at 20 x 128: one 16 KiB ``le`` mask; the memory-efficient kernel still
        widens it, ``attention.py``); training and eager keep the batch-sized mask."""
        dtype = self.mask_dtype(w, x_dtype)
        if dtype == "bool" and not w.train and w.impl != "eager" and w.kv_len == w.q_len > 1:
            shared.mask = o.new(w.q_len * w.kv_len, dtype)
            o.g.hold(shared.mask)
        else:
            super().embed_masks(o, w, shared, x_dtype)

    def _linear(self, o: Ops, x: Tensor, n_in: int, n_out: int, name: str) -> Tensor:
        """``FalconLinear``: ``input @ weight.T`` then ``+ bias`` (a second tensor, while the
        input, an argument, is still referenced). ``weight.T`` is a view, not a leaf: autocast
        casts it anew at every call and caches nothing (inference kept no casts)."""
        o.cache_weight_casts = False
        out = o.linear(x, n_in, n_out, name=name)
        o.cache_weight_casts = True
        if self.bias:
            out = o.add(out, o.weight(n_out))
            o.g.touch(x)
        return out

    def project_qkv(self, o: Ops, hn: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``FalconAttention``'s fused QKV, heads transposed and reshaped."""
        a = self.a
        d = a.head_dim
        fused = self._linear(o, hn, a.hidden, self.fused_heads * d, "query_key_value")
        o.locals.append(fused)  # ``fused_qkv``: a local of FalconAttention.forward
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
        prev = previous_attn_weights(o, w, a, o.pdtype) if w.impl == "eager" else []
        hn = o.layer_norm(x, h)
        hn_mlp = o.layer_norm(x, h) if self.two_ln else hn
        self._probs: list[Tensor] = []
        out = self.attention_block(o, hn, w, sh)
        if not self.new_arch and not self.parallel:
            x = o.add(x, o.dropout(out, float(a.extra.get("attention_dropout", 0.0))))
            hn_mlp = o.layer_norm(x, h)
        m = self._linear(o, hn_mlp, h, a.ffn, "dense_h_to_4h")
        m = o.act(m, ACT_KIND.get(a.act, "gelu"))
        m = self._linear(o, m, a.ffn, h, "dense_4h_to_h")
        if self.new_arch or self.parallel:
            # ``mlp_output += attention_output``: in place (m's storage), AddBackward saves nothing
            (m,) = o.g.op([m, out], [(m.numel, m.dtype)], view_of=m, passthrough=True)
        out_ = o.add(x, o.dropout(m, a.resid_dropout))
        # FalconDecoderLayer's locals: both LayerNorm outputs and ``attention_output``
        o.g.touch(hn, hn_mlp, out, *prev, *self._probs)
        return out_

    def attend(self, o: Ops, q: Tensor, k: Tensor, v: Tensor, w: Work, sh: Shared) -> Tensor:
        """The core on the materialised mask: eager as ``FalconAttention`` writes it, or SDPA."""
        o.locals += [q, k, v]
        if w.impl == "eager":
            return self._eager(o, q, k, v, w, sh.mask)
        # flash takes the single K/V head natively and handles the causal mask itself
        mask = sh.mask if w.impl != "flash" else None
        # FalconAttention calls SDPA itself with its one K/V head: the kernel repeats them
        return attention(
            o, q, k, v, attn_shape(self.a, w), impl=w.impl, mask=mask, repeat_kv_view=False
        )

    def project_out(self, o: Ops, x: Tensor) -> Tensor:
        return self._linear(o, x, self.a.q_dim, self.a.hidden, "dense")

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
        probs = softmax(o, att, o.pdtype)  # dtype=hidden_states.dtype (fp32 under autocast)
        o.g.touch(raw)
        self._probs = [probs]  # returned as ``attn_weights`` (see previous_attn_weights)
        if n_rep > 1:
            v = o.g.op([v], [(v.numel * n_rep, v.dtype)])[0]
        out = o.matmul(probs, v, w.batch * a.n_heads * w.q_len * a.head_dim)
        return o.unary(out)


class FalconAlibiProgram(FalconProgram):
    """Falcon-RW layers (``alibi: true``; ``new_decoder_architecture`` off). ``FalconModel`` builds
    the (B·H, 1, kv) ALiBi bias from an all-ones mask and folds it into the causal mask once —
    ``masked_fill(alibi / sqrt(head_dim), causal_mask < -1, min)``: one (B, H, q, kv) float tensor
    every layer reads. No rotary (the model still computes the tables). SDPA passes that tensor as
    ``attn_mask`` (memory-efficient kernel, under autocast a half copy it saves); eager attention
    casts the scores to fp32, adds the bias, then the mask, and ``softmax(dtype=hidden dtype)``."""

    def __init__(self, a: Arch, family: DecoderFamily) -> None:
        super().__init__(a, family)
        if self.new_arch:
            raise SpecError(
                "Falcon with alibi=true and new_decoder_architecture=true is not modelled by the "
                "analytic engine; use --engine trace"
            )

    def mask_dtype(self, w: Work, x_dtype: str) -> str | None:
        return x_dtype

    def _mask_numel(self, w: Work) -> int:
        return w.batch * self.a.n_heads * w.q_len * w.kv_len

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        x = o.embedding(w.tokens, a.vocab, a.hidden)
        o.g.hold(x)
        keep_local(o, w, x)  # ``inputs_embeds``
        ones = o.new(w.batch * w.kv_len, "i64")  # ``mask``: a local of FalconModel.forward
        o.g.hold(ones)
        # build_alibi_tensor: ``slopes.bfloat16() * ((mask.cumsum(-1) - 1) * mask)``, .to(dtype)
        positions = o.new(w.batch * w.kv_len, "i64")
        slopes = o.new(a.n_heads, "bf16")
        (alibi,) = o.g.op([positions, slopes], [(w.batch * a.n_heads * w.kv_len, "bf16")])
        alibi = o.cast(alibi, x.dtype)
        o.g.hold(alibi)
        shared = Shared(bias=alibi)
        bool_mask = o.new(w.q_len * w.kv_len, "bool")  # create_causal_mask (SDPA: a bool mask)
        (mask,) = o.g.op([bool_mask], [(w.batch * w.q_len * w.kv_len, x.dtype)])  # torch.where
        (scaled,) = o.g.op([alibi], [(alibi.numel, x.dtype)])  # alibi / sqrt(head_dim)
        (below,) = o.g.op([mask], [(w.batch * w.q_len * w.kv_len, "bool")])  # causal_mask < -1
        (shared.mask,) = o.g.op([scaled, below, mask], [(self._mask_numel(w), x.dtype)])
        o.g.hold(shared.mask)
        o.g.freed_at_backward.append(shared.mask)  # where backward needs it (see ``head``)
        shared.cos, shared.sin = rotary_tables(o, w, a.head_dim, x.dtype)
        return x, shared

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        alibi = o.g.external(w.batch * self.a.n_heads * w.kv_len, x_dtype)
        return Shared(bias=alibi, mask=o.g.external(self._mask_numel(w), x_dtype))

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        """``ln_f``, then FalconModel.forward returns: the tensors its embed step built are freed
        — the mask too, unless backward still needs it: every layer's memory-efficient SDPA
        saved it, or checkpointed layers hold it as an argument of their recomputation."""
        a = self.a
        x = o.layer_norm(x, a.hidden)
        dt = o.pdtype  # the embeddings' dtype
        built = [(w.batch * w.kv_len, "i64"), (w.batch * a.n_heads * w.kv_len, dt)]
        built += [(self._rope_numel(w), dt)] * 2
        saved = not o.autocast and self._kernel(o, w) == "efficient"
        if not (w.train and (saved or w.checkpointed)):
            built.append((self._mask_numel(w), dt))
        o.g.touch(*(o.g.input(n, dtype, rg=False) for n, dtype in built))
        return lm_head_and_loss(o, x, w, a)

    def _rope_numel(self, w: Work) -> int:
        return (w.kv_len if w.q_len > 1 else 1) * self.a.head_dim

    def _kernel(self, o: Ops, w: Work) -> str:
        return choose_kernel(o, attn_shape(self.a, w), impl=w.impl, masked=True, gqa=False)

    def attention_block(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """No rotary: the fused projection's views, the cache, the ALiBi core, ``dense``."""
        out = self.project_out(o, self._alibi_attention(o, x, w, sh))
        o.release_locals()
        return out

    def _alibi_attention(self, o: Ops, hn: Tensor, w: Work, sh: Shared) -> Tensor:
        """``_split_heads`` then ``transpose(1, 2).reshape`` to the same shape: q, k, v are views
        of the fused projection, but multi-query's ``[..., [-2], :]`` / ``[-1]`` (advanced
        indexing: copies); then the cache and the attention core."""
        a = self.a
        fused = self._linear(o, hn, a.hidden, self.fused_heads * a.head_dim, "query_key_value")
        (q,) = o.g.op(
            [fused], [(fused.numel // self.fused_heads * a.n_heads, fused.dtype)], view_of=fused
        )
        if a.n_kv == 1:
            k, v = (o.unary(o.slice(fused, 1, self.fused_heads)) for _ in range(2))
        else:
            k, v = (o.slice(fused, a.n_heads, self.fused_heads) for _ in range(2))
        k, v = cache_kv(o, w, k, v)
        o.locals += [fused, q, k, v]
        assert sh.mask is not None and sh.bias is not None
        if w.impl == "eager":
            return self._eager_alibi(o, q, k, v, w, sh.bias, sh.mask)
        q, k, v = (o.autocast_input(t) for t in (q, k, v))  # SDPA is on autocast's half list
        mask = None if w.impl == "flash" else o.autocast_input(sh.mask)
        shape = attn_shape(a, w)
        p = a.attn_dropout
        out = attention(
            o, q, k, v, shape, impl=w.impl, mask=mask, dropout_p=p, repeat_kv_view=False
        )
        node = o.g.nodes[-1]
        if mask is not None and node.rg and node.matmul:  # the kernel saves its attn_bias
            node.saves.append(mask)
        return out

    def _eager_alibi(
        self, o: Ops, q: Tensor, k: Tensor, v: Tensor, w: Work, alibi: Tensor, mask: Tensor
    ) -> Tensor:
        """``query @ key.T``; ``.to(float32)`` of half scores; ``+ alibi``, ``*=`` scale in place,
        ``softmax(+ mask, dtype=hidden dtype)``; ``@ value``; ``_merge_heads`` (a copy unless one
        query). The scores in each dtype stay locals until the attention returns."""
        a = self.a
        n_rep = a.n_heads // a.n_kv
        loose = not w.use_cache and a.n_kv > 1 and w.kv_len > 1  # K/V still views of fused
        qm = self._bmm_operand(o, q, w, strided=w.q_len > 1 or a.n_kv == 1)
        km = self._bmm_operand(o, k, w, strided=loose, n_rep=n_rep)
        raw = o.matmul(qm, km, self._mask_numel(w))
        scores = o.cast(raw, "f32")
        logits = o.add(scores, alibi)
        masked = o.add(logits, mask)
        probs = softmax(o, masked, o.pdtype)  # its cast of ``masked`` happens inside softmax
        o.g.touch(masked)
        probs = o.dropout(probs, a.attn_dropout)
        self._probs = [probs]  # returned as ``attn_weights`` (see previous_attn_weights)
        pm = self._bmm_operand(o, probs, w, strided=False)
        vm = self._bmm_operand(o, v, w, strided=loose, n_rep=n_rep)
        ctx = o.matmul(pm, vm, w.batch * a.n_heads * w.q_len * a.head_dim)
        o.locals += [raw, scores, logits]
        return o.unary(ctx) if w.q_len > 1 else ctx

    def _bmm_operand(self, o: Ops, t: Tensor, w: Work, *, strided: bool, n_rep: int = 1) -> Tensor:
        """What ``torch.matmul`` of 4-D tensors hands ``bmm``: autocast's cast of an fp32 operand
        (a contiguous copy), then (B, H, ·, ·) reshaped to one batch dim — a copy when B > 1 and
        the operand is a single K/V head expanded to every query head (``n_rep``) or a strided
        view of the fused projection whose batch and head strides do not merge."""
        c = o.autocast_input(t)
        if w.batch > 1 and n_rep > 1:
            return o.g.op([c], [(c.numel * n_rep, c.dtype)])[0]
        if w.batch > 1 and strided and c is t and self.a.n_heads > 1:
            return o.unary(c)
        return c


def falcon_program(a: Arch, family: DecoderFamily) -> FalconProgram:
    """The Falcon program a config runs: ALiBi (Falcon-RW) or rotary."""
    cls = FalconAlibiProgram if a.extra.get("alibi") else FalconProgram
    return cls(a, family)


class BloomProgram(DecoderProgram):
    """``BloomBlock``: LayerNorm, fused QKV viewed per head, ALiBi ``baddbmm`` scores, the
    additive causal mask, fp32 softmax cast back, ``bmm`` with V, heads merged (a copy), ``dense``
    + residual, post-attention LayerNorm, ``dense_h_to_4h`` → BloomGelu → ``dense_4h_to_h`` +
    residual. Embeddings: word embeddings then ``word_embeddings_layernorm``."""

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
        prev = previous_attn_weights(o, w, a, o.cdtype)
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
        qi, ki = o.autocast_input(q), o.autocast_input(k)
        (att,) = o.g.op(
            [o.autocast_input(alibi), qi, ki], [(scores, qi.dtype)], saves=[qi, ki], matmul=True
        )  # alibi.baddbmm(q, k.T)
        scores_t = att  # ``attention_scores`` and ``attn_weights`` stay locals to the end
        if sh.mask is not None:
            att = o.add(att, sh.mask)
        probs = softmax(o, att, "f32")  # softmax(dtype=float32): the input cast, then softmax
        probs = o.cast(probs, q.dtype)
        probs = o.dropout(probs, a.attn_dropout)
        ctx = o.matmul(probs, v, w.batch * a.n_heads * w.q_len * a.head_dim)
        ctx = o.unary(ctx)  # _merge_heads: permute + reshape, a copy
        out = o.linear(ctx, h, h, bias=True, name="dense")
        x = o.add(x, o.dropout(out, a.resid_dropout))  # dropout_add inside BloomAttention
        o.g.touch(fused, q, k, v, scores_t, att)  # BloomAttention's locals, ``fused_qkv`` too
        hn2 = o.layer_norm(x, h)
        o.g.touch(hn)  # ``layernorm_output`` is rebound only once the second LayerNorm returns
        m = o.linear(hn2, h, a.ffn, bias=True, name="dense_h_to_4h")
        m = self._gelu(o, m)
        m = o.linear(m, a.ffn, h, bias=True, name="dense_4h_to_h")
        out_ = o.add(x, o.dropout(m, a.resid_dropout))
        # this block's ``attn_weights``, returned with its output; ``layernorm_output`` (hn2)
        o.g.touch(probs, hn2, *prev)
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


#: ``FalconDecoderLayer``: rotary (``FalconProgram``) or ALiBi (``FalconAlibiProgram``), by the
#: config's ``alibi``; its FalconLinear projections and attention core are the programs' own.
FALCON = DecoderFamily(
    name="falcon",
    model_types=("falcon",),
    program=falcon_program,
    norm="layer",
    attention=Attention(
        projections="fused-chunks", names=("query_key_value",), out_name="dense", rotary="full"
    ),
)
#: ``BloomBlock`` (``BloomProgram``): ALiBi, no rotary.
BLOOM = DecoderFamily(
    name="bloom",
    model_types=("bloom",),
    program=BloomProgram,
    norm="layer",
    attention=Attention(
        projections="fused-chunks", names=("query_key_value",), out_name="dense", rotary="none"
    ),
)

__all__ = [
    "BLOOM",
    "FALCON",
    "BloomProgram",
    "FalconAlibiProgram",
    "FalconProgram",
    "falcon_program",
    "falcon_shape",
]
