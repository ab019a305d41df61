"""Encoder families: BERT and RoBERTa (post-LayerNorm, sequence classification head)."""

from __future__ import annotations

from memfit.errors import NotModelledError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import attention
from memfit.estimate.analytic.blocks import Shared, Work, attn_shape
from memfit.estimate.analytic.decoder import ChainProgram, CustomFamily
from memfit.estimate.analytic.graph import Tensor
from memfit.estimate.analytic.mlp import ACT_KIND
from memfit.estimate.analytic.ops import Ops, promote

#: Labels of the sequence-classification head memfit builds (trace/build.py: ``num_labels = 2``).
N_LABELS = 2


class BertProgram(ChainProgram):
    """``BertLayer``: q/k/v projections (views into SDPA), dense + dropout + LayerNorm(x + ·),
    GELU MLP; embeddings = word + token type + position, LayerNorm, dropout. Head:
    ``BertForSequenceClassification`` (pooler on the first token, tanh, dropout, classifier,
    cross-entropy)."""

    tasks = ("seq-cls",)

    def __init__(self, a: Arch) -> None:
        super().__init__(a)
        self.use_cache = False

    @property
    def roberta(self) -> bool:
        return self.a.model_type == "roberta"

    def buffer_bytes(self, precision: str) -> int:
        """``position_ids`` and ``token_type_ids`` buffers: (1, max_position_embeddings) int64."""
        return 2 * 8 * self.a.n_positions

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        n = w.tokens * a.hidden
        first_frozen = o.freeze_token_embedding or o.lora is not None  # freeze_layers or LoRA
        if self.roberta:  # create_position_ids_from_input_ids: ne, int, cumsum, type_as, *, +
            ids = [o.new(w.tokens, dt) for dt in ("bool", "i32", "i32", "i32", "i32", "i64")]
            o.g.touch(*ids)
        tok = o.embedding(w.tokens, a.vocab, a.hidden)
        input_requires_grad(o, w, tok)
        tt = o.embedding(w.tokens, int(a.extra.get("type_vocab_size", 2)), a.hidden)
        x = o.add(tok, tt)
        o.g.touch(tok)  # ``inputs_embeds`` local
        pos = o.embedding(w.q_len if not self.roberta else w.tokens, a.n_positions, a.hidden)
        x = o.add(x, pos)
        x = o.dropout(o.layer_norm(x, a.hidden), a.emb_dropout)
        o.g.hold(x)
        self._embedding_local = keep_output_local(
            o, w, x, first_layer_frozen=first_frozen and not x.rg
        )
        del n
        return x, Shared()

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        return Shared()

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        q = o.linear(x, h, h, bias=True, name="query")
        k = o.linear(x, h, h, bias=True, name="key")
        v = o.linear(x, h, h, bias=True, name="value")
        att = attention(
            o,
            q,
            k,
            v,
            attn_shape(a, w),
            impl=w.impl,
            dropout_p=a.attn_dropout,
            eager_softmax="input",
        )
        o.release_locals(q, k, v)
        out = o.dropout(o.linear(att, h, h, bias=True, name="dense"), a.resid_dropout)
        x = o.layer_norm(o.add(out, x), h)
        # Until that LayerNorm returns: BertAttention's ``self_outputs`` and BertSelfOutput's
        # ``hidden_states``; likewise BertLayer's ``intermediate_output`` and BertOutput's.
        o.g.touch(att, out)
        inter = o.act(o.linear(x, h, a.ffn, bias=True, name="dense"), ACT_KIND.get(a.act, "gelu"))
        m = o.dropout(o.linear(inter, a.ffn, h, bias=True, name="dense"), a.resid_dropout)
        out = o.layer_norm(o.add(m, x), h)
        o.g.touch(inter, m, x)  # and BertLayer's ``attention_output`` (x) until it returns
        return out

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        a = self.a
        first = o.slice(x, w.batch, w.tokens)  # hidden_states[:, 0]
        pooled = o.linear(first, a.hidden, a.hidden, bias=True, name="dense")
        (pooled,) = o.g.op([pooled], [(pooled.numel, pooled.dtype)])  # tanh saves its output
        o.save_outputs(pooled)
        if getattr(self, "_embedding_local", False):  # BertModel.forward returns: its local
            o.g.touch(o.g.input(w.tokens * a.hidden, o.pdtype, rg=False))  # goes
        pooled = o.dropout(pooled, a.resid_dropout)
        logits = o.linear(pooled, a.hidden, N_LABELS, bias=True, name="classifier")
        o.g.hold(logits)
        if not w.train:
            return [logits]
        lf = o.fp32_op(logits)
        (logp,) = o.g.op([lf], [(lf.numel, "f32" if o.autocast else lf.dtype)])
        o.save_outputs(logp)
        (loss,) = o.g.op([logp], [(1, logp.dtype)])
        o.g.hold(loss)
        return [logits, loss]


class ViTProgram(BertProgram):
    """``ViTForImageClassification``: a patch convolution (pixels cast to the weights' dtype and
    saved by the conv), a CLS token and learned positions; pre-LayerNorm layers (q/k/v with bias,
    SDPA, o_proj, GELU MLP); the classifier reads the CLS token. The sequence is
    ``(image_size / patch_size)² + 1`` whatever ``seq_len`` says."""

    tasks = ("image-cls",)
    input_ids = False  # pixel_values

    @property
    def image(self) -> tuple[int, int, int]:
        e = self.a.extra
        return (
            int(e.get("image_size", 224)),
            int(e.get("patch_size", 16)),
            int(e.get("num_channels", 3)),
        )

    @property
    def n_labels(self) -> int:
        """The classifier's width: the config's own labels, as ``PreTrainedConfig`` counts them
        (the ``id2label`` entries, else ``num_labels``, else 2). Unlike the sequence-classification
        task (trace/build.py sets ``num_labels = 2``), the image-classification model is built
        with the config's labels: 1000 for the ImageNet checkpoints."""
        e = self.a.extra
        labels = e.get("id2label")
        n = len(labels) if isinstance(labels, dict) else int(e.get("num_labels", 2))
        if n < 1:  # ``nn.Identity()`` for the classifier: a head this program does not write
            raise NotModelledError(
                f"ViT with num_labels = {n} (no classifier) is not modelled by the analytic "
                "engine; use --engine trace",
                engine="analytic",
            )
        return n

    def q_len(self, seq_len: int) -> int:
        size, patch, _ = self.image
        return (size // patch) ** 2 + 1

    def input_bytes(self, batch: int, seq_len: int, train: bool) -> int:
        size, _, channels = self.image
        return batch * channels * size * size * 4 + (batch * 8 if train else 0)

    def buffer_bytes(self, precision: str) -> int:
        return 0

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        size, patch, channels = self.image
        n_patches = (size // patch) ** 2
        pixels = o.g.external(w.batch * channels * size * size, "f32")
        px = o.cast(pixels, o.pdtype)
        frozen = o.freeze_token_embedding  # get_input_embeddings() is the patch projection
        o.freeze_token_embedding = False
        wconv = o.weight(a.hidden, channels, patch, patch, trainable=not frozen)
        bconv = o.weight(a.hidden, trainable=not frozen)
        xin, wi = o.autocast_input(px), o.autocast_weight(wconv)
        (conv,) = o.g.op(
            [xin, wi, o.autocast_weight(bconv)],
            [(w.batch * n_patches * a.hidden, xin.dtype)],
            saves=[xin, wi],
        )
        input_requires_grad(o, w, conv)  # get_input_embeddings(): the patch projection
        cls = o.weight(a.hidden)
        pos = o.weight(n_patches + 1, a.hidden)
        (x,) = o.g.op([cls, conv], [(w.tokens * a.hidden, promote(conv.dtype, cls.dtype))])  # cat
        x = o.dropout(o.add(x, pos), a.emb_dropout)
        o.g.hold(x)
        # ViTModel.forward's locals ``embedding_output`` (with LoRA nothing saves it: the frozen
        # embeddings make it need no gradient) and ``pixel_values = pixel_values.to(dtype)`` (a
        # copy outside fp32; the convolution saves it only with a trainable kernel)
        self._model_locals = (
            [x.numel]
            if keep_output_local(o, w, x, first_layer_frozen=bool(o.lora) and not x.rg)
            else []
        )
        if px is not pixels and keep_output_local(o, w, px, first_layer_frozen=not wconv.rg):
            self._model_locals.append(px.numel)
        return x, Shared()

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        a = self.a
        h = a.hidden
        hn = o.layer_norm(x, h)
        q = o.linear(hn, h, h, bias=True, name="q_proj")
        k = o.linear(hn, h, h, bias=True, name="k_proj")
        v = o.linear(hn, h, h, bias=True, name="v_proj")
        out = attention(o, q, k, v, attn_shape(a, w), impl=w.impl, dropout_p=a.attn_dropout)
        out = o.linear(out, h, h, bias=True, name="o_proj")
        # ``layernorm_before``'s output is the attention's argument: alive until it returns
        o.release_locals(q, k, v, hn)
        x = o.add(o.dropout(out, a.resid_dropout), x)
        hn = o.layer_norm(x, h)
        m = o.act(o.linear(hn, h, a.ffn, bias=True, name="fc1"), "gelu")
        m = o.linear(m, a.ffn, h, bias=True, name="fc2")
        o.g.touch(hn)  # likewise ``layernorm_after``'s, the MLP's argument
        return o.add(o.dropout(m, a.resid_dropout), x)

    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        a = self.a
        x = o.layer_norm(x, a.hidden)
        for numel in getattr(self, "_model_locals", []):  # ViTModel.forward returns
            o.g.touch(o.g.input(numel, o.pdtype, rg=False))
        first = o.slice(x, w.batch, w.tokens)
        logits = o.linear(first, a.hidden, self.n_labels, bias=True, name="classifier")
        # ``sequence_output`` (last_hidden_state) is a local of ViTForImageClassification.forward,
        # not part of its output (ImageClassifierOutput: loss, logits): alive until the forward
        # returns, then only through the classifier's saved input, a view of it (was held to
        # the end: +0.85 % on ViT-base's training peak)
        o.g.touch(x)
        o.g.hold(logits)
        if not w.train:
            return [logits]
        lf = o.cast(logits, "f32")
        (logp,) = o.g.op([lf], [(lf.numel, "f32")])
        o.save_outputs(logp)
        (loss,) = o.g.op([logp], [(1, "f32")])
        o.g.hold(loss)
        return [logits, loss]


def input_requires_grad(o: Ops, w: Work, t: Tensor) -> None:
    """LoRA under checkpointing: ``gradient_checkpointing_enable`` and peft call
    ``enable_input_require_grads`` (transformers 5.23 ``modeling_utils.py``; peft 0.21
    ``peft_model.py``, ``_prepare_model_for_gradient_checkpointing``), whose forward hook makes
    the frozen input embedding's output require grad: the ops after it (BERT's LayerNorm and
    dropout, ViT's position add and dropout) are recorded and save their inputs, and the leaf
    keeps the gradient it accumulates until the step ends. Found by the fast-path grid
    (issue 32): roberta-base / vit-base ``lora_ckpt`` were 1.4 % / 1.2 % under the trace."""
    if o.lora is not None and w.train and w.checkpointed and not t.rg:
        t.rg = True
        o.g.hold(t)


def keep_output_local(o: Ops, w: Work, x: Tensor, *, first_layer_frozen: bool = False) -> bool:
    """``embedding_output`` stays referenced by a local of ``*Model.forward`` until the forward
    returns. Training saves it anyway (the first layer's linears) unless that layer is frozen
    (``freeze_layers``, or LoRA's frozen base weights: what they save is the weights, or LoRA's
    fp32 copy); then, and under no_grad, it is one more tensor of its size alive through the
    forward: counted by holding a copy (returns whether it did)."""
    if (not w.train or first_layer_frozen) and x.dtype != "i64":
        o.g.hold(o.new(x.numel, x.dtype))
        return True
    return False


#: ``BertForSequenceClassification`` / ``RobertaForSequenceClassification``.
BERT = CustomFamily(name="bert", model_types=("bert", "roberta"), program=BertProgram)
#: ``ViTForImageClassification``.
VIT = CustomFamily(name="vit", model_types=("vit",), program=ViTProgram)

__all__ = ["BERT", "N_LABELS", "VIT", "BertProgram", "ViTProgram", "keep_output_local"]
