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
    is claimed (sharded, offloaded, tensor-parallel or quantized stacks, unknown precisions)."""
    if n_params <= 0 or s.gpus != 1 or s.tp != 1 or s.shard != "none" or s.offload != "none":
        return None
    if s.quant != "none":
        return None
    rule = PRECISION_RULES.get(str(s.precision))
    width = None if rule is None else DTYPE_BYTES.get(rule.params)
    if width is None:
        return None
    if not train:
        return Floor(bytes=NARROWEST_BYTES * n_params, what="weights alone need")
    if s.lora_rank is None and not s.freeze_layers:
        return Floor(bytes=2 * width * n_params, what="weights and gradients alone need")
    return Floor(bytes=width * n_params, what="weights alone need")
