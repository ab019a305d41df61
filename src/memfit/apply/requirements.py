"""What a technique needs from the machine, checked before it is applied.

A technique that cannot run here raises :class:`UnsupportedHardwareError` naming the missing
requirement and what to do instead; a missing package raises
:class:`~memfit.errors.MissingDependencyError` with the pip command.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from memfit.errors import MemfitError, MissingDependencyError

#: Compute capabilities (major, minor): bf16 tensor cores arrive with Ampere (8.0); FP8 tensor
#: cores with Ada (8.9) and Hopper (9.0) — NVIDIA CUDA C++ Programming Guide, "Compute
#: Capabilities" table; torch._scaled_mm refuses FP8 below 8.9.
BF16_MIN_CAPABILITY = (8, 0)
FP8_MIN_CAPABILITY = (8, 9)
#: FlashAttention-2 supports Ampere, Ada and Hopper (flash-attn README, "Installation").
FLASH_ATTN_MIN_CAPABILITY = (8, 0)


class UnsupportedHardwareError(MemfitError):
    """A technique of the plan cannot run on this machine (the message names the requirement)."""


def device_of(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for an empty module."""
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of ``device`` (None off CUDA)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def require_capability(device: torch.device, minimum: tuple[int, int], what: str) -> None:
    """Raise unless ``device`` is a CUDA GPU of at least ``minimum`` compute capability."""
    cc = capability(device)
    need = f"{minimum[0]}.{minimum[1]}"
    if cc is None:
        raise UnsupportedHardwareError(
            f"{what} needs a CUDA GPU of compute capability {need}+; the model is on "
            f"{device.type!r}: move it to such a GPU, or choose another technique"
        )
    if cc < minimum:
        name = torch.cuda.get_device_name(device)
        raise UnsupportedHardwareError(
            f"{what} needs compute capability {need}+; {name} has {cc[0]}.{cc[1]}: choose "
            "another technique or a newer GPU"
        )


def require_bf16(device: torch.device) -> None:
    """bf16 runs on CPU and on CUDA GPUs from Ampere on (without emulation)."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        require_capability(device, BF16_MIN_CAPABILITY, "bf16 (precision bf16-true / bf16-mixed)")


def require_package(module: str, pip_name: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(f"{what} needs {pip_name}: pip install {pip_name}")


def import_bitsandbytes(what: str) -> Any:
    require_package("bitsandbytes", "bitsandbytes", what)
    import bitsandbytes

    return bitsandbytes
