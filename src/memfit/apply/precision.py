"""Precision: the dtype the weights are stored in (``bf16-true``/``16-true``: cast;
``32-true``/``*-mixed``: fp32 master weights; under DeepSpeed ZeRO ``*-mixed`` runs as its 16-bit
model, ``WorkloadSpec.run_precision``), checked against the hardware.

The cast touches floating-point *parameters* only, as ``from_pretrained(..., dtype=...)`` leaves
them: buffers that models build in fp32 on purpose (rotary ``inv_freq``) stay fp32, which is also
what memfit's estimator builds (``from_config(dtype=...)``).
"""

from __future__ import annotations

import torch

from memfit.apply.requirements import UnsupportedHardwareError, device_of, require_bf16

# The estimator's tables: a plan applies exactly the dtypes memfit estimated.
from memfit.estimate.trace.build import PARAM_DTYPE as PARAM_DTYPE
from memfit.estimate.trace.steps import AUTOCAST_DTYPE as AUTOCAST_DTYPE
from memfit.spec import PRECISION_RULES


def check_precision(precision: str, device: torch.device) -> None:
    """Raise :class:`UnsupportedHardwareError` when ``device`` cannot run ``precision``."""
    rule = PRECISION_RULES[precision]
    if rule.compute == "bfloat16":
        require_bf16(device)
    if rule.grad_scaler and device.type not in ("cuda", "cpu", "xpu"):
        raise UnsupportedHardwareError(
            f"precision {precision!r} needs autocast and a GradScaler on {device.type!r}; use "
            "'bf16-mixed' or run on CUDA"
        )


def cast_parameters_(model: torch.nn.Module, precision: str) -> list[str]:
    """Give every floating-point parameter the precision's dtype (in place; Parameter objects
    are kept). Returns the names of the parameters that changed dtype."""
    dtype = PARAM_DTYPE[precision]
    changed = []
    for name, p in model.named_parameters():
        if p.is_floating_point() and p.dtype != dtype and not _is_quantized(p):
            p.data = p.data.to(dtype)
            changed.append(name)
    return changed


def _is_quantized(p: torch.Tensor) -> bool:
    """bitsandbytes / torchao weights keep their storage format."""
    return type(p).__name__ in ("Params4bit", "Int8Params") or p.dtype in (
        torch.int8,
        torch.uint8,
    )


def check_model_dtype(model: torch.nn.Module, precision: str) -> list[str]:
    """Problems: floating-point parameters whose dtype is not the precision's (LoRA adapters,
    which peft keeps in fp32, and quantized weights excepted)."""
    dtype = PARAM_DTYPE[precision]
    bad = sorted(
        {
            f"{name} is {p.dtype}"
            for name, p in model.named_parameters()
            if p.is_floating_point()
            and p.dtype != dtype
            and "lora_" not in name
            and type(p) in (torch.nn.Parameter, torch.Tensor)
        }
    )
    if not bad:
        return []
    return [f"precision {precision!r} wants {dtype}: {len(bad)} parameters differ ({bad[0]})"]


def device_type(model: torch.nn.Module) -> str:
    return device_of(model).type
