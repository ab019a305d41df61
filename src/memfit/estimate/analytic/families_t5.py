"""T5 and Flan-T5 (``T5ForConditionalGeneration``): an encoder-decoder, as transformers 5.23
runs it.

The model is not one chain of identical layers, so the program composes its own step
(``simulate``) from blocks, in forward order::

    encoder: embed → layer 0 (computes the relative position bias) → layers 1..N-1 → final norm
    decoder: embed (labels shifted right) → layer 0 (its own bias) → layers 1..M-1 → head + loss

What ties the blocks together beyond the residual stream:

* the shared embedding (``shared.weight``) is the encoder's, the decoder's and the LM head's
  weight (``T5Config`` forces ``tie_word_embeddings``): one parameter, one gradient, reached
  three times in backward;
* each stack's layer 0 computes a (1, H, Q, K) position bias from ``relative_attention_bias``;
  every layer of the stack adds it to its scores, so in backward its gradient is one buffer,
  allocated by the last layer and summed into by the others until layer 0 consumes it;
* every decoder layer's cross-attention projects the encoder output: its gradient is one buffer
  too, from the last decoder layer until the encoder's final norm consumes it;
* ``inputs_embeds`` and the position bias are locals of ``T5Stack.forward``: alive until the
  stack returns (dropped by its last block);
* without checkpointing the decoder keeps an ``EncoderDecoderCache`` (self and cross K/V copies)
  even in training, referenced by the model output until the step ends.

Attention: eager adds the bias to the (B, H, Q, K) scores (fp32 under autocast: the bias is an
fp32 embedding output); SDPA gets the bias as a float mask (``create_position_bias_mask``: a
contiguous copy, or ``where(causal, bias, min)`` for the decoder's self-attention), which sends
CUDA to the memory-efficient kernel; its backward returns the bias gradient expanded to
(B, H, Q, K) before it is summed to the bias's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import (
    EFFICIENT_LSE_ROUND,
    AttnShape,
    choose_kernel,
    fused_attention,
    math_attention,
    round_up,
    softmax,
)
from memfit.estimate.analytic.blocks import Work, cache_kv
from memfit.estimate.analytic.compose import (
    ID_BYTES,
    Body,
    Simulated,
    cast_cache_bytes,
    embedding_shapes,
    hidden_dtype,
    is_distributed,
    rank_view_for,
    run_workload_block,
    totals,
    trainable_shapes,
    training_step,
)
from memfit.estimate.analytic.decoder import ChainProgram, CustomFamily
from memfit.estimate.analytic.distributed import RankView, params_of
from memfit.estimate.analytic.graph import (
    ACTS,
    DTYPE_BYTES,
    KV,
    PARAMS,
    TEMP,
    Storage,
    Tensor,
    one,
    vadd,
)
from memfit.estimate.analytic.ops import COMPUTE_DTYPE, PARAM_DTYPE, Ops
from memfit.estimate.analytic.optimizer import optimizer_bytes
from memfit.estimate.analytic.step import BlockProfile, Stack, run_stacks
from memfit.spec import WorkloadSpec

#: Activation kinds of ``Ops.act`` per ``dense_act_fn``.
ACT_KIND = {"relu": "relu", "gelu_new": "gelu_new", "gelu": "gelu", "silu": "silu"}


def update_cache(o: Ops, w: Work, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``past_key_values.update(key_states, value_states)``: both projections stay referenced
    by the caller's locals until both copies into the cache are made."""
    kc, vc = cache_kv(o, w, k, v)
    if kc is not k:
        o.g.touch(k, v)
    return kc, vc


def preset_grad(t: Tensor) -> None:
    """``t``'s gradient buffer exists already (counted where it was allocated)."""
    g = Storage(t.n_bytes, TEMP)
    g.live = True
    t.grad = g


@dataclass(frozen=True)
class LayerKey:
    """Which of a stack's layer profiles a layer needs."""

    first: bool
    last: bool
    frozen: bool
    in_rg: bool
    #: layer 1 under checkpointing: the last checkpoint to keep layer 0's biases (arguments of
    #: every later layer's), which go with it in backward
    second: bool = False


class T5Program(ChainProgram):
    """``T5ForConditionalGeneration`` (task ``seq2seq``); see the module docstring."""

    tasks = ("seq2seq",)

    def __init__(self, a: Arch) -> None:
        super().__init__(a)
        self.gated = bool(a.extra.get("_gated"))
        self.scale_out = bool(a.extra.get("_scale_decoder_outputs", True))
        self.buckets = int(a.extra.get("_buckets", 32))
        self.p = a.resid_dropout
        self.inner = a.n_heads * a.head_dim
        #: the model is fp16: ``wo`` stays fp32 (set per workload by ``simulate``)
        self.wo_fp32 = False

    # ------------------------------------------------------------------ pieces
    def input_bytes(self, batch: int, seq_len: int, train: bool) -> int:
        """``input_ids`` and, in training, ``labels`` (two int64 tensors)."""
        return batch * seq_len * ID_BYTES * (2 if train else 1)

    def buffer_bytes(self, precision: str) -> int:
        return 0

    def _norm(self, o: Ops, x: Tensor) -> Tensor:
        return o.rms_norm(x, self.a.hidden, style="t5")

    def embed_tokens(self, o: Ops, ids: Tensor, n_tokens: int) -> Tensor:
        """``shared(input_ids)``: EmbeddingBackward saves the indices."""
        a = self.a
        w = o.weight(a.vocab, a.hidden, trainable=not o.freeze_token_embedding)
        w.is_embedding = True
        if o.tied_embedding and w.rg:  # the LM head's gradient arrives first
            w.sum_out_of_place = True
            w.release_buffered = o.existing_grads
        (out,) = o.g.op([w, ids], [(n_tokens * a.hidden, o.pdtype)], saves=[ids], grad_to=[w])
        return out

    def _position_bias(self, o: Ops, q_len: int, k_len: int, *, bidirectional: bool) -> Tensor:
        """``T5Attention.compute_bias``: int64 relative positions and their buckets (Q, K), the
        embedding lookup (Q, K, H), permuted to a (1, H, Q, K) view."""
        n = q_len * k_len
        ar_q, mem = o.new(q_len, "i64"), o.new(k_len, "i64")
        (ctx,) = o.g.op([ar_q], [(q_len, "i64")])  # arange[:, None] + past_seen_tokens
        (rel,) = o.g.op([ctx, mem], [(n, "i64")])  # memory - context
        if bidirectional:
            (gt,) = o.g.op([rel], [(n, "bool")])  # relative_position > 0
            (gl,) = o.g.op([gt], [(n, "i64")])  # .to(long)
            (gl,) = o.g.op([gl], [(n, "i64")])  # * num_buckets
            (base,) = o.g.op([gl], [(n, "i64")])  # 0 + ...
            (mag,) = o.g.op([rel], [(n, "i64")])  # abs
        else:
            zeros = o.new(n, "i64")  # zeros_like
            (mn,) = o.g.op([rel, zeros], [(n, "i64")])  # min
            (mag,) = o.g.op([mn], [(n, "i64")])  # neg
            base = None
        (small,) = o.g.op([mag], [(n, "bool")])  # < max_exact
        (f,) = o.g.op([mag], [(n, "f32")])  # .float()
        for _ in range(4):  # / max_exact, log, / log(...), * (num_buckets - max_exact)
            (f,) = o.g.op([f], [(n, "f32")])
        (large,) = o.g.op([f], [(n, "i64")])  # .to(long)
        (large,) = o.g.op([large], [(n, "i64")])  # max_exact + ...
        full = o.new(n, "i64")  # full_like(num_buckets - 1)
        (large,) = o.g.op([large, full], [(n, "i64")])  # min
        (sel,) = o.g.op([small, mag, large], [(n, "i64")])  # where
        if base is not None:
            o.g.touch(base, sel)  # relative_buckets += where(...) (in place)
            buckets = base
        else:
            (buckets,) = o.g.op([sel], [(n, "i64")])  # 0 + where(...)
        w = o.weight(self.buckets, self.a.n_heads)
        w.is_embedding = True
        (values,) = o.g.op(
            [w, buckets], [(n * self.a.n_heads, o.pdtype)], saves=[buckets], grad_to=[w]
        )
        o.g.touch(ctx, mem, rel)  # compute_bias's locals, until it returns
        return values

    def _attention(
        self,
        o: Ops,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor,
        shape: AttnShape,
        impl: str,
        *,
        kind: str,
    ) -> Tensor:
        """The attention core with T5's additive bias. ``kind``: ``view`` (the permuted bias of
        ``compute_bias``), ``causal`` (the decoder's self-attention bias over several queries),
        ``dense`` (the cross-attention's contiguous zeros)."""
        b, h = shape.batch, shape.n_heads
        scores = b * h * shape.q_len * shape.kv_len
        if impl == "eager":
            att = o.matmul(q, k, scores)
            att = o.unary(att)  # * scaling (1.0: still a new tensor)
            att = o.add(att, bias)
            if kind == "causal":
                mask = o.g.external(b * shape.q_len * shape.kv_len, att.dtype)
                att = o.add(att, mask)
            probs = softmax(o, att)
            probs = o.dropout(probs, self.p)
            out = o.matmul(probs, v, b * h * shape.q_len * shape.vd)
            o.locals.append(probs)
            return o.unary(out)  # transpose(1, 2).contiguous()
        if kind == "causal":  # where(causal_mask, bias, finfo.min)
            ar = [o.new(shape.q_len, "i64"), o.new(shape.kv_len, "i64")]
            (cm,) = o.g.op(ar, [(shape.q_len * shape.kv_len, "bool")])
            (mask,) = o.g.op([cm, bias], [(bias.numel, bias.dtype)], saves=[cm], grad_to=[bias])
        elif kind == "view":
            mask = o.unary(bias)  # .contiguous() of the permuted view
        else:
            mask = bias
        if o.autocast:
            q, k, v = (o.cast(t, o.cdtype) if t.dtype == "f32" else t for t in (q, k, v))
            if mask.dtype == "f32":
                mask = o.cast(mask, o.cdtype)
        kernel = choose_kernel(o, shape, impl=impl, masked=True, gqa=False)
        if kernel == "flash":  # memfit's CUDA routing: a forced flash kernel drops the mask
            return fused_attention(o, q, k, v, shape, lse_len=shape.q_len, flash=True)
        if kernel == "efficient":
            (full,) = o.g.op([mask], [(scores, mask.dtype)], view_of=mask)  # expand(B, H, Q, K)
            full.external = mask.external  # a view of a tensor an earlier layer made
            lse = round_up(shape.q_len, EFFICIENT_LSE_ROUND)
            return fused_attention(o, q, k, v, shape, lse_len=lse, bias=full)
        return math_attention(o, q, k, v, shape, mask, self.p)

    def _attn_sublayer(
        self,
        o: Ops,
        x: Tensor,
        w: Work,
        bias: Tensor | None,
        *,
        kind: str,
        bidirectional: bool = True,
        cache: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """``T5LayerSelfAttention``: norm, q/k/v (and the cache update), the position bias when
        this is layer 0 (``bias`` None: computed here and returned), attention, o, dropout,
        residual add."""
        a = self.a
        d, inner = a.hidden, self.inner
        hn = self._norm(o, x)
        q = o.linear(hn, d, inner, name="q")
        k = o.linear(hn, d, inner, name="k")
        v = o.linear(hn, d, inner, name="v")
        kv = w.kv_len
        if cache:
            k, v = update_cache(o, w, k, v)
        if bias is None:
            bias = self._position_bias(o, w.q_len, kv, bidirectional=bidirectional)
            o.g.hold(bias)
        return self._attend(o, x, hn, (q, k, v), bias, w, kv, kind), bias

    def _attend(
        self,
        o: Ops,
        x: Tensor,
        hn: Tensor,
        qkv: tuple[Tensor, Tensor, Tensor],
        bias: Tensor,
        w: Work,
        kv_len: int,
        kind: str,
    ) -> Tensor:
        """A sub-layer's attention core, ``o`` projection, dropout and residual add."""
        a = self.a
        shape = AttnShape(
            batch=w.batch,
            n_heads=a.n_heads,
            n_kv=a.n_heads,
            head_dim=a.head_dim,
            q_len=w.q_len,
            kv_len=kv_len,
        )
        out = self._attention(o, *qkv, bias, shape, w.impl, kind=kind)
        out = o.linear(out, self.inner, a.hidden, name="o")
        o.release_locals(*qkv)
        o.g.touch(hn)
        out = o.dropout(out, self.p)
        return self._clamp(o, o.add(x, out))

    def _clamp(self, o: Ops, x: Tensor) -> Tensor:
        """fp16 hidden states are clamped after every sub-layer (``isinf().any()``, ``where``,
        ``clamp``: ClampBackward saves its input)."""
        if x.dtype != "f16":
            return x
        (inf,) = o.g.op([x], [(x.numel, "bool")], differentiable=False)
        o.g.touch(inf)
        (out,) = o.g.op([x], [(x.numel, x.dtype)], saves=[x])
        return out

    def _ff(self, o: Ops, x: Tensor) -> Tensor:
        a = self.a
        d, ff = a.hidden, a.ffn
        hn = self._norm(o, x)
        kind = ACT_KIND.get(a.act, "gelu")
        if self.gated:
            g = o.act(o.linear(hn, d, ff, name="wi_0"), kind)
            lin = o.linear(hn, d, ff, name="wi_1")
            m = o.mul(g, lin)
        else:
            m = o.act(o.linear(hn, d, ff, name="wi"), kind)
        m = o.dropout(m, self.p)
        # ``_keep_in_fp32_modules = ["wo"]``: never quantized; loaded in fp32 when the model is
        # fp16, and the activation is cast to it (the residual stream turns fp32 from here on)
        fmt, o.quant = o.quant, None
        pd, cd = o.pdtype, o.cdtype
        if self.wo_fp32:
            m = o.cast(m, "f32")
            o.pdtype, o.cdtype = "f32", "f32"
        elif o.autocast and o.pdtype == "f32" and m.dtype != "f32":
            # fp32 master weights under autocast: ``hidden_states.to(self.wo.weight.dtype)``
            # (T5DenseActDense / T5DenseGatedActDense) copies the activation to fp32, and
            # autocast casts it back for ``wo``
            m = o.cast(m, "f32")
        m = o.linear(m, ff, d, name="wo")
        o.pdtype, o.cdtype = pd, cd
        o.quant = fmt
        o.g.touch(hn)
        m = o.dropout(m, self.p)
        return self._clamp(o, o.add(x, m))

    # ------------------------------------------------------------------ blocks
    def _enc_layer(
        self, o: Ops, x: Tensor, w: Work, bias: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """One ``T5Block`` of the encoder; layer 0 (``bias`` None) computes the stack's position
        bias and returns it."""
        x, made = self._attn_sublayer(o, x, w, bias, kind="view")
        return self._ff(o, x), made if bias is None else None

    def _dec_layer(
        self,
        o: Ops,
        x: Tensor,
        w: Work,
        enc_out: Tensor,
        biases: tuple[Tensor, Tensor] | None,
        *,
        cross: str,
        cross_rg: bool = False,
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """One decoder ``T5Block``: self-attention (causal bias), cross-attention over the
        encoder output, feed-forward. Layer 0 (``biases`` None) computes the self-attention bias
        and the cross-attention's zero bias (``requires_grad`` under checkpointing) and returns
        them. ``cross``: ``cache`` (project the encoder output, keep copies in the cache),
        ``project`` (no cache: checkpointed training), ``reuse`` (decode: the cached K/V)."""
        a = self.a
        bias, zeros = biases if biases is not None else (None, None)
        kind = "causal" if w.q_len > 1 else "view"
        x, bias = self._attn_sublayer(
            o, x, w, bias, kind=kind, bidirectional=False, cache=w.use_cache
        )
        s_enc = enc_out.numel // (w.batch * a.hidden)
        cw = replace(w, q_len=s_enc, kv_len=s_enc)
        x, zeros = self._cross_sublayer(o, x, w, cw, enc_out, zeros, cross, cross_rg)
        return self._ff(o, x), (bias, zeros) if biases is None else None

    def _cross_sublayer(
        self,
        o: Ops,
        x: Tensor,
        w: Work,
        cw: Work,
        enc_out: Tensor,
        zeros: Tensor | None,
        cross: str,
        cross_rg: bool,
    ) -> tuple[Tensor, Tensor]:
        """``T5LayerCrossAttention``: the (1, H, Q, S) zero bias is made by layer 0 after its
        projections (``requires_grad`` under checkpointing)."""
        a = self.a
        d, inner = a.hidden, self.inner
        hn = self._norm(o, x)
        q = o.linear(hn, d, inner, name="q")
        if cross == "reuse":
            n = cw.batch * cw.kv_len * inner
            k = o.g.external(n, o.cdtype, comp=KV)
            v = o.g.external(n, o.cdtype, comp=KV)
        else:
            k = o.linear(enc_out, d, inner, name="k")
            v = o.linear(enc_out, d, inner, name="v")
            if cross == "cache":
                k, v = update_cache(o, replace(cw, use_cache=True), k, v)
        if zeros is None:
            zeros = o.new(a.n_heads * w.q_len * cw.kv_len, o.cdtype)
            zeros.rg = cross_rg
            o.g.hold(zeros)
        return self._attend(o, x, hn, (q, k, v), zeros, w, cw.kv_len, "dense"), zeros

    # ------------------------------------------------------------------ composition
    def simulate(self, wl: WorkloadSpec, task: str) -> Simulated:
        if wl.tp > 1 or wl.shard == "fsdp" or (not wl.is_train and wl.gpus > 1):
            raise SpecError(
                f"tp={wl.tp}, shard={wl.shard!r}, gpus={wl.gpus} ({wl.mode}) is not modelled by "
                f"the analytic engine for {self.a.model_type!r} (encoder-decoder): it models "
                "one GPU, DDP and ZeRO-1/2/3 with offload in training; use --engine trace"
            )
        self.wo_fp32 = PARAM_DTYPE[wl.run_precision] == "f16"
        return T5Step(self, wl, task).run()


class T5Step:
    """Blocks of one training step or one generation, composed (module docstring)."""

    def __init__(self, prog: T5Program, wl: WorkloadSpec, task: str) -> None:
        self.prog = prog
        self.a = prog.a
        self.wl = wl
        self.task = task
        self.hd = hidden_dtype(wl.run_precision)
        #: the residual stream after the first feed-forward (fp32 once ``wo`` is fp32)
        self.res = "f32" if prog.wo_fp32 else self.hd
        self.pd = PARAM_DTYPE[wl.run_precision]
        self.train = wl.is_train
        self.ckpt = wl.checkpointing != "none" and self.train
        lora = wl.lora_rank is not None and self.train
        f = wl.freeze_layers if self.train else 0
        a = self.a
        self.freeze_enc = f if a.n_layers >= a.n_dec_layers else 0
        self.freeze_dec = f if a.n_dec_layers > a.n_layers else 0
        self.frozen_emb = bool(f) or lora
        #: peft under checkpointing (``enable_input_require_grads``): the frozen embedding's
        #: outputs require grad, leaves the autograd graph keeps until the step ends
        self.emb_leaf = lora and self.ckpt
        #: dropout is the identity (inference, or dropout_rate 0): layer 0's input is the
        #: stack's ``inputs_embeds`` itself, alive until the stack returns
        self.embed_alias = not self.train or prog.p <= 0
        self.tied_grad = self.train and not self.frozen_emb
        #: the position biases require grad (layer 0's ``relative_attention_bias`` trains)
        self.enc_bias_rg = self.train and not lora and self.freeze_enc == 0
        self.dec_bias_rg = self.train and not lora and self.freeze_dec == 0
        self._cache: dict[Any, BlockProfile] = {}
        #: generation under autocast, after the first pass: the weight casts are cached
        self.casts_exist = False
        #: checkpointed training under autocast: the encoder's cached weight casts (bytes)
        self.enc_casts = 0

    # -------------------------------------------------------------- block runner
    def block(
        self,
        w: Work,
        body: Body,
        *,
        repeated: bool = False,
        frozen: bool = False,
        key: Any = None,
    ) -> BlockProfile:
        if key is not None and key in self._cache:
            return self._cache[key]
        prof = run_workload_block(
            self.wl,
            body,
            model_type=self.a.model_type,
            batch=w.batch,
            train=w.train,
            repeated=repeated,
            frozen=frozen,
            casts_exist=self.casts_exist,
        )
        if key is not None:
            self._cache[key] = prof
        return prof

    def _layers(
        self, n: int, n_frozen: int, in_rg0: bool, make: Callable[[LayerKey], BlockProfile]
    ) -> list[Stack]:
        """A stack's layers as runs of identical profiles (layer 0, the middle, the last one;
        frozen ones first; under checkpointing layer 1 too)."""
        stacks: list[Stack] = []
        rg = in_rg0
        for i in range(n):
            frozen = i < n_frozen
            key = LayerKey(i == 0, i == n - 1 and n > 1, frozen, rg, self.ckpt and i == 1)
            prof = make(key)
            if stacks and stacks[-1].profile is prof:
                stacks[-1].count += 1
            else:
                stacks.append(Stack(prof, 1))
            rg = rg or not frozen or prof.out_rg
        return stacks

    # -------------------------------------------------------------- encoder
    def enc_work(self) -> Work:
        return self._work(self.wl.seq_len, self.wl.seq_len, use_cache=False)

    def _work(self, q_len: int, kv_len: int, *, use_cache: bool) -> Work:
        return Work(
            batch=self.wl.batch_size,
            q_len=q_len,
            kv_len=kv_len,
            impl=self.wl.attention,
            task=self.task,
            train=self.train,
            use_cache=use_cache,
        )

    def enc_embed(self, w: Work) -> BlockProfile:
        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            return None, [self._embed(o, o.g.external(w.tokens, "i64"), w)]

        return self.block(w, body)

    def _embed(self, o: Ops, ids: Tensor, w: Work, *, causal_mask: bool = False) -> Tensor:
        """A stack's ``embed_tokens(ids)`` (a local until the stack returns), the mask the stack
        builds (``causal_mask``) and the dropout; returns the first layer's input."""
        o.freeze_token_embedding = self.frozen_emb
        o.tied_embedding = self.tied_grad
        emb = self.prog.embed_tokens(o, ids, w.tokens)
        emb.rg = emb.rg or self.emb_leaf
        o.g.hold(emb)
        if causal_mask:
            o.g.hold(o.new(w.batch * w.q_len * w.kv_len, self.hd))
        y = o.dropout(emb, self.prog.p)
        if y is emb and not self.embed_alias:  # native_dropout runs without grad too
            y = o.unary(emb)
        o.g.hold(y)
        return y

    def enc_layer(self, w: Work, key: LayerKey) -> BlockProfile:
        a, n = self.a, self.a.n_layers
        bias_n = a.n_heads * w.q_len * w.kv_len
        rg = self.enc_bias_rg

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.hd if key.first else self.res, rg=key.in_rg)
            if key.first and self.embed_alias:  # x is ``inputs_embeds``: the stack's local
                o.g.hold(x)
            if key.first:
                out, made = self.prog._enc_layer(o, x, w, None)
                if made is not None and rg and n > 1:
                    preset_grad(made)
            else:
                p = o.g.external(bias_n, self.pd, rg=rg)
                if rg and not key.last:
                    preset_grad(p)
                if key.second:
                    o.checkpoint_args.append(p)
                out, _ = self.prog._enc_layer(o, x, w, p)
            o.g.touch(x)
            o.g.hold(out)
            return x, [out]

        return self.block(w, body, repeated=True, frozen=key.frozen, key=("enc", key))

    def enc_final(self, w: Work) -> BlockProfile:
        a = self.a
        bias_n = a.n_heads * w.q_len * w.kv_len

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.res, rg=self.train)
            gone = []
            if not self.emb_leaf:  # inputs_embeds (else the autograd graph keeps it)
                gone.append(o.g.input(w.tokens * a.hidden, self.pd, rg=False))
            if not self.ckpt:  # checkpointed layers keep their inputs, the bias among them
                gone.append(o.g.input(bias_n, self.pd, rg=False))
            y = o.dropout(self.prog._norm(o, x), self.prog.p)
            o.g.touch(*gone)  # the stack returns: its locals go
            o.g.hold(y)  # the model output keeps ``encoder_last_hidden_state``
            return x, [y]

        return self.block(w, body)

    def encoder(self) -> list[Stack]:
        w = self.enc_work()
        embed = self.enc_embed(w)
        layers = self._layers(
            self.a.n_layers, self.freeze_enc, embed.out_rg, lambda k: self.enc_layer(w, k)
        )
        return [Stack(embed, 1), *layers, Stack(self.enc_final(w), 1)]

    # -------------------------------------------------------------- decoder
    def dec_embed(self, w: Work, *, shift: bool) -> BlockProfile:

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            if shift:  # _shift_right(labels): new_zeros, a sliced clone, masked_fill_(== -100)
                ids = o.new(w.tokens, "i64")
                part = o.new(w.tokens - w.batch, "i64")
                eq = o.new(w.tokens, "bool")
                o.g.touch(ids, part, eq)
            else:
                ids = o.g.external(w.tokens, "i64")
            causal = w.impl == "eager" and w.q_len > 1  # create_causal_mask: (B, 1, Q, K) float
            return None, [self._embed(o, ids, w, causal_mask=causal)]

        return self.block(w, body)

    def dec_layer(self, w: Work, key: LayerKey, enc_n: int, cross: str) -> BlockProfile:
        a, m = self.a, self.a.n_dec_layers
        bias_n = a.n_heads * w.q_len * w.kv_len
        s_enc = enc_n // (w.batch * a.hidden)
        cross_n = a.n_heads * w.q_len * s_enc
        rg = self.dec_bias_rg
        cross_rg = self.ckpt

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.hd if key.first else self.res, rg=key.in_rg)
            if key.first and self.embed_alias:  # x is ``inputs_embeds``: the stack's local
                o.g.hold(x)
            enc = o.g.external(enc_n, self.hd, rg=self.train)
            if self.train and not key.last and m > 1:
                preset_grad(enc)
            if key.first:
                out, made = self.prog._dec_layer(o, x, w, enc, None, cross=cross, cross_rg=cross_rg)
                assert made is not None
                if rg and m > 1:
                    preset_grad(made[0])
                if cross_rg and m > 1:
                    preset_grad(made[1])
            else:
                p = o.g.external(bias_n, self.pd, rg=rg)
                z = o.g.external(cross_n, COMPUTE_DTYPE[self.wl.run_precision], rg=cross_rg)
                for t, on in ((p, rg), (z, cross_rg)):
                    if on and not key.last:
                        preset_grad(t)
                if key.second:  # the zero bias is a leaf: its AccumulateGrad keeps it
                    o.checkpoint_args.append(p)
                out, _ = self.prog._dec_layer(o, x, w, enc, (p, z), cross=cross)
            o.g.touch(x)
            o.g.hold(out)
            return x, [out]

        return self.block(
            w, body, repeated=True, frozen=key.frozen, key=("dec", key, w, enc_n, cross)
        )

    def head(self, w: Work, s_enc: int, cached_casts: int = 0) -> BlockProfile:
        """``final_layer_norm``, dropout, the LM head and (training) the loss; then the model
        returns and autocast exits: ``cached_casts`` bytes of cached weight casts go.

        ``T5ForConditionalGeneration.forward`` (transformers 5.23 modeling_t5.py) keeps
        ``decoder_outputs``, and with it the stack's output (after dropout), until it returns:
        through the LM head and the loss, not only until ``* model_dim ** -0.5``."""
        a = self.a
        bias_n = a.n_heads * w.q_len * w.kv_len
        cross_n = a.n_heads * w.q_len * s_enc

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.res, rg=self.train)
            locals_ = []
            if not self.emb_leaf:  # inputs_embeds (else the autograd graph keeps it)
                locals_.append(o.g.input(w.tokens * a.hidden, self.pd, rg=False))
            if not self.ckpt:  # checkpointed layers keep their inputs: the biases
                locals_.append(o.g.input(bias_n, self.pd, rg=False))
                locals_.append(o.g.input(cross_n, COMPUTE_DTYPE[self.wl.run_precision], rg=False))
            if w.impl == "eager" and w.q_len > 1:
                locals_.append(o.g.input(w.batch * w.q_len * w.kv_len, self.hd, rg=False))
            y = stack_out = o.dropout(self.prog._norm(o, x), self.prog.p)
            o.g.touch(*locals_)
            if self.prog.scale_out:
                y = o.unary(y)  # * d_model ** -0.5
            # decoder_outputs[0]: a local of the model until it returns
            return x, self.lm_head_loss(o, y, w, cached_casts, kept=(stack_out,))

        return self.block(w, body, key=("head", w, s_enc, cached_casts))

    def lm_head_loss(
        self, o: Ops, y: Tensor, w: Work, cached_casts: int, *, kept: tuple[Tensor, ...] = ()
    ) -> list[Tensor]:
        """The tied LM head over ``y`` and (training) the cross-entropy, then the model returns:
        ``kept`` (its locals held to the end) and ``cached_casts`` bytes of autocast's cached
        weight casts go. The block's outputs: the loss (backward starts from it), or the
        logits when generating (their next-token row copied to fp32)."""
        a = self.a
        o.lm_head_trainable = self.tied_grad
        logits = o.linear(y, a.hidden, a.vocab, name="lm_head", trainable=self.tied_grad)
        if self.tied_grad and o.existing_grads:
            o.g.nodes[-1].inputs[1].hold_grad = True
        o.g.hold(logits)
        if not w.train:  # generate(): next-token logits copied to fp32
            o.g.hold(o.unary(logits, dtype="f32"))
            return [logits]
        lf = o.fp32_op(logits)  # cross_entropy is on autocast's fp32 list
        (logp,) = o.g.op([lf], [(lf.numel, lf.dtype)])  # log_softmax saves its output
        o.save_outputs(logp)
        (loss,) = o.g.op([logp], [(1, lf.dtype)])
        o.g.hold(loss)
        if kept:
            o.g.touch(*kept)
        if cached_casts:
            o.g.touch(o.g.input(cached_casts, "u8", rg=False))
        return [loss]

    def dec_work(self, q_len: int, kv_len: int) -> Work:
        return self._work(q_len, kv_len, use_cache=self.prog.use_cache and not self.ckpt)

    def decoder(self, w: Work, enc_n: int, *, cross: str, shift: bool) -> list[Stack]:
        embed = self.dec_embed(w, shift=shift)
        frozen = self.freeze_dec
        layers = self._layers(
            self.a.n_dec_layers,
            frozen,
            embed.out_rg,
            lambda k: self.dec_layer(w, k, enc_n, cross),
        )
        s_enc = enc_n // (w.batch * self.a.hidden)
        # checkpointed training: the layers' weight casts autocast caches until it exits
        casts = self.enc_casts + cast_cache_bytes(layers) if self.train else 0
        return [Stack(embed, 1), *layers, Stack(self.head(w, s_enc, casts), 1)]

    # -------------------------------------------------------------- totals
    def _counts(self, stacks: list[Stack]) -> tuple[int, int, int, int]:
        """Parameters, trainable parameters, their bytes, gradient bytes — the shared embedding
        once (it is counted by both embeddings and the LM head)."""
        t = totals(stacks)
        n, n_train, p_bytes, g_bytes = t.n_params, t.n_trainable, t.param_bytes, t.grad_bytes
        shared = self.a.vocab * self.a.hidden
        n -= 2 * shared
        p_bytes -= 2 * shared * DTYPE_BYTES[self.pd]
        if self.tied_grad:
            n_train -= 2 * shared
            g_bytes -= 2 * shared * DTYPE_BYTES[self.pd]
        return n, n_train, p_bytes, g_bytes

    def run(self) -> Simulated:
        return self.train_step() if self.train else self.generate()

    def train_step(self) -> Simulated:
        wl = self.wl
        enc = self.encoder()
        self.enc_casts = cast_cache_bytes(enc)
        ew = self.enc_work()
        enc_n = ew.tokens * self.a.hidden
        cross = "project" if self.ckpt or not self.prog.use_cache else "cache"
        dec = self.decoder(self.dec_work(wl.seq_len, wl.seq_len), enc_n, cross=cross, shift=True)
        stacks = enc + dec
        n, n_train, param_bytes, grad_bytes = self._counts(stacks)
        shapes = trainable_shapes(stacks)
        if self.tied_grad:
            for _ in range(2):
                shapes.remove(((self.a.vocab, self.a.hidden), self.pd))
        embeddings = embedding_shapes(stacks)
        if self.tied_grad:
            embeddings.remove(((self.a.vocab, self.a.hidden), self.pd))
        opt = optimizer_bytes(
            wl.optimizer or "none", shapes, grad_bytes, embedding_shapes=embeddings
        )
        return training_step(
            stacks,
            wl,
            param_bytes=param_bytes,
            grad_bytes=grad_bytes,
            opt=opt,
            inputs=self.prog.input_bytes(wl.batch_size, wl.seq_len, True),
            view=self._rank_view(stacks, len(enc), opt) if is_distributed(wl) else None,
            n_params=n,
            n_trainable=n_train,
        )

    def _rank_view(self, stacks: list[Stack], dec_embed: int, opt: Any) -> RankView:
        """One data-parallel rank (``compose.rank_view_for``): the shared embedding is a
        parameter of the encoder's embedding only (dropped from the decoder's and the head's)."""
        counts = [st.count for st in stacks]
        params = params_of([st.profile for st in stacks], counts, tied=True)
        shared = (self.a.vocab, self.a.hidden)
        for k, prm in enumerate(params[dec_embed]):
            if prm.shape == shared:
                del params[dec_embed][k]
                break
        return rank_view_for(self.wl, stacks, tied=True, opt=opt, params=params)

    def generate(self) -> Simulated:
        """memfit's seq2seq generation: the encoder once, a first decoder step from the start
        token that fills the self- and cross-attention caches (phase ``prefill``), then
        ``new_tokens - 1`` decode steps reusing the cross-attention cache; the last one, with the
        self-attention cache at its final length, is the decode peak."""
        wl = self.wl
        a = self.a
        b = wl.batch_size
        ew = self.enc_work()
        enc_n = ew.tokens * a.hidden
        inputs = self.prog.input_bytes(b, wl.seq_len, False)
        prefill_stacks = self.encoder()
        n, _, param_bytes, _ = self._counts(
            prefill_stacks + self.decoder(self.dec_work(1, 1), enc_n, cross="cache", shift=False)
        )
        static = vadd(one(PARAMS, param_bytes), one(ACTS, inputs))
        start_token = one(ACTS, b * ID_BYTES)
        enc_pts, enc_end = run_stacks(static, prefill_stacks, backward=False)
        first = self.decoder(self.dec_work(1, 1), enc_n, cross="cache", shift=False)
        dec_pts, after = run_stacks(vadd(enc_end, start_token), first, backward=False)
        phases = {"prefill": [static, *enc_pts, *dec_pts]}
        # after the first step: the output (logits) is dropped, the next token kept
        enc_bytes = enc_n * DTYPE_BYTES[self.hd]
        inner = a.n_heads * a.head_dim
        cdt = COMPUTE_DTYPE[wl.run_precision]
        cross_cache = 2 * a.n_dec_layers * b * ew.q_len * inner * DTYPE_BYTES[cdt]
        per_token = 2 * a.n_dec_layers * b * inner * DTYPE_BYTES[cdt]
        casts = cast_cache_bytes(prefill_stacks + first)  # autocast's cache, until it exits
        kept = vadd(
            vadd(static, one(ACTS, enc_bytes + 2 * b * ID_BYTES + casts)), one(KV, cross_cache)
        )
        start = vadd(kept, one(KV, per_token))
        del after
        if wl.new_tokens <= 1:
            phases["decode"] = [start]
        else:
            total = wl.new_tokens
            base = vadd(kept, one(KV, per_token * (total - 1)))
            self.casts_exist = True
            last = self.decoder(self.dec_work(1, total), enc_n, cross="reuse", shift=False)
            pts, _ = run_stacks(base, last, backward=False)
            phases["decode"] = [start, *pts]
        return Simulated(candidates=phases, n_params=n, n_trainable=0)


#: ``T5ForConditionalGeneration`` (T5, Flan-T5).
T5 = CustomFamily(name="t5", model_types=("t5",), program=T5Program)

__all__ = [
    "T5",
    "T5Program",
]
