"""Decoder families declared over the block vocabulary, and the program that runs a declaration.

A chain program (what ``engine.py`` composes) has three blocks — ``embed`` (token/position
embeddings and the tensors every layer shares: rotary tables, masks), ``layer`` (one repeated
block; ``period`` > 1 when layers alternate) and ``head`` (final norm, LM head or classifier,
loss) — recorded on an :class:`~memfit.estimate.analytic.ops.Ops`. :class:`ChainProgram` holds
what every chain program shares; :class:`DecoderProgram` runs a :class:`DecoderFamily`:

    embed:  tokens (× sqrt(hidden) for ``scaled-tokens``), rotary tables, the mask attention reads
    layer:  ``residual`` composes ``attention`` (``blocks.attention_block``), ``mlp``
            (``mlp.mlp_block``) and ``norm``:
              pre-norm              x + attn(norm(x)), then x + mlp(norm(x))         (Llama)
              sandwich              x + norm(attn(norm(x))), likewise the MLP         (Gemma 2)
              parallel              x + attn(ln1(x)) + mlp(ln2(x))                    (GPT-NeoX;
                                    sequential when ``use_parallel_residual`` is false)
              parallel-shared-norm  x + attn(ln(x)) + mlp(ln(x)), residual dropouts   (Phi)
              post-norm             x + norm(attn(x)), then x + norm(mlp(x))          (OLMo 2)
    head:   norm, LM head (``lm_head_bias``), loss

A family that differs from another in a block is one :func:`declare` call
(``declare("qwen3", like=QWEN2, attention={"qk_norm": "rms"})``, ``families.py``); a family whose
code does something no block says subclasses :class:`DecoderProgram` (``program=``) and
overrides the method where it differs (GPT-2's learned positions, Falcon's fused projection).
The registry (``registry.py``) maps each ``model_type`` to its declaration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic import unsloth
from memfit.estimate.analytic.arch import Arch, read_config
from memfit.estimate.analytic.blocks import (
    NORMS,
    Attention,
    Shared,
    Work,
    apply_rotary,
    attend,
    cache_kv,
    eager_mask,
    keep_local,
    lm_head_and_loss,
    norm,
    project_out,
    project_qkv,
    rotary_tables,
)
from memfit.estimate.analytic.graph import Tensor
from memfit.estimate.analytic.mlp import Mlp, mlp_block
from memfit.estimate.analytic.ops import Ops

RESIDUALS = ("pre-norm", "sandwich", "parallel", "parallel-shared-norm", "post-norm")
EMBEDDINGS = ("tokens", "scaled-tokens")


class ChainProgram:
    """What every chain program shares: the config's ``use_cache``, one layer per period, the
    ``causal-lm`` task, ``input_ids`` as the inputs, no buffers."""

    period = 1
    tasks: tuple[str, ...] = ("causal-lm",)
    #: the model's main input is ``input_ids``: transformers' ``activation_checkpointing_enable``
    #: then calls ``enable_input_require_grads`` (``modeling_utils.py``, transformers 5.23), so
    #: under checkpointing the embedding output requires grad even where the embedding is frozen
    input_ids = True

    def __init__(self, a: Arch) -> None:
        self.a = a
        #: ``config.use_cache`` (default True): the causal LM returns a DynamicCache.
        self.use_cache = bool(a.extra.get("use_cache", True))

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
        """Module buffers, counted with the parameters."""
        return 0


@dataclass(frozen=True, kw_only=True)
class DecoderFamily:
    """A decoder family: the ``model_types`` it covers and its blocks (module docstring).
    ``program``: the class that runs it (a :class:`DecoderProgram` subclass where the family's
    code departs from the blocks). Its Arch is ``arch.read_config``'s view of the ModelSpec."""

    name: str
    model_types: tuple[str, ...]
    attention: Attention = field(default_factory=Attention)
    mlp: Mlp = field(default_factory=Mlp)
    norm: str = "rms"
    residual: str = "pre-norm"
    embedding: str = "tokens"
    lm_head_bias: bool = False
    tasks: tuple[str, ...] = ("causal-lm",)
    program: Callable[[Arch, DecoderFamily], Any] | None = None

    def __post_init__(self) -> None:
        problems = [
            f"{name} ({value!r}) must be one of {', '.join(allowed)}"
            for name, value, allowed in (
                ("norm", self.norm, NORMS),
                ("residual", self.residual, RESIDUALS),
                ("embedding", self.embedding, EMBEDDINGS),
            )
            if value not in allowed
        ]
        if not self.model_types:
            problems.append("model_types (()) must name at least one config model_type")
        if problems:
            raise SpecError(f"DecoderFamily {self.name!r}: " + "; ".join(problems))

    def make(self, a: Arch) -> Any:
        """The program that runs this family on ``a``."""
        return (self.program or DecoderProgram)(a, self)

    def read(self, config: dict[str, Any]) -> Arch:
        """The :class:`Arch` of a config.json of this family (its ModelSpec's view)."""
        return read_config(config, self.name)


@dataclass(frozen=True, kw_only=True)
class CustomFamily:
    """A family whose program is its own (an encoder, an encoder-decoder, two towers): the
    ``model_types`` it covers and its program class (built from the Arch; the Arch is
    ``arch.read_config``'s view of the ModelSpec). Its program composes the block vocabulary's
    pieces itself."""

    name: str
    model_types: tuple[str, ...]
    program: Callable[[Arch], Any]

    def __post_init__(self) -> None:
        if not self.model_types:
            raise SpecError(
                f"CustomFamily {self.name!r}: model_types (()) must name at least one model_type"
            )

    def make(self, a: Arch) -> Any:
        return self.program(a)

    def read(self, config: dict[str, Any]) -> Arch:
        return read_config(config, self.name)


def declare(
    name: str,
    *,
    like: DecoderFamily,
    model_types: tuple[str, ...] | None = None,
    **changes: Any,
) -> DecoderFamily:
    """A family that is ``like`` but for ``changes``; a block given as a dict changes only the
    fields it names (``attention={"qk_norm": "rms"}``). ``model_types`` defaults to ``(name,)``;
    the program is ``like``'s unless changed."""
    known = {f.name for f in fields(DecoderFamily)}
    if unknown := sorted(set(changes) - known):
        raise SpecError(
            f"declare({name!r}): {', '.join(unknown)} is not a DecoderFamily field "
            f"(fields: {', '.join(sorted(known))})"
        )
    for key, value in changes.items():
        if isinstance(value, dict):
            block = getattr(like, key)
            names = {f.name for f in fields(block)}
            if bad := sorted(set(value) - names):
                raise SpecError(
                    f"declare({name!r}): {', '.join(bad)} is not a field of "
                    f"{type(block).__name__} (fields: {', '.join(sorted(names))})"
                )
            changes[key] = replace(block, **value)
    return replace(like, name=name, model_types=model_types or (name,), **changes)


class DecoderProgram(ChainProgram):
    """Runs a :class:`DecoderFamily` (module docstring). Subclasses override the step where
    their family's code departs from the blocks: ``embed_tokens``, ``embed_masks``,
    ``shared_for_layer``, ``attention_block``, ``layer``, ``head``."""

    def __init__(self, a: Arch, family: DecoderFamily) -> None:
        super().__init__(a)
        self.family = family
        self.tasks = family.tasks

    # ------------------------------------------------------------------ sizes
    def buffer_bytes(self, precision: str) -> int:
        """The rotary ``inv_freq`` buffer (fp32, D/2)."""
        rd = self.family.attention.table_dim(self.a)
        return 4 * (rd // 2) * 2 if rd else 0

    @property
    def window(self) -> int | None:
        """The sliding attention window, where the config enables one."""
        return self.family.attention.window_of(self.a)

    def mask_dtype(self, w: Work, x_dtype: str) -> str | None:
        """The (B, 1, S, S) mask transformers builds: an additive float mask for eager attention;
        for SDPA a bool mask only when a sliding window cuts into the sequence (else None and
        ``is_causal``)."""
        if w.q_len <= 1:
            return None
        if w.impl == "eager":
            return x_dtype
        if w.kv_len != w.q_len:  # a chunk of a chunked prefill: no ``is_causal`` shortcut
            return "bool"
        if self.window is not None and w.kv_len > self.window:
            return "bool"
        return None

    # ------------------------------------------------------------------ embed
    def embed_tokens(self, o: Ops, w: Work) -> Tensor:
        """The first layer's input; ``inputs_embeds`` is a local of ``*Model.forward``."""
        a = self.a
        x = o.embedding(w.tokens, a.vocab, a.hidden)
        keep_local(o, w, x)
        if self.family.embedding == "scaled-tokens":
            x = o.unary(x)  # * normalizer (sqrt(hidden))
        o.g.hold(x)
        return x

    def embed_masks(self, o: Ops, w: Work, shared: Shared, x_dtype: str) -> None:
        """The mask the model builds once for every layer. SDPA's sliding-window bool mask of
        an inference pass is one (1, 1, S, S) mask expanded over the batch (stride 0: traced,
        transformers 5.23's ``sdpa_mask``; ``flash``: memfit's trace runs FlashAttention under
        the SDPA model, whose mask is the same), so it holds S x S bytes, not B x S x S (Falcon's
        ``allow_is_causal_skip=False`` causal mask too: ``families_falcon.py``); the
        efficient kernel still widens it to B x S x S (``attention.py``). Training keeps the
        batch-sized mask (its grid rows were measured with it: docs/accuracy.md, "Inference on
        the default engine")."""
        dtype = self.mask_dtype(w, x_dtype)
        sliding = self.window is not None and w.kv_len > self.window and w.kv_len == w.q_len
        if dtype == "bool" and sliding and not w.train and w.impl in ("sdpa", "flash"):
            shared.mask = o.new(w.q_len * w.kv_len, dtype)
            o.g.hold(shared.mask)
        elif dtype:
            shared.mask = eager_mask(o, w, dtype)

    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        x = self.embed_tokens(o, w)
        shared = Shared()
        rd = self.family.attention.table_dim(self.a)
        if rd:
            shared.cos, shared.sin = rotary_tables(o, w, rd, x.dtype)
        self.embed_masks(o, w, shared, x.dtype)
        return x, shared

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        shared = Shared()
        rd = self.family.attention.table_dim(self.a)
        if rd:
            n = w.positions * rd  # the positions of this pass's tokens
            shared.cos, shared.sin = o.g.external(n, x_dtype), o.g.external(n, x_dtype)
        dtype = self.mask_dtype(w, x_dtype)
        if dtype:
            shared.mask = o.g.external(w.batch * w.q_len * w.kv_len, dtype)
        return shared

    # ------------------------------------------------------------------ layer
    def norm(self, o: Ops, x: Tensor) -> Tensor:
        return norm(o, x, self.a.hidden, self.family.norm)

    def attention_block(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """The self-attention block up to its output projection — the one rotary (or
        learned-position) q/k/cache/attention core: q/k/v (and q/k norms), rotary q and k, the
        KV cache, the core, the output projection; then the attention module returns and its
        locals (q, k, v and what the layout keeps) may go. Subclasses replace a step:
        ``project_qkv``, ``attend``, ``project_out``."""
        fused = self.unsloth_kernels(o)
        if fused is not None and fused["qkv"]:
            q, k, v = self.unsloth_qkv(o, x)
        else:
            q, k, v = self.project_qkv(o, x)
        if fused is not None and self.family.attention.rot_dim(self.a) == self.a.head_dim:
            q, k = unsloth.rope_in_place(o, q), unsloth.rope_in_place(o, k)
        else:
            q, k = apply_rotary(o, q, k, self.a, self.family.attention, sh)
        k, v = cache_kv(o, w, k, v)
        out = self.attend(o, q, k, v, w, sh)
        if fused is not None and fused["o"]:
            out = unsloth.lora_o(
                o, out, self.a.q_dim, self.a.hidden, self.family.attention.out_name
            )
        else:
            out = self.project_out(o, out)
        o.release_locals(q, k, v)
        return out

    def unsloth_kernels(self, o: Ops) -> dict[str, bool] | None:
        """Which of Unsloth's kernels run this layer (``unsloth.kernels_applied``), None where
        transformers' modules do (``--kernels hf``, inference, a model Unsloth runs otherwise)."""
        if o.kernels != "unsloth" or type(self) is not DecoderProgram:
            return None
        a, spec = self.a, self.family.attention
        applied, _ = unsloth.kernels_applied(
            a.model_type,
            lora=o.lora,
            lora_dropout=o.lora_dropout,
            qkv_bias=a.qkv_bias if spec.qkv_bias is None else spec.qkv_bias,
            o_bias=a.o_bias if spec.out_bias is None else spec.out_bias,
            mlp_bias=a.mlp_bias if self.family.mlp.bias is None else self.family.mlp.bias,
        )
        return applied

    def unsloth_qkv(self, o: Ops, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``LoRA_QKV``, then the q / k norms (Qwen3: ``fast_rms_layernorm`` on each head)."""
        a, spec = self.a, self.family.attention
        q, k, v = unsloth.lora_qkv(o, x, a.hidden, a.q_dim, a.kv_dim, spec.names)
        if spec.qk_norm:
            whole = spec.qk_norm_over == "all"
            q = norm(o, q, a.q_dim if whole else a.head_dim, spec.qk_norm)
            k = norm(o, k, a.kv_dim if whole else a.head_dim, spec.qk_norm)
        return q, k, v

    def project_qkv(self, o: Ops, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return project_qkv(o, x, self.a, self.family.attention)

    def attend(self, o: Ops, q: Tensor, k: Tensor, v: Tensor, w: Work, sh: Shared) -> Tensor:
        return attend(o, q, k, v, self.a, self.family.attention, w, sh)

    def project_out(self, o: Ops, x: Tensor) -> Tensor:
        return project_out(o, x, self.a, self.family.attention)

    def mlp(self, o: Ops, x: Tensor) -> Tensor:
        fused = self.unsloth_kernels(o)
        spec = self.family.mlp
        if fused is not None and fused["mlp"] and spec.kind == "gated":
            return unsloth.lora_mlp(o, x, self.a.hidden, self.a.ffn, spec.names)
        return mlp_block(o, x, self.a, spec)

    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        residual = self.family.residual
        if residual == "pre-norm":
            return self.pre_norm_layer(o, x, w, sh)
        if residual == "sandwich":
            return self.sandwich_layer(o, x, w, sh)
        if residual == "parallel":
            return self.parallel_layer(o, x, w, sh)
        if residual == "post-norm":
            return self.post_norm_layer(o, x, w, sh)
        return self.shared_norm_layer(o, x, w, sh)

    def post_norm_layer(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """``Olmo2DecoderLayer``: each sub-block reads the residual stream itself; its output,
        the norm's argument, lives until that norm returns."""
        att = self.attention_block(o, x, w, sh)
        y = self.norm(o, att)
        o.g.touch(att)
        x = o.add(x, y)
        m = self.mlp(o, x)
        y = self.norm(o, m)
        o.g.touch(m)
        return o.add(x, y)

    def pre_norm_layer(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """``LlamaDecoderLayer``: each sub-block's input (the norm output) is the caller's
        ``hidden_states`` until the sub-block returns."""
        hn = self.norm(o, x)
        y = self.attention_block(o, hn, w, sh)
        o.g.touch(hn)
        x = o.add(x, y)
        hn = self.norm(o, x)
        y = self.mlp(o, hn)
        o.g.touch(hn)
        return o.add(x, y)

    def sandwich_layer(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """``Gemma2DecoderLayer``: each sub-block's input (the pre-norm output) lives until the
        sub-block returns, and its output, the post-norm's argument, until that norm returns."""
        hn = self.norm(o, x)
        att = self.attention_block(o, hn, w, sh)
        o.g.touch(hn)
        y = self.norm(o, att)
        o.g.touch(att)
        x = o.add(x, y)
        hn = self.norm(o, x)
        m = self.mlp(o, hn)
        o.g.touch(hn)
        y = self.norm(o, m)
        o.g.touch(m)
        return o.add(x, y)

    def parallel_layer(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """``GPTNeoXLayer``: the first LayerNorm's output is the attention's argument, alive
        until the attention returns; residual dropout on both branches."""
        a = self.a
        hn = self.norm(o, x)
        out = self.attention_block(o, hn, w, sh)
        o.g.touch(hn)
        out = o.dropout(out, a.resid_dropout)
        if a.extra.get("use_parallel_residual", True):
            m = o.dropout(self._mlp_of_norm(o, x), a.resid_dropout)
            return o.add(o.add(m, out), x)
        x = o.add(out, x)
        m = o.dropout(self._mlp_of_norm(o, x), a.resid_dropout)
        return o.add(m, x)

    def _mlp_of_norm(self, o: Ops, x: Tensor) -> Tensor:
        """``self.mlp(self.post_attention_layernorm(x))``: the norm output is the MLP's
        argument, alive until the MLP returns."""
        hn = self.norm(o, x)
        m = self.mlp(o, hn)
        o.g.touch(hn)
        return m

    def shared_norm_layer(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """``PhiDecoderLayer``: one norm feeding attention and MLP; residual dropout on both
        branches; the norm output is the layer's ``hidden_states`` until the sum rebinds it."""
        a = self.a
        hn = self.norm(o, x)
        out = o.dropout(self.attention_block(o, hn, w, sh), a.resid_dropout)
        m = o.dropout(self.mlp(o, hn), a.resid_dropout)
        out = o.add(o.add(out, m), x)
        o.g.touch(hn)
        return out

    # ------------------------------------------------------------------ head
    def head(self, o: Ops, x: Tensor, w: Work) -> list[Tensor]:
        return lm_head_and_loss(o, self.norm(o, x), w, self.a, bias=self.family.lm_head_bias)


__all__ = [
    "EMBEDDINGS",
    "RESIDUALS",
    "ChainProgram",
    "CustomFamily",
    "DecoderFamily",
    "DecoderProgram",
    "declare",
]
