"""CLIP (``CLIPModel``): two towers and a contrastive loss, composed block by block.

``CLIPModel.forward`` (transformers 5.23, ``models/clip/modeling_clip.py``) runs, in this order:

* the vision tower: pixels cast to the weights' dtype, a bias-free patch convolution, the class
  embedding concatenated in front, learned positions, ``pre_layrnorm``; ``L_v`` pre-LayerNorm
  ``CLIPEncoderLayer`` s (q/k/v/out projections with bias, SDPA or eager attention, fc1,
  quick_gelu, fc2); ``post_layernorm`` of the class token; ``visual_projection``;
* the text tower: token + position embeddings, a causal mask (a (B, 1, S, S) float mask for
  eager attention, ``is_causal`` for SDPA); ``L_t`` encoder layers; ``final_layer_norm`` of every
  position; the end-of-text position gathered (``argmax`` over the ids); ``text_projection``;
* both embeddings divided by their L2 norm, ``logits_per_text = t·iᵀ · exp(logit_scale)`` and,
  with ``return_loss``, the mean of two cross-entropies (over rows and over columns).

Every tensor of the model output (both ``last_hidden_state`` s, both projected embeddings, the
normalised ones, the logits) lives until the step ends. Backward runs the text tower first (its
nodes were created later: autograd's sequence-number priority) while the image embedding's
gradient waits, then the vision tower: the reverse of the forward's block order, which is what
:func:`~memfit.estimate.analytic.step.run_stacks` composes.

Beyond the single-chain families, what decides CLIP's peaks: under checkpointing, torch's early
stop (the recomputation ends at the last saved tensor) and peft's ``enable_input_require_grads``
(LoRA: both towers' embedding outputs become leaves that require grad); under AMP, in
checkpointed layers and in inference, autocast's cache of the weight casts, alive until the
forward ends; eager attention's weights, kept by the layer's ``hidden_states, _ = ...``.

The B x B logits and log-probabilities are the only terms not linear in the batch size
(``api.estimate_many`` interpolates linearly: off by a few B² elements).

Not modelled (SpecError, ``--engine trace``): ``freeze_layers`` (``CLIPModel`` has no single
input embedding: transformers' ``get_input_embeddings`` raises), FSDP (the trace wraps only the
longer tower's layers in their own units, the rest stays in the root) and tensor parallelism.
"""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import attention
from memfit.estimate.analytic.blocks import Work, attn_shape, eager_mask
from memfit.estimate.analytic.compose import (
    Body,
    Simulated,
    embedding_shapes,
    forward_pass,
    hidden_dtype,
    is_distributed,
    rank_view_for,
    run_workload_block,
    totals,
    trainable_shapes,
    training_step,
)
from memfit.estimate.analytic.decoder import CustomFamily
from memfit.estimate.analytic.graph import DTYPE_BYTES, Tensor
from memfit.estimate.analytic.mlp import ACT_KIND
from memfit.estimate.analytic.ops import COMPUTE_DTYPE, Ops, promote
from memfit.estimate.analytic.optimizer import optimizer_bytes
from memfit.estimate.analytic.step import BlockProfile, Stack
from memfit.spec import WorkloadSpec

#: ``CLIPTextConfig`` / ``CLIPVisionConfig`` / ``CLIPConfig`` defaults (transformers 5.23), for
#: keys a config.json omits.
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 49408,
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "attention_dropout": 0.0,
    "eos_token_id": 49407,
}
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "quick_gelu",
    "attention_dropout": 0.0,
}
PROJECTION_DIM_DEFAULT = 512
#: ``eos_token_id`` of configs saved before transformers PR #24773: the text tower then pools
#: the position of the largest token id (``argmax`` of the ids) instead of the first EOS.
LEGACY_EOS_TOKEN_ID = 2


def _tower_config(config: dict[str, Any], key: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """A tower's settings: ``CLIPConfig.__post_init__`` lets ``<key>_dict`` override
    ``<key>``; the sub-config class's defaults fill the rest."""
    sub = {**(config.get(key) or {}), **(config.get(key + "_dict") or {})}
    return {**defaults, **{k: v for k, v in sub.items() if v is not None}}


def _tower_arch(sub: dict[str, Any], model_type: str) -> Arch:
    h = int(sub["hidden_size"])
    heads = int(sub["num_attention_heads"])
    return Arch(
        family="clip",
        model_type=model_type,
        hidden=h,
        n_layers=int(sub["num_hidden_layers"]),
        n_heads=heads,
        n_kv=heads,
        head_dim=h // heads,
        ffn=int(sub["intermediate_size"]),
        vocab=int(sub.get("vocab_size", 0)),
        tie=False,
        act=str(sub["hidden_act"]),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        n_positions=int(sub.get("max_position_embeddings", 0)),
        attn_dropout=float(sub["attention_dropout"]),
        extra=sub,
    )


def clip_towers(config: dict[str, Any]) -> tuple[Arch, Arch, int]:
    """The text tower, the vision tower and the projection width of a CLIP config."""
    text = _tower_arch(_tower_config(config, "text_config", TEXT_DEFAULTS), "clip_text_model")
    vision = _tower_arch(
        _tower_config(config, "vision_config", VISION_DEFAULTS), "clip_vision_model"
    )
    return text, vision, int(config.get("projection_dim") or PROJECTION_DIM_DEFAULT)


class ClipProgram:
    """``CLIPModel`` with ``return_loss`` (module docstring); task ``clip``."""

    tasks = ("clip",)

    def __init__(self, a: Arch) -> None:
        self.a = a
        self.text, self.vision, self.proj = clip_towers(a.extra)
        v = self.vision.extra
        self.image_size = int(v["image_size"])
        self.patch = int(v["patch_size"])
        self.channels = int(v["num_channels"])
        self.n_patches = (self.image_size // self.patch) ** 2

    # ------------------------------------------------------------------ sizes
    def input_bytes(self, batch: int, seq_len: int) -> int:
        """``input_ids`` (int64) and fp32 ``pixel_values`` (trace/steps.py ``example_inputs``)."""
        pixels = batch * 3 * self.image_size * self.image_size * DTYPE_BYTES["f32"]
        return batch * seq_len * DTYPE_BYTES["i64"] + pixels

    def buffer_bytes(self) -> int:
        """The two ``position_ids`` buffers, (1, positions) int64, counted with parameters."""
        return DTYPE_BYTES["i64"] * (self.text.n_positions + self.n_patches + 1)

    # ------------------------------------------------------------------ checks
    def check(self, wl: WorkloadSpec) -> None:
        problems = []
        if wl.seq_len > self.text.n_positions:
            problems.append(
                f"seq_len ({wl.seq_len}) exceeds the CLIP text tower's max_position_embeddings "
                f"({self.text.n_positions}); pass --seq {self.text.n_positions} or less"
            )
        refused = []
        if wl.freeze_layers:
            refused.append(f"freeze_layers ({wl.freeze_layers})")
        if wl.shard == "fsdp":
            refused.append("shard 'fsdp'")
        if wl.tp > 1:
            refused.append(f"tp ({wl.tp})")
        if refused:
            problems.append(
                f"{', '.join(refused)} not modelled by the analytic engine for CLIP; "
                "use --engine trace"
            )
        if problems:
            raise SpecError("; ".join(problems))

    # ------------------------------------------------------------------ blocks
    def _run(self, wl: WorkloadSpec, body: Body, *, layer: bool = False) -> BlockProfile:
        return run_workload_block(
            wl, body, model_type="clip", batch=wl.batch_size, train=wl.is_train, repeated=layer
        )

    def _layer(self, o: Ops, a: Arch, x: Tensor, w: Work, mask: Tensor | None) -> Tensor:
        """``CLIPEncoderLayer``: x + attn(LN1(x)), then x + fc2(act(fc1(LN2(x))))."""
        h = a.hidden
        hn = o.layer_norm(x, h)
        q = o.linear(hn, h, h, bias=True, name="q_proj")
        k = o.linear(hn, h, h, bias=True, name="k_proj")
        v = o.linear(hn, h, h, bias=True, name="v_proj")
        shape = attn_shape(a, w)
        att = attention(o, q, k, v, shape, impl=w.impl, mask=mask, dropout_p=a.attn_dropout)
        out = o.linear(att, h, h, bias=True, name="out_proj")
        # Locals until their module returns (a LoRA projection saves only its fp32 input copy):
        # q/k/v and ``attn_output`` (attention), the LayerNorm output (the layer's
        # ``hidden_states``), the activation (the MLP's, fc2's input). Eager attention's
        # ``attn_weights`` lands in the layer's ``hidden_states, _ = self.self_attn(...)``: alive
        # until the layer returns.
        weights = list(o.locals)
        o.release_locals(q, k, v, att)
        o.g.touch(hn)
        x = o.add(x, out)
        hn = o.layer_norm(x, h)
        m = _act(o, o.linear(hn, h, a.ffn, bias=True, name="fc1"), a.act)
        out = o.linear(m, a.ffn, h, bias=True, name="fc2")
        o.g.touch(m, hn)
        out = o.add(x, out)
        o.g.touch(*weights)
        return out

    def _layer_block(
        self, wl: WorkloadSpec, w: Work, a: Arch, *, in_rg: bool
    ) -> tuple[BlockProfile, int]:
        """One encoder layer's profile, and the bytes of the weight casts autocast caches for
        it until the forward ends when checkpointing keeps nothing else (module docstring)."""
        text = a is self.text
        cached = [0]

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            x = o.g.input(w.tokens * a.hidden, hidden_dtype(wl.run_precision), rg=in_rg)
            mask = None
            if text and w.impl == "eager":
                mask = o.g.external(w.batch * w.q_len * w.q_len, hidden_dtype(wl.run_precision))
            out = self._layer(o, a, x, w, mask)
            o.g.touch(x)  # the encoder loop's ``hidden_states`` until the layer returns
            o.g.hold(out)  # the next block's input
            cached[0] = _hold_cached_casts(o, wl)
            return x, [out]

        # Checkpointed training: ``run_block`` holds the casts autocast caches (its recomputation
        # holds nothing past its early stop: ``Graph.recomputation``).
        prof = self._run(wl, body, layer=True)
        return prof, prof.cast_bytes if wl.is_train else cached[0]

    def _vision_embed(self, wl: WorkloadSpec, w: Work) -> tuple[BlockProfile, int]:
        """``CLIPVisionEmbeddings`` then ``pre_layrnorm`` (and the bytes of cached casts)."""
        a = self.vision
        cached = [0]

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            h, p, c = a.hidden, self.patch, self.channels
            pixels = o.g.external(w.batch * c * self.image_size**2, "f32")
            px = o.cast(pixels, o.pdtype)  # pixel_values.to(patch_embedding.weight.dtype)
            wconv = o.weight(h, c, p, p)
            xin, wi = o.autocast_input(px), o.autocast_weight(wconv)
            (conv,) = o.g.op(
                [xin, wi], [(w.batch * self.n_patches * h, xin.dtype)], saves=[xin, wi]
            )
            _input_requires_grad(o, wl, conv)
            cls = o.weight(h)
            (cat,) = o.g.op([cls, conv], [(w.tokens * h, promote(conv.dtype, cls.dtype))])
            pos = o.embedding(w.q_len, w.q_len, h)  # position_embedding(position_ids)
            x = o.add(cat, pos)
            o.g.touch(conv, cat)  # ``patch_embeds``, ``embeddings``: locals until the return
            x = o.layer_norm(x, h)
            o.g.hold(x)
            _keep_local(o, wl, x)  # the encoder's ``inputs_embeds`` until the tower returns
            cached[0] = _hold_cached_casts(o, wl)
            return None, [x]

        return self._run(wl, body), cached[0]

    def _vision_head(
        self, wl: WorkloadSpec, w: Work, *, in_rg: bool, local: bool
    ) -> tuple[BlockProfile, int]:
        """``post_layernorm`` of the class token, ``visual_projection`` (and the bytes of cached
        casts)."""
        a = self.vision
        cached = [0]

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            h = a.hidden
            x = o.g.input(w.tokens * h, hidden_dtype(wl.run_precision), rg=in_rg)
            o.g.hold(x)  # vision_model_output.last_hidden_state
            pooled = o.layer_norm(o.slice(x, w.batch, w.tokens), h)  # [:, 0, :]
            if local:  # the tower returns: ``_keep_local``'s copy is freed
                o.g.touch(o.g.input(x.numel, x.dtype, rg=False))
            img = o.linear(pooled, h, self.proj, name="visual_projection")
            o.g.touch(pooled)  # ``pooled_output``, a local of ``get_image_features``
            o.g.hold(img)  # vision_model_output.pooler_output
            cached[0] = _hold_cached_casts(o, wl)
            return x, [img]

        return self._run(wl, body), cached[0]

    def _text_embed(self, wl: WorkloadSpec, w: Work) -> BlockProfile:
        """``CLIPTextEmbeddings`` and ``create_causal_mask``."""
        a = self.text

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            h = a.hidden
            tok = o.embedding(w.tokens, a.vocab, h)
            _input_requires_grad(o, wl, tok)
            pos = o.embedding(w.q_len, a.n_positions, h)
            x = o.add(tok, pos)
            o.g.hold(x)
            if w.impl == "eager":
                eager_mask(o, w, x.dtype)
            _keep_local(o, wl, x)
            return None, [x]

        return self._run(wl, body)

    def _text_head(
        self,
        wl: WorkloadSpec,
        w: Work,
        *,
        x_rg: bool,
        image_rg: bool,
        local: bool,
        cached_casts: int,
    ) -> BlockProfile:
        """``final_layer_norm``, the EOS gather, ``text_projection``, the normalised embeddings,
        the logits and (training) the contrastive loss."""
        a = self.text
        b = w.batch

        def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
            h = a.hidden
            x = o.g.input(w.tokens * h, hidden_dtype(wl.run_precision), rg=x_rg)
            # visual_projection's output, in the compute dtype
            img = o.g.input(b * self.proj, COMPUTE_DTYPE[wl.run_precision], rg=image_rg)
            o.g.hold(img)
            last = o.layer_norm(x, h)
            o.g.hold(last)  # text_model_output.last_hidden_state
            pooled = self._eos_gather(o, last, w)
            # The text tower returns: its frame's mask and ``_keep_local``'s copy are freed (a
            # checkpointed layer's recomputation keeps the mask: counted to the step's end).
            if w.impl == "eager" and not (w.train and wl.checkpointing != "none"):
                o.g.touch(o.g.input(b * w.q_len * w.q_len, x.dtype, rg=False))
            if local:
                o.g.touch(o.g.input(x.numel, x.dtype, rg=False))
            # bitsandbytes/FP8 keep the model's last Linear out (``get_keys_to_not_convert``)
            quant, o.quant = o.quant, None
            txt = o.linear(pooled, h, self.proj, name="text_projection")
            o.quant = quant
            o.g.touch(pooled)  # ``pooled_output``, a local of ``get_text_features``
            o.g.hold(txt)
            img_n = _normalized(o, img, b)
            txt_n = _normalized(o, txt, b)
            logits = o.matmul(txt_n, img_n, b * b)
            scale = o.fp32_op(o.weight(1))  # logit_scale.exp(): ExpBackward saves its result
            (e,) = o.g.op([scale], [(1, scale.dtype)])
            o.save_outputs(e)
            (logits,) = o.g.op(  # a 0-dim factor keeps the logits' dtype
                [logits, e],
                [(logits.numel, logits.dtype)],
                saves=[logits if e.rg else None, e if logits.rg else None],  # type: ignore[list-item]
            )
            o.g.hold(img_n, txt_n, logits)
            outs = [logits]
            if w.train:
                losses = [_cross_entropy(o, logits, b) for _ in range(2)]  # rows, then columns
                (loss,) = o.g.op(losses, [(1, "f32")])  # (caption + image) / 2
                o.g.hold(loss)
                outs = [loss]
            # The model returns and autocast exits: its cache of weight casts is freed.
            own = _cached_casts(o, wl)
            if cached_casts or own:
                o.g.touch(o.g.input(cached_casts, "u8", rg=False), *own)
            return x, outs

        return self._run(wl, body)

    def _eos_gather(self, o: Ops, last: Tensor, w: Work) -> Tensor:
        """``last_hidden_state[arange(B), ids.to(int).argmax(-1)]`` (or the first EOS position):
        IndexBackward saves the two int64 index vectors and scatters into a zero gradient of
        ``last``'s size."""
        ids = [o.new(w.tokens, "i32")]
        if int(self.text.extra.get("eos_token_id") or 0) != LEGACY_EOS_TOKEN_ID:
            ids += [o.new(w.tokens, "bool"), o.new(w.tokens, "i32")]  # (ids == eos).int()
        pos = o.new(w.batch, "i64")  # argmax
        rows = o.new(w.batch, "i64")  # arange
        o.g.touch(*ids)
        (pooled,) = o.g.op(
            [last, rows, pos],
            [(w.batch * self.text.hidden, last.dtype)],
            saves=[rows, pos],
            grad_to=[last],
        )
        return pooled

    # ------------------------------------------------------------------ the step
    def _stacks(self, wl: WorkloadSpec) -> list[Stack]:
        b = wl.batch_size
        sv, st = self.n_patches + 1, wl.seq_len
        wv = Work(batch=b, q_len=sv, kv_len=sv, impl=wl.attention, task="clip", train=wl.is_train)
        wt = Work(batch=b, q_len=st, kv_len=st, impl=wl.attention, task="clip", train=wl.is_train)
        v_embed, e_casts = self._vision_embed(wl, wv)
        v_layers, v_rg, v_casts = self._tower_stacks(wl, wv, self.vision, v_embed.out_rg)
        v_head, h_casts = self._vision_head(
            wl, wv, in_rg=v_rg, local=_keeps_local(wl, v_embed.out_rg)
        )
        t_embed = self._text_embed(wl, wt)
        t_layers, t_rg, t_casts = self._tower_stacks(wl, wt, self.text, t_embed.out_rg)
        t_head = self._text_head(
            wl,
            wt,
            x_rg=t_rg,
            image_rg=v_head.out_rg,
            local=_keeps_local(wl, t_embed.out_rg),
            cached_casts=e_casts + v_casts + h_casts + t_casts,
        )
        return [
            Stack(v_embed, 1),
            *v_layers,
            Stack(v_head, 1),
            Stack(t_embed, 1),
            *t_layers,
            Stack(t_head, 1),
        ]

    def _tower_stacks(
        self, wl: WorkloadSpec, w: Work, a: Arch, embed_rg: bool
    ) -> tuple[list[Stack], bool, int]:
        """A tower's layers; under LoRA the first one's input needs no gradient (frozen
        embeddings) and gets its own profile. Returns the stacks, whether the last layer's
        output requires grad and the bytes of the layers' cached weight casts."""
        first, cached = self._layer_block(wl, w, a, in_rg=embed_rg)
        if a.n_layers == 1 or first.out_rg == embed_rg:
            return [Stack(first, a.n_layers)], first.out_rg, cached * a.n_layers
        rest, _ = self._layer_block(wl, w, a, in_rg=first.out_rg)
        return [Stack(first, 1), Stack(rest, a.n_layers - 1)], rest.out_rg, cached * a.n_layers

    def simulate(self, wl: WorkloadSpec, task: str) -> Simulated:
        """The training step (forward, backward, optimizer) or one inference forward."""
        self.check(wl)
        stacks = self._stacks(wl)
        t = totals(stacks)
        param_bytes = t.param_bytes + self.buffer_bytes()
        inputs = self.input_bytes(wl.batch_size, wl.seq_len)
        if not wl.is_train:
            fp = forward_pass(stacks, wl, param_bytes=param_bytes, inputs=inputs, tied=False)
            return Simulated(
                candidates={"forward": fp.points},
                n_params=t.n_params,
                n_trainable=0,
                info=fp.info,
            )
        opt = optimizer_bytes(
            wl.optimizer or "none",
            trainable_shapes(stacks),
            t.grad_bytes,
            embedding_shapes=embedding_shapes(stacks),
        )
        view = rank_view_for(wl, stacks, tied=False, opt=opt) if is_distributed(wl) else None
        return training_step(
            stacks,
            wl,
            param_bytes=param_bytes,
            grad_bytes=t.grad_bytes,
            opt=opt,
            inputs=inputs,
            view=view,
            n_params=t.n_params,
            n_trainable=t.n_trainable,
        )


# ---------------------------------------------------------------------- pieces
def _keeps_local(wl: WorkloadSpec, rg: bool) -> bool:
    """Whether a tower's embedding output outlives the first layer only as a Python local
    (``CLIPEncoder.forward``'s ``inputs_embeds``, alive until the tower returns): under no_grad,
    or when it needs no gradient (LoRA: frozen embeddings) and no checkpoint keeps it. Otherwise
    the first layer saves it anyway."""
    return not wl.is_train or (not rg and wl.checkpointing == "none")


def _keep_local(o: Ops, wl: WorkloadSpec, x: Tensor) -> None:
    """Count :func:`_keeps_local`'s reference as one more tensor of the output's size (the
    tower's head block frees it)."""
    if _keeps_local(wl, x.rg):
        o.g.hold(o.new(x.numel, x.dtype))


def _cached_casts(o: Ops, wl: WorkloadSpec) -> list[Tensor]:
    """The weight casts autocast keeps in its cache until it exits (the end of the forward)
    where nothing else keeps them: casts of fp32 leaf parameters that require grad
    (``autocast_mode.cpp``, ``can_try_cache``), which model parameters do under no_grad too.
    Training saves them for backward, except in checkpointed layers (``run_block``)."""
    if not o.autocast or wl.is_train:
        return []
    return [  # under no_grad nothing requires grad in the graph: find the parameter casts
        n.outputs[0]
        for n in o.g.nodes
        if len(n.inputs) == 1
        and n.inputs[0].leaf
        and n.inputs[0].dtype == "f32"
        and len(n.outputs) == 1
        and n.outputs[0].dtype == o.cdtype
    ]


def _hold_cached_casts(o: Ops, wl: WorkloadSpec) -> int:
    """Hold :func:`_cached_casts` past the block (the text head frees them); their bytes."""
    casts = _cached_casts(o, wl)
    o.g.hold(*casts)
    return sum(t.n_bytes for t in casts)


def _input_requires_grad(o: Ops, wl: WorkloadSpec, t: Tensor) -> None:
    """peft under checkpointing calls ``enable_input_require_grads``: the output of each tower's
    input embedding (``token_embedding``, ``patch_embedding``) is made a leaf that requires
    grad; the autograd graph keeps it, and the gradient it accumulates, until the step ends."""
    if wl.lora_rank and wl.is_train and wl.checkpointing != "none" and not t.rg:
        t.rg = True
        o.g.hold(t)


def _act(o: Ops, x: Tensor, kind: str) -> Tensor:
    """``quick_gelu`` (``QuickGELUActivation``: ``x * sigmoid(1.702 * x)``): the scaled copy is
    freed, SigmoidBackward saves its result, the mul saves both factors. Other spellings as
    GPT-2's table."""
    if kind != "quick_gelu":
        return o.act(x, ACT_KIND.get(kind, "gelu"))
    (s,) = o.g.op([x], [(x.numel, x.dtype)])  # 1.702 * x
    (sig,) = o.g.op([s], [(x.numel, x.dtype)])
    o.save_outputs(sig)
    return o.mul(x, sig)


def _normalized(o: Ops, e: Tensor, rows: int) -> Tensor:
    """``e / pow(sum(pow(e, 2), -1), 0.5)`` (``_get_vector_norm``): pow runs in fp32 under
    autocast (a cast copy, saved), the sum keeps one value per row, the division promotes to
    the norm's dtype and saves both operands."""
    ef = o.fp32_op(e)
    (sq,) = o.g.op([ef], [(e.numel, ef.dtype)], saves=[ef])
    (s,) = o.g.op([sq], [(rows, ef.dtype)])
    (n,) = o.g.op([s], [(rows, s.dtype)], saves=[s])
    (out,) = o.g.op([e, n], [(e.numel, promote(e.dtype, n.dtype))], saves=[e, n])
    return out


def _cross_entropy(o: Ops, logits: Tensor, b: int) -> Tensor:
    """``cross_entropy(logits, arange(B))``: ``log_softmax`` (in fp32 under autocast: a cast
    copy first) saves its output; ``nll_loss`` returns the loss and ``total_weight``."""
    target = o.new(b, "i64")
    lf = o.fp32_op(logits)
    (logp,) = o.g.op([lf], [(lf.numel, lf.dtype)])
    o.save_outputs(logp)
    loss, _ = o.g.op([logp, target], [(1, logp.dtype), (1, logp.dtype)])
    return loss


#: ``CLIPModel`` with ``return_loss``.
CLIP = CustomFamily(name="clip", model_types=("clip",), program=ClipProgram)

__all__ = [
    "CLIP",
    "ClipProgram",
    "clip_towers",
]
