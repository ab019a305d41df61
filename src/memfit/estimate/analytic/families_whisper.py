"""Whisper (``WhisperForConditionalGeneration``): a speech encoder-decoder, as transformers 5.23
runs it (``transformers/models/whisper/modeling_whisper.py``, v5.23.0).

The step is composed like T5's (``families_t5.py``: the same block runner, layer runs, cache
and generation), from Whisper's own blocks, in forward order::

    encoder: conv1 + GELU → conv2 (stride 2) + GELU → permute + frozen positions → layers →
             layer_norm
    decoder: embed_tokens (labels shifted right) + learned positions → layers → layer_norm →
             proj_out (the decoder embedding's weight) + CrossEntropyLoss

What the module code does that the memory follows:

* ``WhisperEncoder.forward``: ``inputs_embeds`` (conv2's GELU output, permuted: a view) and
  ``all_positions`` are locals until the encoder returns; ``embed_positions`` is frozen
  (``requires_grad_(False)``); under autocast the convolutions run in the half dtype and the
  fp32 position table promotes the residual stream to fp32;
* ``WhisperAttention``: ``(q_proj(x) * scaling).view().transpose(1, 2).contiguous()`` and
  ``k_proj``/``v_proj`` outputs transposed and made contiguous (copies); ``k_proj`` has no bias;
  cross-attention projects the encoder output (``key_value_states``) in every decoder layer;
* encoder layers clamp fp16 hidden states (``torch.clamp``, no ``isinf`` test);
* ``WhisperDecoder.forward``: ``inputs_embeds``, ``position_ids`` and ``positions`` (an index of
  ``embed_positions.weight``) are locals until the decoder returns;
* layers are ``GradientCheckpointingLayer`` (``use_cache`` off under checkpointing);
* ``proj_out`` is tied to ``decoder.embed_tokens`` (one parameter; ``_tied_weights_keys``);
  the loss is ``CrossEntropyLoss`` over the flattened logits.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import AttnShape, attention
from memfit.estimate.analytic.blocks import Work
from memfit.estimate.analytic.compose import (
    ID_BYTES,
    Simulated,
    cast_cache_bytes,
    embedding_shapes,
    is_distributed,
    totals,
    trainable_shapes,
    training_step,
)
from memfit.estimate.analytic.decoder import CustomFamily
from memfit.estimate.analytic.families_t5 import (
    LayerKey,
    T5Program,
    T5Step,
    preset_grad,
    update_cache,
)
from memfit.estimate.analytic.graph import DTYPE_BYTES, KV, Tensor
from memfit.estimate.analytic.ops import COMPUTE_DTYPE, PARAM_DTYPE, Ops
from memfit.estimate.analytic.optimizer import optimizer_bytes
from memfit.estimate.analytic.step import BlockProfile, Stack
from memfit.estimate.cuda_reduce import reduce_staging_bytes
from memfit.hardware.cuda_allocator import round_size, segment_size
from memfit.spec import WorkloadSpec

#: Activation kinds of ``Ops.act`` per ``activation_function``.
ACT_KIND = {"relu": "relu", "gelu_new": "gelu_new", "gelu": "gelu", "silu": "silu"}
#: ``eager_attention_forward`` (modeling_whisper.py): ``softmax(attn_weights, dim=-1)`` in the
#: scores' dtype (no fp32 upcast), so autocast's softmax policy alone decides.
EAGER_SOFTMAX = "native"
#: conv2's stride: the encoder sees ``frames / 2`` positions (``max_source_positions``).
CONV2_STRIDE = 2


class WhisperProgram(T5Program):
    """``WhisperForConditionalGeneration`` (task ``speech-seq2seq``); see the module docstring."""

    tasks = ("speech-seq2seq",)

    def __init__(self, a: Arch) -> None:
        super().__init__(a)
        self.mels = int(a.extra["_mels"])
        self.source = int(a.extra["_source_positions"])
        self.act_p = float(a.extra["_act_dropout"])
        self.attn_p = a.attn_dropout
        #: the decoder's heads and feed-forward width (the Arch's are the encoder's)
        self.dec_heads = int(a.extra.get("_dec_heads", a.n_heads))
        self.dec_ffn = int(a.extra.get("_dec_ffn", a.ffn))

    def input_bytes(self, batch: int, seq_len: int, train: bool) -> int:  # type: ignore[override]
        """``input_features`` (B, mels, 2·max_source_positions) in the weights' dtype (memfit's
        trace: ``media_inputs.float_dtype``; set per workload by ``simulate``) and, in
        training, the int64 ``labels``."""
        frames = CONV2_STRIDE * self.source
        features = batch * self.mels * frames * DTYPE_BYTES[self.feature_dtype]
        return features + (batch * seq_len * ID_BYTES if train else 0)

    def _norm(self, o: Ops, x: Tensor) -> Tensor:
        return o.layer_norm(x, self.a.hidden)

    def _heads(self, o: Ops, t: Tensor) -> Tensor:
        """``.view(...).transpose(1, 2).contiguous()``: a copy that saves nothing."""
        return o.unary(t)

    def _attention_core(
        self,
        o: Ops,
        qkv: tuple[Tensor, Tensor, Tensor],
        w: Work,
        kv_len: int,
        *,
        causal: bool,
        heads: int,
    ) -> Tensor:
        shape = AttnShape(
            batch=w.batch,
            n_heads=heads,
            n_kv=heads,
            head_dim=self.a.hidden // heads,
            q_len=w.q_len,
            kv_len=kv_len,
        )
        mask = None
        if causal and w.impl == "eager" and w.q_len > 1:  # create_causal_mask's float mask
            mask = o.g.external(w.batch * w.q_len * kv_len, self.mask_dtype)
        p = self.attn_p if o.train else 0.0
        # q, k and v are contiguous (B, H, S, D) copies: FlashAttention's output follows q's
        # layout, so ``transpose(1, 2).contiguous()`` copies it
        return attention(
            o,
            *qkv,
            shape,
            impl=w.impl,
            mask=mask,
            dropout_p=p,
            q_head_major=True,
            eager_softmax=EAGER_SOFTMAX,
        )

    def _sublayer(
        self,
        o: Ops,
        x: Tensor,
        w: Work,
        *,
        causal: bool,
        heads: int,
        cache: bool = False,
        enc_out: Tensor | None = None,
        cw: Work | None = None,
        cross: str = "",
    ) -> Tensor:
        """``self_attn_layer_norm`` / ``encoder_attn_layer_norm``, ``WhisperAttention``,
        dropout and the residual add."""
        a = self.a
        d = a.hidden
        hn = self._norm(o, x)
        q = o.linear(hn, d, d, bias=True, name="q_proj", late_staging=True)
        q = self._heads(o, o.unary(q))  # * scaling
        kv_len = w.kv_len
        if enc_out is None:
            k = self._heads(o, o.linear(hn, d, d, name="k_proj"))
            v = self._heads(o, o.linear(hn, d, d, bias=True, name="v_proj", late_staging=True))
            if cache:
                k, v = update_cache(o, w, k, v)
        else:
            assert cw is not None
            kv_len = cw.kv_len
            if cross == "reuse":
                n = cw.batch * cw.kv_len * d
                k = o.g.external(n, o.cdtype, comp=KV)
                v = o.g.external(n, o.cdtype, comp=KV)
            else:
                k = self._heads(o, o.linear(enc_out, d, d, name="k_proj"))
                v = self._heads(
                    o, o.linear(enc_out, d, d, bias=True, name="v_proj", late_staging=True)
                )
                if cross == "cache":
                    k, v = update_cache(o, replace(cw, use_cache=True), k, v)
        out = self._attention_core(o, (q, k, v), w, kv_len, causal=causal, heads=heads)
        out = o.linear(out, d, d, bias=True, name="out_proj", late_staging=True)
        o.release_locals(q, k, v)
        o.g.touch(hn)
        out = o.dropout(out, self.p)
        return o.add(x, out)

    def _mlp(self, o: Ops, x: Tensor, ff: int) -> Tensor:
        """``final_layer_norm``, fc1, the activation, dropouts, fc2, the residual add."""
        a = self.a
        d = a.hidden
        hn = self._norm(o, x)
        m = o.act(
            o.linear(hn, d, ff, bias=True, name="fc1", late_staging=True),
            ACT_KIND.get(a.act, "gelu"),
        )
        m = o.dropout(m, self.act_p)
        m = o.linear(m, ff, d, bias=True, name="fc2", late_staging=True)
        o.g.touch(hn)
        m = o.dropout(m, self.p)
        return o.add(x, m)

    def whisper_enc_layer(self, o: Ops, x: Tensor, w: Work) -> Tensor:
        """``WhisperEncoderLayer``: self-attention, MLP, the fp16 clamp."""
        x = self._sublayer(o, x, w, causal=False, heads=self.a.n_heads)
        x = self._mlp(o, x, self.a.ffn)
        o.release_layer_locals()
        if x.dtype == "f16":  # torch.clamp: ClampBackward saves its input
            (x,) = o.g.op([x], [(x.numel, x.dtype)], saves=[x])
        return x

    def whisper_dec_layer(
        self, o: Ops, x: Tensor, w: Work, enc_out: Tensor, *, cross: str
    ) -> Tensor:
        """``WhisperDecoderLayer``: causal self-attention (with the cache), cross-attention over
        the encoder output, MLP. ``cross``: ``cache`` / ``project`` / ``reuse`` (T5's)."""
        a = self.a
        h = self.dec_heads
        x = self._sublayer(o, x, w, causal=True, heads=h, cache=w.use_cache)
        s_enc = enc_out.numel // (w.batch * a.hidden)
        cw = replace(w, q_len=s_enc, kv_len=s_enc)
        x = self._sublayer(o, x, w, causal=False, heads=h, enc_out=enc_out, cw=cw, cross=cross)
        x = self._mlp(o, x, self.dec_ffn)
        o.release_layer_locals()
        return x

    #: the dtype of the eager causal mask and of the features (set per workload by ``simulate``)
    mask_dtype = "f32"
    feature_dtype = "f32"

    def simulate(self, wl: WorkloadSpec, task: str) -> Simulated:
        if wl.tp > 1 or wl.shard == "fsdp" or (not wl.is_train and wl.gpus > 1):
            raise SpecError(
                f"tp={wl.tp}, shard={wl.shard!r}, gpus={wl.gpus} ({wl.mode}) is not modelled by "
                f"the analytic engine for {self.a.model_type!r} (encoder-decoder): it models "
                "one GPU, DDP and ZeRO-1/2/3 with offload in training; use --engine trace"
            )
        self.wo_fp32 = False
        self.mask_dtype = self.feature_dtype = PARAM_DTYPE[wl.run_precision]
        return _WhisperStep(self, wl, task).run()


class _WhisperStep(T5Step):
    """Whisper's blocks in T5's composition (``T5Step``)."""

    prog: WhisperProgram

    def __init__(self, prog: WhisperProgram, wl: WorkloadSpec, task: str) -> None:
        super().__init__(prog, wl, task)
        #: the residual stream: the position tables (weights' dtype) promote the half conv and
        #: embedding outputs (autocast) to it
        self.res = self.pd
        self.hd = self.pd
        #: no position bias in Whisper
        self.enc_bias_rg = self.dec_bias_rg = False

    # -------------------------------------------------------------- encoder
    def enc_work(self) -> Work:
        s = self.prog.source
        return self._work(s, s, use_cache=False)

    def enc_embed(self, w: Work) -> BlockProfile:
        """conv1 + GELU, conv2 + GELU, permute, ``embed_positions(arange)`` (frozen), the add
        and the dropout; ``inputs_embeds`` and ``all_positions`` stay (the encoder's locals)."""
        a, prog = self.a, self.prog
        d = a.hidden
        frames = CONV2_STRIDE * prog.source

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            feats = o.g.external(w.batch * prog.mels * frames, self.pd)
            h1 = self._conv(o, feats, prog.mels, w.batch * frames)
            if self.emb_leaf:  # enable_input_require_grads hooks conv1 (the encoder's input
                # embedding, ``_input_embed_layer``): its output is a leaf that requires grad,
                # which the autograd graph keeps until the step ends, its ``.grad`` too
                h1.rg = h1.leaf = True
                o.g.hold(h1)
            h1 = o.act(h1, "gelu")
            h2 = o.act(self._conv(o, h1, d, w.tokens), "gelu")
            o.g.hold(h2)  # ``inputs_embeds``
            ar = o.new(prog.source, "i64")
            o.g.hold(ar)  # ``all_positions``
            pos = o.weight(prog.source, d, trainable=False)
            pos.is_embedding = True
            (pe,) = o.g.op([pos, ar], [(prog.source * d, self.pd)])
            x = o.add(h2, pe)
            y = o.dropout(x, prog.p)
            o.g.hold(y)
            return None, [y]

        return self.block(w, body)

    def _conv(self, o: Ops, x: Tensor, c_in: int, rows: int) -> Tensor:
        """``nn.Conv1d(c_in, d, kernel_size=3)`` with its bias: ConvolutionBackward saves the
        input and the weight (both, where the node exists: a frozen conv2 under LoRA keeps its
        input); under autocast both are cast to the half dtype."""
        d = self.a.hidden
        wc = o.weight(d, c_in, 3)
        bc = o.weight(d)
        xi, wi, bi = o.autocast_input(x), o.autocast_weight(wc), o.autocast_weight(bc)
        (out,) = o.g.op(
            [xi, wi, bi],
            [(rows * d, xi.dtype)],
            saves=[xi, wi],  # convolution_backward takes both, whichever gradient it makes
            matmul=True,
        )
        return out

    def enc_layer(self, w: Work, key: LayerKey) -> BlockProfile:
        a = self.a

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.res, rg=key.in_rg)
            out = self.prog.whisper_enc_layer(o, x, w)
            o.g.touch(x)
            o.g.hold(out)
            return x, [out]

        return self.block(w, body, repeated=True, frozen=key.frozen, key=("enc", key))

    def enc_final(self, w: Work) -> BlockProfile:
        """``layer_norm``; the encoder returns: its locals go; the model output keeps
        ``encoder_last_hidden_state``."""
        a, prog = self.a, self.prog
        cd = _conv_dtype(self.wl)

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.res, rg=self.train)
            gone = [
                o.g.input(w.tokens * a.hidden, cd, rg=False),  # inputs_embeds
                o.g.input(prog.source, "i64", rg=False),  # all_positions
            ]
            y = self.prog._norm(o, x)
            o.g.touch(*gone)
            o.g.hold(y)
            return x, [y]

        return self.block(w, body)

    # -------------------------------------------------------------- decoder
    def dec_embed(self, w: Work, *, shift: bool) -> BlockProfile:
        """``shift_tokens_right(labels)`` (training), ``embed_tokens``, ``position_ids``
        (arange + past length, repeated over the batch), ``embed_positions.weight[ids]``, the
        add; ``inputs_embeds``, ``position_ids``, ``positions`` and the eager causal mask stay
        (the decoder's locals)."""
        a, prog = self.a, self.prog
        d = a.hidden

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            if shift:  # new_zeros, a sliced clone, == -100, masked_fill_
                ids = o.new(w.tokens, "i64")
                part = o.new(w.tokens - w.batch, "i64")
                eq = o.new(w.tokens, "bool")
                o.g.touch(ids, part, eq)
            else:
                ids = o.g.external(w.tokens, "i64")
            o.freeze_token_embedding = self.frozen_emb
            o.tied_embedding = self.tied_grad
            emb = prog.embed_tokens(o, ids, w.tokens)
            emb.rg = emb.rg or self.emb_leaf
            o.g.hold(emb)
            (ar,) = o.g.op([], [(w.q_len, "i64")])  # arange(S) + past length
            (pid,) = o.g.op([ar], [(w.tokens, "i64")])  # unsqueeze(0).repeat(B, 1)
            o.g.hold(pid)
            pw = o.weight(a.n_positions, d)
            pw.is_embedding = True
            (pos,) = o.g.op([pw, pid], [(w.tokens * d, self.pd)], saves=[pid], grad_to=[pw])
            o.g.hold(pos)
            x = o.add(emb, pos)
            if w.impl == "eager" and w.q_len > 1:
                o.g.hold(o.new(w.batch * w.q_len * w.kv_len, self.pd))
            y = o.dropout(x, prog.p)
            o.g.hold(y)
            return None, [y]

        return self.block(w, body)

    def dec_layer(self, w: Work, key: LayerKey, enc_n: int, cross: str) -> BlockProfile:
        a, m = self.a, self.a.n_dec_layers

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.res, rg=key.in_rg)
            enc = o.g.external(enc_n, self.res, rg=self.train)
            if self.train and not key.last and m > 1:
                preset_grad(enc)
            out = self.prog.whisper_dec_layer(o, x, w, enc, cross=cross)
            o.g.touch(x)
            o.g.hold(out)
            return x, [out]

        return self.block(
            w, body, repeated=True, frozen=key.frozen, key=("dec", key, w, enc_n, cross)
        )

    def head(self, w: Work, s_enc: int, cached_casts: int = 0) -> BlockProfile:
        """The decoder's ``layer_norm``; the decoder returns (its locals go); ``proj_out`` (the
        tied embedding) and, in training, ``CrossEntropyLoss``; autocast's cached casts go when
        the model returns."""
        a = self.a

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, self.res, rg=self.train)
            locals_ = [
                o.g.input(w.tokens, "i64", rg=False),  # position_ids
                o.g.input(w.tokens * a.hidden, self.pd, rg=False),  # positions
            ]
            if not self.emb_leaf:  # inputs_embeds (else the autograd graph keeps it)
                locals_.append(o.g.input(w.tokens * a.hidden, self.pd, rg=False))
            if w.impl == "eager" and w.q_len > 1:
                locals_.append(o.g.input(w.batch * w.q_len * w.kv_len, self.pd, rg=False))
            y = self.prog._norm(o, x)
            o.g.touch(*locals_)
            return x, self.lm_head_loss(o, y, w, cached_casts)

        return self.block(w, body, key=("head", w, s_enc, cached_casts))

    # -------------------------------------------------------------- totals
    def _counts(self, stacks: list[Stack]) -> tuple[int, int, int, int]:
        """The decoder embedding is ``proj_out``'s weight: counted once."""
        t = _totals(stacks)
        n, n_train, p_bytes, g_bytes = t
        shared = self.a.vocab * self.a.hidden
        n -= shared
        p_bytes -= shared * DTYPE_BYTES[self.pd]
        if self.tied_grad:
            n_train -= shared
            g_bytes -= shared * DTYPE_BYTES[self.pd]
        return n, n_train, p_bytes, g_bytes

    def train_step(self) -> Simulated:
        """T5's step with one tied weight (the decoder embedding and ``proj_out``) and the
        features among the inputs."""
        wl = self.wl
        enc = self.encoder()
        self.enc_casts = cast_cache_bytes(enc)
        enc_n = self.enc_work().tokens * self.a.hidden
        cross = "project" if self.ckpt or not self.prog.use_cache else "cache"
        dec = self.decoder(self.dec_work(wl.seq_len, wl.seq_len), enc_n, cross=cross, shift=True)
        stacks = enc + dec
        n, n_train, param_bytes, grad_bytes = self._counts(stacks)
        shapes = trainable_shapes(stacks)
        embeddings = embedding_shapes(stacks)
        if self.tied_grad:
            shapes.remove(((self.a.vocab, self.a.hidden), self.pd))
        opt = optimizer_bytes(
            wl.optimizer or "none", shapes, grad_bytes, embedding_shapes=embeddings
        )
        inputs = self.prog.input_bytes(wl.batch_size, wl.seq_len, True)
        sim = training_step(
            stacks,
            wl,
            param_bytes=param_bytes,
            grad_bytes=grad_bytes,
            opt=opt,
            inputs=inputs,
            view=None if not is_distributed(wl) else self._rank_view(stacks, len(enc), opt),
            n_params=n,
            n_trainable=n_train,
        )
        stranded = 0 if is_distributed(wl) else self.staging_stranded_bytes()
        if stranded:
            sim.info["staging_stranded_bytes"] = stranded
        return sim

    def staging_stranded_bytes(self) -> int:
        """The segment a later training step takes again for the backward's largest one-off
        request: the reduction staging buffer of the widest bias gradient summed over every
        encoder frame (fc1's, ``encoder_ffn_dim`` columns over batch x ``max_source_positions``
        rows; ``AddmmBackward0``'s ``sum_to``, CUDA's ``gpu_reduce_kernel``: a step function of
        the rows capped by the SM count, :mod:`memfit.estimate.cuda_reduce`), or of the
        decoder's over its tokens where that is larger. 0 without trainable biases (LoRA).

        Found in the trace engine's allocator replay (``allocator/caching.py``) of
        whisper-base and whisper-small cut to 2 layers (docs/accuracy.md, "Whisper training and
        inference on the fast path"): the first step creates a segment for the staging block
        (no free block is that large); once it is freed, best fit places other blocks in it
        (the first optimizer step's lazily created AdamW state of the tied embedding,
        ``torch.optim.AdamW``'s first ``step``; later the next forward's activations), so the
        second or the third step's request takes a new segment, and every step after reuses
        that one. The wide ratio does not reach it: the block is 10-15 % of the peak at batch
        5. Counted at its segment size (``cuda_allocator.segment_size``), at every point of
        the range, as FSDP2's root buffers are (``distributed.fsdp_stranded_bytes``); where the
        ratio's slack already holds it the rule lies over."""
        wl, prog = self.wl, self.prog
        if wl.lora_rank is not None or wl.batch_size < 1:
            return 0
        enc = (wl.batch_size * prog.source, max(prog.a.ffn, prog.a.hidden))
        dec = (wl.batch_size * wl.seq_len, max(prog.dec_ffn, prog.a.hidden))
        largest = max(reduce_staging_bytes(shape, (0,))[0] for shape in (enc, dec))
        return segment_size(round_size(largest)) if largest else 0


def _conv_dtype(wl: WorkloadSpec) -> str:
    """The dtype of the convolutions' outputs: autocast's half dtype, else the weights'."""
    return COMPUTE_DTYPE[wl.run_precision]


def _totals(stacks: list[Stack]) -> tuple[int, int, int, int]:
    t = totals(stacks)
    return t.n_params, t.n_trainable, t.param_bytes, t.grad_bytes


#: ``WhisperForConditionalGeneration`` (whisper-tiny … whisper-large-v3-turbo).
WHISPER = CustomFamily(name="whisper", model_types=("whisper",), program=WhisperProgram)

__all__ = ["WHISPER", "WhisperProgram"]
