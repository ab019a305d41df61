"""Attention implementation: transformers' ``attn_implementation`` switched on a built model.

``eager`` materialises the (B, H, S, S) scores; ``sdpa`` is ``torch.nn.functional.
scaled_dot_product_attention`` (on CUDA it picks the flash / memory-efficient kernel, which memfit's
estimator emulates); ``flash`` is FlashAttention-2 from the ``flash-attn`` package
(``attn_implementation="flash_attention_2"``), which needs a CUDA GPU of compute capability 8.0+.
Models that are not transformers models run their own attention code: the plan's attention is
then reported as not applied.
"""

from __future__ import annotations

import torch

from memfit.apply.requirements import (
    FLASH_ATTN_MIN_CAPABILITY,
    device_of,
    require_capability,
    require_package,
)
from memfit.errors import SpecError

#: memfit's attention names → transformers' ``attn_implementation``.
HF_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}


def is_hf_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model, "set_attn_implementation")


def set_attention_(model: torch.nn.Module, attention: str) -> str | None:
    """Switch the model's attention; returns the implementation set, or None when the model is
    not a transformers model (nothing to switch)."""
    impl = HF_ATTENTION[attention]
    if attention == "flash":
        require_capability(device_of(model), FLASH_ATTN_MIN_CAPABILITY, "attention 'flash'")
        require_package(
            "flash_attn",
            "flash-attn",
            "attention 'flash' (FlashAttention-2; or use attention 'sdpa', whose CUDA flash "
            "kernel needs no package)",
        )
    if not is_hf_model(model):
        return None
    if current_attention(model) == impl:
        return impl
    try:
        model.set_attn_implementation(impl)  # type: ignore[operator]
    except (ValueError, ImportError) as exc:
        raise SpecError(
            f"attention ({attention!r}): {type(model).__name__} cannot use {impl!r}: "
            f"{str(exc).splitlines()[0]}; choose another attention"
        ) from exc
    if current_attention(model) != impl:
        raise SpecError(
            f"attention ({attention!r}): {type(model).__name__} does not support switching its "
            f"attention implementation after loading; load it with attn_implementation={impl!r}"
        )
    return impl


def current_attention(model: torch.nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)
