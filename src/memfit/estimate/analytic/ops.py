"""Tensor ops with PyTorch's rules for what they allocate and what autograd saves.

Each method records one op on a :class:`~memfit.estimate.analytic.graph.Graph`. The rules come from
PyTorch's derivatives (``tools/autograd/derivatives.yaml``: which inputs/outputs a backward formula
uses is what ``SavedVariable`` keeps) and CUDA autocast's cast policy
(``aten/src/ATen/autocast_mode.cpp``): matmuls run in the autocast dtype (inputs cast, weight casts
cached for leaf parameters until autocast exits), ops on the fp32 list (``layer_norm``, ``pow``,
``rsqrt``, ``softmax``/``log_softmax`` with no dtype, losses) run in fp32.
"""

from __future__ import annotations

from memfit.estimate.analytic.graph import DTYPE_BYTES, Graph, Tensor
from memfit.estimate.analytic.quant_ops import lora_on_quantized, quantized_linear, quantizes
from memfit.estimate.cuda_reduce import reduce_staging_bytes, rounded
from memfit.spec import PRECISION_RULES

#: This engine's names of torch's dtypes.
_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
#: Storage dtype of parameters and the dtype matmuls compute in, per precision as run
#: (``WorkloadSpec.run_precision``), from the one table :data:`memfit.spec.PRECISION_RULES`.
PARAM_DTYPE = {name: _NAMES[r.params] for name, r in PRECISION_RULES.items()}
COMPUTE_DTYPE = {name: _NAMES[r.compute] for name, r in PRECISION_RULES.items()}
HALF = ("bf16", "f16")


def sum_to_staging_bytes(n_rows: int, n_cols: int) -> int:
    """Blocks CUDA's reduction kernel takes while summing an (``n_rows``, ``n_cols``) gradient
    over its rows into a broadcast input's (``n_cols``) gradient: a bias, an RMSNorm weight
    (``gpu_reduce_kernel``'s staging buffer and semaphores, :mod:`memfit.estimate.cuda_reduce`;
    autograd's ``sum_to`` runs ``sum``). Same rule as the trace's CUDA emulation."""
    if n_rows <= 1:
        return 0
    buf, sem = reduce_staging_bytes((n_rows, n_cols), (0,))
    return rounded(buf) + rounded(sem)


def promote(a: str, b: str) -> str:
    """Type promotion of two floating tensors (bf16 with fp16 does not occur here)."""
    return a if DTYPE_BYTES[a] >= DTYPE_BYTES[b] else b


class Ops:
    """Op recorder bound to one precision. ``lora``: (rank, targets) or None; a linear whose
    name is a target gets a peft LoRA adapter (base weight frozen, adapters kept in fp32)."""

    def __init__(
        self,
        g: Graph,
        *,
        precision: str,
        train: bool,
        frozen: bool = False,
        lora: tuple[int, tuple[str, ...] | str] | None = None,
    ) -> None:
        self.g = g
        self.pdtype = PARAM_DTYPE[precision]
        self.cdtype = COMPUTE_DTYPE[precision]
        self.autocast = PRECISION_RULES[precision].autocast
        self.train = train
        self.frozen = frozen or not train
        self.lora = lora
        #: peft's ``LoraConfig.lora_dropout``: above 0 an ``nn.Dropout`` on each adapter's
        #: input (:meth:`lora_dropout_of`); 0: peft's ``nn.Identity``
        self.lora_dropout = 0.0
        self.cast_cache: dict[int, Tensor] = {}
        #: The embedding weight is the LM head's (tied): its gradient arrives second and
        #: AccumulateGrad sums it out of place (the old, new and summed tensors coexist).
        self.tied_embedding = False
        #: ``freeze_layers``: the input embeddings (the first embedding looked up) are frozen.
        self.freeze_token_embedding = False
        #: ``zero_grad(set_to_none=False)``: parameters hold gradients when backward starts.
        self.existing_grads = False
        #: The LM head's weight is the (tied) embedding's: trainable only if the embedding is.
        self.lm_head_trainable = True
        #: peft ``modules_to_save`` roles (``embed``: the input embedding, ``head``: the LM
        #: head): a frozen original and a trainable copy of each (``ModulesToSaveWrapper``)
        self.saved_modules: frozenset[str] = frozenset()
        #: Tensors a Python local keeps until the current module returns (``touch`` them then).
        self.locals: list[Tensor] = []
        #: Tensors a local of the running decoder layer keeps until the layer returns: the
        #: eager attention weights of ``hidden_states, _ = self.self_attn(...)`` (the engine
        #: touches them after each layer, ``release_layer_locals``).
        self.layer_locals: list[Tensor] = []
        #: ``--quant`` format of this block's Linear layers (None: unquantized), its group size,
        #: whether the block is one of the repeated layers (GPTQ/AWQ quantize only those) and the
        #: batch size (AWQ's backward repeats its weight per sequence).
        self.quant: str | None = None
        self.quant_group_size = 128
        #: peft's ``prepare_model_for_kbit_training``: the block runs in fp32 around quantized
        #: layers loaded (and computing) in this dtype; None: the precision's own
        self.quant_dtype: str | None = None
        self.in_repeated_block = False
        #: MoE experts stored in ``quant`` too (False: the checkpoint's are dequantized at load)
        self.quant_experts = True
        self.batch = 1
        #: inference under autocast: bytes of the weight casts held in autocast's cache, and
        #: whether an earlier pass of the same generation made them already
        self.held_cast_bytes = 0
        self.casts_exist = False
        #: Tensors made outside this block that its checkpoint keeps as arguments and is the
        #: last to let go of (T5's position bias: every later layer's checkpoint holds it, layer
        #: 1's backward comes last): freed with the checkpoint (``Graph.recomputation``).
        self.checkpoint_args: list[Tensor] = []
        #: False while a layer multiplies by a view of its weight (FalconLinear's
        #: ``input @ self.weight.T``): autocast caches casts of leaf tensors only.
        self.cache_weight_casts = True
        #: whose kernels run the block (``WorkloadSpec.kernels``; ``unsloth`` only where
        #: ``unsloth.UNSLOTH_MODEL_TYPES`` has the model, set by ``compose``)
        self.kernels = "hf"

    def release_locals(self, *more: Tensor) -> None:
        """The module returns: its locals (and ``more``) may be freed after this point."""
        self.g.touch(*more, *self.locals)
        self.locals = []

    def release_layer_locals(self) -> None:
        """The decoder layer returns: the tensors its locals kept may be freed after this point."""
        self.g.touch(*self.layer_locals)
        self.layer_locals = []

    # ------------------------------------------------------------------ basics
    def weight(self, *shape: int, trainable: bool = True, saved: bool = False) -> Tensor:
        """A parameter in the precision's dtype; frozen in a frozen block and, with LoRA, all
        base weights are (peft's ``mark_only_lora_as_trainable``). ``saved``: the weight of a
        module peft's ``modules_to_save`` wraps: the frozen original stays and a trainable
        ``copy.deepcopy`` of it (same dtype) is what the forward uses."""
        numel = 1
        for d in shape:
            numel *= d
        if saved and self.train:
            self.g.param(numel, self.pdtype, trainable=False, shape=tuple(shape))
            return self.g.param(numel, self.pdtype, trainable=True, shape=tuple(shape))
        train = trainable and not self.frozen and self.lora is None
        return self.g.param(numel, self.pdtype, trainable=train, shape=tuple(shape))

    def cast(self, x: Tensor, dtype: str) -> Tensor:
        """``x.to(dtype)``: a copy when the dtype changes (ToCopyBackward saves nothing)."""
        if x.dtype == dtype:
            return x
        return self.g.op([x], [(x.numel, dtype)])[0]

    def new(self, numel: int, dtype: str) -> Tensor:
        """A tensor made from no differentiable input (ids, masks, position tables)."""
        return self.g.op([], [(numel, dtype)])[0]

    def fp32_op(self, x: Tensor) -> Tensor:
        """Autocast's fp32 policy: a half input is cast to fp32 first."""
        return self.cast(x, "f32") if self.autocast else x

    def autocast_input(self, x: Tensor) -> Tensor:
        """Autocast's lower-precision policy for an activation input."""
        return self.cast(x, self.cdtype) if self.autocast and x.dtype == "f32" else x

    def autocast_weight(self, w: Tensor) -> Tensor:
        """Autocast's cast of a weight. Casts of leaf tensors that require grad are cached
        until autocast exits (``can_try_cache``): trainable parameters in training, and under
        ``no_grad`` every parameter (they still require grad): there the cache alone keeps
        the casts, so they are held, and a generation's later passes find them made
        (``casts_exist``)."""
        if not self.autocast or w.dtype != "f32":
            return w
        if not (self.cache_weight_casts and w.leaf and (w.rg or not self.train)):
            return self.cast(w, self.cdtype)
        key = id(w)
        if key not in self.cast_cache:
            if self.train:
                self.cast_cache[key] = self.cast(w, self.cdtype)
            elif self.casts_exist:
                self.cast_cache[key] = self.g.external(w.numel, self.cdtype)
            else:
                cast = self.cast(w, self.cdtype)
                self.g.hold(cast)
                self.held_cast_bytes += cast.n_bytes
                self.cast_cache[key] = cast
        return self.cast_cache[key]

    # ------------------------------------------------------------------ layers
    def linear(
        self,
        x: Tensor,
        n_in: int,
        n_out: int,
        *,
        bias: bool = False,
        name: str = "",
        trainable: bool = True,
        conv1d: bool = False,
        late_staging: bool = False,
    ) -> Tensor:
        """``F.linear``: MmBackward/AddmmBackward save the input (for the weight's gradient) and
        the weight (for the input's); the output is in the compute dtype. ``conv1d``: GPT-2's
        ``Conv1D``, an addmm with an (in, out) weight. ``late_staging``: in a checkpointed block
        the bias gradient's staging comes after the recomputed input is freed
        (``Node.late_staging``; set by the programs validated with it: Whisper's)."""
        adapted = self._lora_applies(name)
        if quantizes(self.quant, name, in_repeated_block=self.in_repeated_block):
            out = quantized_linear(self, x, n_in, n_out, bias=bias)
            return lora_on_quantized(self, x, out, n_in, n_out) if adapted else out
        shape = (n_in, n_out) if conv1d else (n_out, n_in)
        saved = name == "lm_head" and "head" in self.saved_modules
        w = self.weight(*shape, trainable=trainable and not adapted, saved=saved)
        b = self.weight(n_out, trainable=trainable and not adapted, saved=saved) if bias else None
        xi, wi = self.autocast_input(x), self.autocast_weight(w)
        bi = self.autocast_weight(b) if b is not None else None
        inputs = [xi, wi] + ([bi] if bi is not None else [])
        rows = x.numel // n_in
        (out,) = self.g.op(
            inputs,
            [(rows * n_out, xi.dtype)],
            saves=[xi if wi.rg else None, wi if xi.rg else None],  # type: ignore[list-item]
            matmul=True,
            mm=bi is None,  # with a bias: addmm
            # AddmmBackward's bias gradient: the incoming gradient summed over the rows
            bwd_workspace=sum_to_staging_bytes(rows, n_out) if bi is not None and bi.rg else 0,
            late_staging=late_staging,
        )
        if adapted:
            out = self.lora_default(x, out, n_in, n_out)
        return out

    def _lora_applies(self, name: str) -> bool:
        if self.lora is None or not self.train or not name:
            return False
        targets = self.lora[1]
        if targets == "all-linear":  # peft: every linear but the output embedding (LM head)
            return name != "lm_head"
        return name in targets

    def lora_adapters(self, n_in: int, n_out: int) -> tuple[Tensor, Tensor]:
        """peft's fp32 ``lora_A`` (r, n_in) and ``lora_B`` (n_out, r) of one layer, trainable
        (peft ``autocast_adapter_dtype``), in that order."""
        assert self.lora is not None
        r = self.lora[0]
        a = self.g.param(n_in * r, "f32", trainable=True, shape=(r, n_in))
        b = self.g.param(r * n_out, "f32", trainable=True, shape=(n_out, r))
        return a, b

    def lora_default(self, x: Tensor, base: Tensor, n_in: int, n_out: int) -> Tensor:
        """peft ``lora.Linear.forward``: ``result + lora_B(lora_A(dropout(x.to(fp32)))) *
        scaling``, cast back to the base output's dtype. Adapters are fp32 (peft
        ``autocast_adapter_dtype``); ``_cast_input_dtype`` copies a half ``x`` to fp32 under
        autocast too, the dropout (if any) runs on that fp32 copy, and autocast's ``F.linear``
        then casts the result back to the half dtype."""
        assert self.lora is not None
        r = self.lora[0]
        a, bw = self.lora_adapters(n_in, n_out)
        xf = self.cast(x, "f32")
        xa = self.autocast_input(self.lora_dropout_of(xf))
        xa_w, b_w = self.autocast_weight(a), self.autocast_weight(bw)
        (h,) = self.g.op(
            [xa, xa_w], [(x.numel // n_in * r, xa.dtype)], saves=[xa, xa_w], matmul=True, mm=True
        )
        (y,) = self.g.op(
            [h, b_w], [(x.numel // n_in * n_out, h.dtype)], saves=[h, b_w], matmul=True, mm=True
        )
        (y,) = self.g.op([y], [(y.numel, y.dtype)])  # * scaling
        (out,) = self.g.op([base, y], [(base.numel, promote(base.dtype, y.dtype))])
        out = self.cast(out, base.dtype)
        # peft's local ``x``, rebound to the fp32 copy, and the caller's argument: referenced
        # until forward returns
        self.g.touch(xf, x)
        return out

    def embedding(self, n_tokens: int, vocab: int, dim: int, *, trainable: bool = True) -> Tensor:
        """``F.embedding`` saves the (int64) indices only."""
        saved = "embed" in self.saved_modules and not self.freeze_token_embedding
        w = self.weight(
            vocab, dim, trainable=trainable and not self.freeze_token_embedding, saved=saved
        )
        w.is_embedding = True
        self.freeze_token_embedding = False
        if self.tied_embedding and w.rg:  # the token embedding comes first
            w.sum_out_of_place = True
            w.release_buffered = self.existing_grads
            self.tied_embedding = False
        (out,) = self.g.op([w], [(n_tokens * dim, self.pdtype)])
        return out

    def layer_norm(self, x: Tensor, dim: int, *, bias: bool = True) -> Tensor:
        """``native_layer_norm`` (fp32 under autocast): saves input, weight and the fp32
        ``mean``/``rstd`` (one per row)."""
        w = self.weight(dim)
        b = self.weight(dim) if bias else None
        xi = self.fp32_op(x)
        rows = x.numel // dim
        out, mean, rstd = self.g.op(
            [xi, w] + ([b] if b is not None else []),
            [(x.numel, xi.dtype), (rows, "f32"), (rows, "f32")],
            saves=[xi, w],
        )
        self.save_outputs(mean, rstd)
        return out

    def save_outputs(self, *outputs: Tensor) -> None:
        """The last op's backward uses some of its own outputs."""
        node = self.g.nodes[-1]
        if node.rg:
            node.saves += list(outputs)

    def rms_norm(self, x: Tensor, dim: int, *, style: str = "llama") -> Tensor:
        """Hugging Face's Python RMSNorm (``LlamaRMSNorm``, ``Gemma2RMSNorm``, ``T5LayerNorm``).

        llama: ``w * (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).to(x.dtype)``: PowBackward
        saves the fp32 copy, RsqrtBackward its output, the final mul the cast result.
        gemma: ``(x.float() * rsqrt(...)) * (1 + w.float())`` cast back: saves the fp32 product.
        t5: ``x * rsqrt(x.float().pow(2).mean(-1) + eps)``: the mul saves ``x`` itself.
        olmo: ``(w * (x.float() * rsqrt(...))).to(x.dtype)``: the weight times the fp32 product
        (an fp32 result), then cast back."""
        if self.kernels == "unsloth" and self.train and style in ("llama", "gemma"):
            from memfit.estimate.analytic.unsloth import fast_rms_norm

            return fast_rms_norm(self, x, dim, gemma=style == "gemma")
        w = self.weight(dim)
        xf = self.cast(x, "f32")
        rows = x.numel // dim
        (sq,) = self.g.op([xf], [(x.numel, "f32")], saves=[xf])  # pow(2)
        (var,) = self.g.op([sq], [(rows, "f32")])  # mean(-1, keepdim)
        (var,) = self.g.op([var], [(rows, "f32")])  # + eps
        (r,) = self.g.op([var], [(rows, "f32")])  # rsqrt
        self.save_outputs(r)
        base = x if style == "t5" else xf
        (y,) = self.g.op([base, r], [(x.numel, "f32")], saves=[base, r])
        if style == "gemma":
            wf = self.cast(w, "f32")
            (w1,) = self.g.op([wf], [(dim, "f32")])  # 1 + weight
            return self.cast(self.mul(y, w1), x.dtype)
        if style == "olmo":
            return self.cast(self.mul(w, y), x.dtype)
        if style == "llama":
            y = self.cast(y, x.dtype)
        elif w.dtype in HALF:  # t5 casts to a half weight's dtype
            y = self.cast(y, w.dtype)
        return self.mul(w, y)

    def act(self, x: Tensor, kind: str) -> Tensor:
        """Activation functions. ``silu``/``gelu``/``gelu_tanh`` (native kernels) save their
        input, ``relu`` its output; ``gelu_new`` (GPT-2's Python tanh formula) saves four
        tensors: ``x`` (pow), ``tanh(...)``, ``0.5 * x`` and ``1 + tanh(...)``."""
        if kind == "relu":
            (out,) = self.g.op([x], [(x.numel, x.dtype)])
            self.save_outputs(out)
            return out
        if kind == "gelu_new":
            # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))), evaluated left to right
            (hx,) = self.g.op([x], [(x.numel, x.dtype)])  # 0.5 * x
            xp = self.fp32_op(x)  # pow is on autocast's fp32 list
            (p,) = self.g.op([xp], [(x.numel, xp.dtype)], saves=[xp])
            (p,) = self.g.op([p], [(x.numel, xp.dtype)])  # * 0.044715
            (p,) = self.g.op([x, p], [(x.numel, promote(x.dtype, xp.dtype))])  # x + ...
            (p,) = self.g.op([p], [(x.numel, p.dtype)])  # * sqrt(2/pi)
            (t,) = self.g.op([p], [(x.numel, p.dtype)])  # tanh saves its result
            self.save_outputs(t)
            (t1,) = self.g.op([t], [(x.numel, t.dtype)])  # 1 + tanh
            (out,) = self.g.op([hx, t1], [(x.numel, promote(hx.dtype, t1.dtype))], saves=[hx, t1])
            return out
        (out,) = self.g.op([x], [(x.numel, x.dtype)], saves=[x])
        return out

    def mul(self, a: Tensor, b: Tensor) -> Tensor:
        """``a * b``: MulBackward0 saves each factor the other's gradient needs. A broadcast
        factor's gradient is the full-size product of the incoming gradient and the other
        factor, then summed to its shape: a full-size temporary while the backward runs, and the
        CUDA reduction's staging blocks while it is summed (:func:`sum_to_staging_bytes`)."""
        n = max(a.numel, b.numel)
        dtype = promote(a.dtype, b.dtype)
        small = [t for t in (a, b) if t.rg and t.numel < n]
        staging = sum(sum_to_staging_bytes(n // t.numel, t.numel) for t in small)
        (out,) = self.g.op(
            [a, b],
            [(n, dtype)],
            saves=[a if b.rg else None, b if a.rg else None],  # type: ignore[list-item]
            bwd_workspace=n * DTYPE_BYTES[dtype] + staging if small else 0,
        )
        return out

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """``a + b``: AddBackward0 hands its incoming gradient to each input of the output's size
        and dtype as it is (a broadcast input gets a reduced copy, another dtype a cast)."""
        (out,) = self.g.op(
            [a, b], [(max(a.numel, b.numel), promote(a.dtype, b.dtype))], passthrough=True
        )
        return out

    def split(self, x: Tensor, sizes: list[int]) -> list[Tensor]:
        """``split``/``chunk``: views of ``x``; SplitBackward builds one gradient of x's size."""
        total = sum(sizes)
        return self.g.op(
            [x], [(x.numel // total * n, x.dtype) for n in sizes], view_of=x, grad_to=[x]
        )

    def slice(self, x: Tensor, part: int, whole: int) -> Tensor:
        """``x[..., :part]``: a view; SliceBackward builds a zero gradient of x's full size."""
        (out,) = self.g.op([x], [(x.numel // whole * part, x.dtype)], view_of=x)
        return out

    def unary(self, x: Tensor, *, dtype: str | None = None) -> Tensor:
        """An op that saves nothing (scale by a constant, neg, slice copy, cat of one tensor)."""
        (out,) = self.g.op([x], [(x.numel, dtype or x.dtype)])
        return out

    def dropout(self, x: Tensor, p: float) -> Tensor:
        """Dropout in training: CUDA's fused ``native_dropout`` returns the output and a bool mask,
        and saves the mask (memfit's trace emulates the same kernel)."""
        if not self.train or p <= 0.0 or not x.rg:
            return x
        out, mask = self.g.op([x], [(x.numel, x.dtype), (x.numel, "bool")])
        self.save_outputs(mask)
        return out

    def lora_dropout_of(self, x: Tensor) -> Tensor:
        """peft's ``lora_dropout[adapter](x)`` on an adapter's input (``nn.Dropout``; 0: peft's
        ``nn.Identity``, ``x`` itself). CUDA's fused ``native_dropout`` always runs in training
        (``aten::dropout`` takes it for any CUDA input, ``is_fused_kernel_acceptable`` in
        ``aten/src/ATen/native/Dropout.cpp``): a new tensor in ``x``'s dtype, which lora_A's
        ``mm`` then saves in place of ``x`` (each adapter its own copy), and a 1-byte bool mask,
        saved for backward (``native_dropout_backward`` uses only the mask) where ``x`` requires
        grad, else freed at once. Unlike :meth:`dropout`, the copy exists even when ``x`` does
        not require grad: the adapter's weight does."""
        if not self.train or self.lora_dropout <= 0.0:
            return x
        out, mask = self.g.op([x], [(x.numel, x.dtype), (x.numel, "bool")])
        self.save_outputs(mask)
        return out

    def matmul(self, a: Tensor, b: Tensor, n_out: int) -> Tensor:
        """A batched matmul of two activations (eager attention): saves both."""
        ai, bi = self.autocast_input(a), self.autocast_input(b)
        (out,) = self.g.op(
            [ai, bi],
            [(n_out, promote(ai.dtype, bi.dtype))],
            saves=[ai if bi.rg else None, bi if ai.rg else None],  # type: ignore[list-item]
            matmul=True,
        )
        return out
