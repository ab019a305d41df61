"""Quantized Linear layers (``--quant``) as ops: what each library's CUDA path allocates.

The stored tensors, the kept-out modules and the dequantization thresholds come from
:mod:`memfit.estimate.quant` (shared with the trace engine, whose stand-ins in
``trace/quantized.py`` allocate the same tensors). Per format, with M tokens and an (N, K) weight
(docs/quantization.md has the sources):

* ``nf4``/``nf4-dq``/``fp4`` (bitsandbytes ``Linear4bit``): input cast to the compute dtype;
  fused kernel (output only) or, above ``FUSED_MAX_TOKENS``, an (N, K) dequantized weight (plus
  two fp32 absmax vectors for ``nf4-dq``) while ``F.linear`` runs; output cast back. Nothing is
  saved; backward rebuilds the weight in the stored dtype and casts it to the gradient's dtype.
* ``int8`` (``Linear8bitLt``): fp16 copy of the input, its int8 rows, row stats, the fp16
  ``abs()`` and bool outlier mask; int32 GEMM output and its fp16 dequantization; the input is
  saved; backward rebuilds ``CB.to(dtype) * SCB / 127``.
* ``int4-awq``: fp16 input saved; fused below 1024 tokens else a (K, N) fp16 weight; bias added
  out of place; backward repeats the (N, K) weight per batch row for ``bmm``.
* ``int4-gptq``: fp16 input; (K, N) fp16 weight above 50 rows; backward a (K, N) fp16 weight.
* ``fp8``: the input's ``abs()``, scaled and clamped copies and its float8 copy; backward the
  weight in the compute dtype.

peft's LoRA forward for a quantized base (``peft/tuners/lora/bnb.py``, ``awq.py``): the 4-bit
wrapper clones the base output, bitsandbytes and AWQ cast the adapter output to the base output's
dtype before adding (outside autocast), AWQ scales after that cast; GPTQ and FP8 use the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.estimate import quant, quant_experts
from memfit.estimate.analytic.graph import DTYPE_BYTES, Tensor

if TYPE_CHECKING:
    from memfit.estimate.analytic.ops import Ops

#: Names of the graph's dtypes in :mod:`memfit.estimate.quant`.
QUANT_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
#: Linear layers no format quantizes by default: the output embeddings and the model's last
#: module (``KEPT_OUT``: transformers' ``get_keys_to_not_convert``).
KEPT_OUT_NAMES = ("lm_head", "classifier", "score")
BNB_4BIT = ("nf4", "nf4-dq", "fp4")
#: peft's wrapper per format (``lora/bnb.py``, ``lora/awq.py``; the rest: ``lora.Linear``).
LORA_STYLE = {"nf4": "bnb4", "nf4-dq": "bnb4", "fp4": "bnb4", "int8": "bnb8", "int4-awq": "awq"}


def quantizes(fmt: str | None, name: str, *, in_repeated_block: bool) -> bool:
    """Whether the Linear ``name`` is stored quantized under ``fmt`` (``KEPT_OUT`` rules; a
    format that converts the routed experts only, ``quant_experts.EXPERTS_ONLY``: none)."""
    if fmt is None or fmt == "none" or name in KEPT_OUT_NAMES:
        return False
    if fmt in quant_experts.EXPERTS_ONLY:  # mxfp4: gpt-oss's experts, no nn.Linear
        return False
    return in_repeated_block or not quant.KEPT_OUT[fmt].only_repeated_blocks


def quantized_weight(o: Ops, n_in: int, n_out: int, *, bias: bool) -> Tensor:
    """A frozen quantized ``Linear(n_in, n_out)``'s stored tensors (each rounded to the
    allocator's 512 B) as one parameter."""
    stored = quant.quantized_linear_bytes(
        str(o.quant),
        n_out,
        n_in,
        o.quant_group_size,
        bias=bias,
        dtype=QUANT_DTYPE[o.pdtype],
        round_to=quant.ALLOCATION_ROUND_BYTES,
    )
    w = o.g.param(n_in * n_out + (n_out if bias else 0), o.pdtype, trainable=False)
    w.stored_bytes = sum(stored.values())
    return w


def quantized_linear(o: Ops, x: Tensor, n_in: int, n_out: int, *, bias: bool) -> Tensor:
    """A frozen quantized ``Linear(n_in, n_out)`` on ``x``: its stored tensors
    (:func:`quantized_weight`) and the format's temporaries (module docstring)."""
    fmt = str(o.quant)
    quantized_weight(o, n_in, n_out, bias=bias)
    m = x.numel // n_in
    mk, mn, nk = m * n_in, m * n_out, n_in * n_out
    if fmt in BNB_4BIT:
        return _bnb4(o, x, fmt, n_in, n_out, m)
    if fmt == "int8":
        a16 = 2 * mk if x.dtype != "f16" else 0
        out_b = mn * DTYPE_BYTES[x.dtype]
        # int8 rows + fp32 row stats live throughout; before the GEMM the fp16 copy, abs() and
        # the bool mask; then the int32 output and its fp16 dequantization; then the cast.
        during = max(a16 + 2 * mk + mk, 4 * mn + 2 * mn, 2 * mn + (out_b if a16 else 0))
        ws = max(mk + 4 * m + during - out_b, 0)
        bwd = nk * DTYPE_BYTES[x.dtype] + 4 * n_out  # CB.to(dtype) * (SCB / 127)
        (out,) = o.g.op([x], [(mn, x.dtype)], saves=[x], fwd_workspace=ws, bwd_workspace=bwd)
        return out
    if fmt == "int4-awq":
        x16 = o.cast(x, "f16")
        ws = nk * 2 if quant.uses_dequantized_weight(fmt, m, n_in) else 0
        (out,) = o.g.op(
            [x16],
            [(mn, "f16")],
            saves=[x16],
            fwd_workspace=ws,
            bwd_workspace=nk * 2 * (1 + o.batch),
            matmul=ws > 0,  # torch.matmul on the dequantized weight: an ``mm``
        )
        if bias:
            out = o.unary(out)  # out + bias, out of place
        return o.cast(out, x.dtype)
    if fmt == "int4-gptq":
        x16 = o.cast(x, "f16")
        ws = nk * 2 if quant.uses_dequantized_weight(fmt, m, n_in) else 0
        (out,) = o.g.op([x16], [(mn, "f16")], fwd_workspace=ws, bwd_workspace=nk * 2, matmul=ws > 0)
        return o.cast(out, x.dtype)
    # fp8: abs() then the scaled and clamped copies (2 x M·K) before the float8 copy (M·K bytes)
    # lives next to the output.
    xc = o.cast(x, o.cdtype)
    cb = DTYPE_BYTES[o.cdtype]
    ws = max(2 * mk * cb - mn * cb, mk)
    (out,) = o.g.op([xc], [(mn, o.cdtype)], fwd_workspace=ws, bwd_workspace=nk * cb)
    return o.cast(out, x.dtype)


def _bnb4(o: Ops, x: Tensor, fmt: str, n_in: int, n_out: int, m: int) -> Tensor:
    """``Linear4bit``: the input cast to ``bnb_4bit_compute_dtype`` and the output back to the
    input's dtype (``o.quant_dtype``: the dtype the model was loaded in, when peft's
    ``prepare_model_for_kbit_training`` made the rest of it fp32)."""
    cd = o.quant_dtype or o.cdtype
    stored = o.quant_dtype or o.pdtype
    xc = o.cast(x, cd)
    nk = n_in * n_out
    ws = quant.dequant_temporary_bytes(fmt, n_out, n_in, n_tokens=m, compute_bytes=DTYPE_BYTES[cd])
    if ws and fmt == "nf4-dq":  # nested statistics → fp32 absmax, + offset
        ws += 2 * 4 * -(-nk // quant.BNB_4BIT_BLOCKSIZE)
    # backward: the weight in the stored dtype, cast to the gradient's (the compute) dtype
    bwd = nk * DTYPE_BYTES[stored] + (nk * DTYPE_BYTES[cd] if stored != cd else 0)
    # dequantized: ``F.linear`` on the (N, K) weight, an ``mm`` that selective checkpointing stores
    dequantized = quant.uses_dequantized_weight(fmt, m, n_in)
    (out,) = o.g.op(
        [xc], [(m * n_out, cd)], fwd_workspace=ws, bwd_workspace=bwd, matmul=dequantized
    )
    return o.cast(out, x.dtype)


def lora_on_quantized(o: Ops, x: Tensor, base: Tensor, n_in: int, n_out: int) -> Tensor:
    """peft's format-specific LoRA forward around a quantized base output ``base``."""
    style = LORA_STYLE.get(str(o.quant))
    if style is None:
        return o.lora_default(x, base, n_in, n_out)
    assert o.lora is not None
    r = o.lora[0]
    result = o.unary(base) if style == "bnb4" else base  # "defensively clone"
    a, b = o.lora_adapters(n_in, n_out)
    convert = not o.autocast
    # peft: ``x = self._cast_input_dtype(x, lora_A.weight.dtype)`` without autocast, then
    # ``lora_A(dropout(x))`` (autocast casts the dropped copy for the matmul)
    xc = o.cast(x, "f32") if convert else x
    xd = o.lora_dropout_of(xc)
    xa = xd if convert else o.autocast_input(xd)
    aw, bw = o.autocast_weight(a), o.autocast_weight(b)
    (h,) = o.g.op([xa, aw], [(x.numel // n_in * r, xa.dtype)], saves=[xa, aw], matmul=True, mm=True)
    (y,) = o.g.op(
        [h, bw], [(x.numel // n_in * n_out, h.dtype)], saves=[h, bw], matmul=True, mm=True
    )
    if style != "awq":
        y = o.unary(y)  # * scaling
    if convert:
        y = o.cast(y, result.dtype)
    output = y  # the local ``output`` (AWQ: the cast, alive while it is scaled and added)
    if style == "awq":
        y = o.unary(y)  # * scaling, after the cast
    out = o.add(result, y)
    # peft rebinds the local ``x`` to the fp32 copy: it lives until forward returns, as does
    # the caller's argument (``down_proj(act(gate(x)) * up(x))``: the product)
    o.g.touch(output, x, *([xc] if convert and xc is not x else []))
    return out


__all__ = ["lora_on_quantized", "quantized_linear", "quantizes"]
