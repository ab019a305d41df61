"""Quantized routed experts as ops: the stored tensors and the temporaries of each format's
grouped expert kernels (:mod:`memfit.estimate.quant_experts` has the formats and sources; the
trace engine's stand-ins in ``trace/quantized_experts.py`` allocate the same tensors).

Per projection over the R routed rows (an (N, K) weight per expert):

* ``fp8``: the finegrained-fp8 grouped kernel writes the (R, N) output in the activations' dtype
  and quantizes the activations inside; backward dequantizes a chunk of experts (E' x N x K in
  the gradient's dtype, plus the block scales cast and repeated over the rows).
* ``int4-gptq`` / ``int4-awq``: the fp16 copy of the input, one expert's (K, N) fp16 weight above
  the kernel's row limit, the fp16 output cast back; backward one expert's fp16 weight and its
  cast to the gradient's dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.estimate import quant, quant_experts
from memfit.estimate.analytic.graph import DTYPE_BYTES, Tensor
from memfit.estimate.quant_experts import ExpertsShape

if TYPE_CHECKING:
    from memfit.estimate.analytic.ops import Ops

#: Names of the graph's dtypes in :mod:`memfit.estimate.quant`.
QUANT_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
#: Stored tensors that belong to the up (gate/up) projection; the rest are the down one's.
UP_PREFIXES = ("gate_up_proj", "up_proj", "gate_proj")


def stored_experts(o: Ops, shape: ExpertsShape, *, hopper: bool = False) -> None:
    """The experts' stored tensors (each rounded to the allocator's 512 B) as two frozen
    parameters, the up and the down projection, with their logical element counts.
    ``hopper``: MXFP4 weights padded as triton's ``HopperMXValueLayout`` stores them."""
    tensors = quant_experts.stored_expert_tensors(
        str(o.quant),
        shape,
        dtype=QUANT_DTYPE[o.pdtype],
        group_size=o.quant_group_size,
        hopper=hopper,
    )
    e, h, i = shape.n_experts, shape.hidden, shape.intermediate
    up = [t for t in tensors if t.name.startswith(UP_PREFIXES)]
    down = [t for t in tensors if not t.name.startswith(UP_PREFIXES)]
    for numel, part in ((e * shape.up_out * h, up), (e * h * i, down)):
        w = o.g.param(numel, o.pdtype, trainable=False)
        w.stored_bytes = quant_experts.stored_experts_bytes(part, quant.ALLOCATION_ROUND_BYTES)


def quantized_experts_linear(o: Ops, x: Tensor, shape: ExpertsShape, proj: str) -> Tensor:
    """One grouped projection (``up``: H → up_out, ``down``: I → H) of quantized experts."""
    fmt = str(o.quant)
    n, k = (shape.up_out, shape.hidden) if proj == "up" else (shape.hidden, shape.intermediate)
    rows = x.numel // k
    cb = DTYPE_BYTES[x.dtype]
    if fmt == "fp8":
        bn, bk = quant_experts.FP8_BLOCK
        e = quant_experts.fp8_backward_experts(shape, n, k, cb)
        scales = e * -(-n // bn) * -(-k // bk)
        bwd = e * n * k * cb + scales * cb + scales * bn * cb  # weight, scales, repeated scales
        (out,) = o.g.op([x], [(rows * n, x.dtype)], bwd_workspace=bwd)
        return out
    # one expert's Linear: the gate and the up projections are separate Linears
    n_one = shape.intermediate if proj == "up" else n
    one = k * n_one * DTYPE_BYTES["f16"]
    x16 = o.cast(x, "f16")
    ws = one if quant_experts.gptq_dequantizes(fmt, rows, shape.n_experts, k) else 0
    bwd = one + (k * n_one * cb if x.dtype != "f16" else 0)
    (out,) = o.g.op([x16], [(rows * n, "f16")], fwd_workspace=ws, bwd_workspace=bwd)
    return o.cast(out, x.dtype)


__all__ = ["quantized_experts_linear", "stored_experts"]
