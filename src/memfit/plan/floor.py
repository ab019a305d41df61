"""A stack's floor: bytes it must hold on its GPU whatever its micro-batch, known without a trace.

A technique stack that runs unsharded on one GPU, with no offload and no quantization, holds
every parameter on the device in its storage precision for the whole step, and under a full
fine-tune (no LoRA, no frozen layers) a gradient of the same width for every parameter at the
end of the backward (``loss.backward()`` fills ``p.grad`` for all of them before the optimizer
step reads any). Peak allocated bytes are at least that sum, and the bytes a plan is charged
(:func:`memfit.plan.budget.need_bytes`: the upper end of the device-used range, reserved bytes
plus what lives outside the allocator) at least its peak allocated bytes. So where the floor
exceeds the budget's limit the stack cannot fit at any micro-batch, and the planner rules it out
without building its derived form (a few traces) or tracing it.

Storage widths are the precision's parameter dtype (:data:`memfit.spec.rules.PRECISION_RULES`,
the dtype every engine loads an unquantized model in, LoRA or not): ``*-mixed`` keeps fp32
weights and gradients (torch autocast runs the matmuls in 16 bits, the parameters stay fp32),
``*-true`` 16-bit ones, ``32-true`` fp32. A stack with LoRA or frozen layers is charged its
weights alone (its trainable parameters' gradients are not counted); an inference job its weights
at 2 bytes per parameter (the narrowest width any precision loads them in). Optimizer states,
activations, workspaces and the CUDA context are left out (all >= 0), so the floor is a lower
bound, not an estimate.

Sharded stacks (DDP, ZeRO-1/2/3, with or without offload; tensor parallelism 1) have a floor
too: the bytes memfit's rank-0 rewrite of the traced step keeps on the device for the whole step
(:mod:`memfit.estimate.trace.rank_replay`, the model both the derived and the trace engine answer
such a job with), counted from the parameter count alone:

- weights: every parameter at its storage width under DDP, ZeRO-1 and ZeRO-2 (offload or not:
  their parameters stay on the device); under ZeRO-3 the rank's partition, at least
  ``n / dp`` of them (``partition_numel`` rounds each up), and nothing where the parameters are
  offloaded (parameters below the persistence threshold stay whole: not counted, >= 0);
- a full fine-tune's gradients: every one at the end of the backward under DDP and ZeRO-1 (the
  ``.grad`` of each parameter, before the step); ZeRO-2 and -3 drop each gradient into their
  bucket and keep a gradient partition of ``n / dp`` at the parameters' width on the device,
  unless the optimizer is offloaded (then it lives in host RAM);
- (ZeRO refuses ``*-true`` precisions: memfit.spec.rules; under ``*-mixed`` the traced weights
  are fp32 and the rewrite adds no master copy.)

The DDP buckets, ZeRO's gradient bucket, gathered ZeRO-3 parameters and every optimizer state
are left out (all >= 0). FSDP2 (traced for real) and tensor-parallel stacks claim no floor.

The parameter count comes from an estimate of the job as asked (the plan's baseline), used only
where that job has no LoRA adapters and no quantized weights (their parameter counts are not the
base model's).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.plan.space import Settings
from memfit.spec.rules import PRECISION_RULES

#: Bytes per element of the parameter dtypes of :data:`memfit.spec.rules.PRECISION_RULES`.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: The narrowest storage any precision loads weights in (an inference job's charge).
NARROWEST_BYTES = 2


@dataclass(frozen=True, kw_only=True)
class Floor:
    """What a stack holds at least: ``bytes`` and how it was counted (``what``)."""

    bytes: int
    what: str


def stack_floor(s: Settings, n_params: int, *, train: bool) -> Floor | None:
    """The floor of ``s`` for a model of ``n_params`` base parameters, or None where no floor
    is claimed (FSDP2, offload without a ZeRO or DDP layout, tensor-parallel or quantized
    stacks, unknown precisions)."""
    if n_params <= 0 or s.tp != 1 or s.quant != "none":
        return None
    rule = PRECISION_RULES.get(str(s.precision))
    width = None if rule is None else DTYPE_BYTES.get(rule.params)
    if width is None:
        return None
    full = s.lora_rank is None and not s.freeze_layers
    if s.shard in SHARDED:
        return _sharded_floor(s, n_params, width, full=full) if train else None
    if s.gpus != 1 or s.shard != "none" or s.offload != "none":
        return None
    if not train:
        return Floor(bytes=NARROWEST_BYTES * n_params, what="weights alone need")
    if full:
        return Floor(bytes=2 * width * n_params, what="weights and gradients alone need")
    return Floor(bytes=width * n_params, what="weights alone need")


#: Layouts rank 0's rewrite models (:mod:`memfit.estimate.trace.rank_replay`) with a floor.
SHARDED = ("ddp", "zero1", "zero2", "zero3")


def _sharded_floor(s: Settings, n_params: int, width: int, *, full: bool) -> Floor | None:
    dp = s.gpus  # tp is 1
    share = n_params // dp  # a lower bound of every partition_numel sum
    offload_opt = s.offload in ("optimizer", "params")
    parts: list[str] = []
    total = 0
    if s.shard != "zero3":
        total += width * n_params
        parts.append("weights")
    elif s.offload != "params":
        total += width * share
        parts.append("weight partition")
    if full:
        if s.shard in ("ddp", "zero1"):
            total += width * n_params
            parts.append("gradients")
        elif not offload_opt:
            total += width * share
            parts.append("gradient partition")
    if total <= 0:
        return None
    names = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
    verb = "need" if len(parts) > 1 or parts[0] == "weights" else "needs"
    return Floor(bytes=total, what=f"rank 0's {names} alone {verb}")
