"""Activation checkpointing: keep only each repeated block's inputs in forward, recompute the rest
in backward.

- transformers models: ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` on
  older releases) with ``use_reentrant=False`` — the non-reentrant ``torch.utils.checkpoint`` that
  PyTorch recommends and that memfit's estimator traces.
- any other ``nn.Module``: each block of its longest ``nn.ModuleList`` (its repeated blocks) is
  wrapped in ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper`` (non-reentrant), as
  torchtitan and FSDP do.
- ``selective``: the same, with torch's selective-checkpoint context (matmuls and attention
  kernels saved, the rest recomputed): the policy of ``memfit.estimate.trace.build``, reused.
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.errors import SpecError
from memfit.estimate.trace.build import SAC_CONTEXTS, decoder_layers


def checkpoint_kwargs(mode: str) -> dict[str, Any]:
    """The ``torch.utils.checkpoint.checkpoint`` keyword arguments of ``full`` / ``selective`` /
    ``selective-op`` (torchtitan's per-op SAC policy)."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if mode in SAC_CONTEXTS:
        kwargs["context_fn"] = SAC_CONTEXTS[mode]
    return kwargs


def enable_checkpointing_(model: torch.nn.Module, mode: str) -> str:
    """Turn on ``full``, ``selective`` or ``selective-op`` checkpointing; returns how (for the
    applied record)."""
    if mode not in ("full", *SAC_CONTEXTS):
        raise SpecError(
            f"checkpointing ({mode!r}) must be 'full', 'selective' or 'selective-op' here"
        )
    kwargs = checkpoint_kwargs(mode)
    if hasattr(model, "supports_gradient_checkpointing"):
        if not model.supports_gradient_checkpointing:
            raise SpecError(
                f"checkpointing ({mode!r}) is not supported by {type(model).__name__}; use "
                "checkpointing 'none'"
            )
        enable = getattr(model, "activation_checkpointing_enable", None)
        if callable(enable):
            enable(activation_checkpointing_kwargs=kwargs)
            return f"{type(model).__name__}.activation_checkpointing_enable(use_reentrant=False)"
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        return f"{type(model).__name__}.gradient_checkpointing_enable(use_reentrant=False)"
    return _wrap_blocks_(model, kwargs)


def _wrap_blocks_(model: torch.nn.Module, kwargs: dict[str, Any]) -> str:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        checkpoint_wrapper,
    )

    blocks = decoder_layers(model)
    if blocks is None or len(blocks) == 0:
        raise SpecError(
            f"checkpointing needs repeated blocks (an nn.ModuleList) but {type(model).__name__} "
            "has none: wrap your blocks with torch.utils.checkpoint yourself, or use "
            "checkpointing 'none'"
        )
    extra = {k: v for k, v in kwargs.items() if k != "use_reentrant"}  # set by the impl
    for i, block in enumerate(blocks):
        if not isinstance(block, CheckpointWrapper):
            blocks[i] = checkpoint_wrapper(
                block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra
            )
    return f"checkpoint_wrapper(NO_REENTRANT) on {len(blocks)} blocks"


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether checkpointing is on: the transformers flag, or wrapped blocks."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    for m in model.modules():
        # transformers sets ``gradient_checkpointing = True`` on each layer it checkpoints
        if m.__dict__.get("gradient_checkpointing") is True or isinstance(m, CheckpointWrapper):
            return True
    return False
