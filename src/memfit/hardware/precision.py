"""The precision a GPU runs: a bf16 precision on a GPU without bf16 tensor cores
(``GPU.supports_bf16`` False: Turing, Volta, Pascal) becomes its fp16 counterpart, the same two
bytes per element (Lightning's names: ``bf16-mixed`` -> ``16-mixed``, ``bf16-true`` ->
``16-true``). Every place that proposes a precision for a GPU (a next step, a plan request)
asks :func:`precision_on`, so no command tells a T4 user to run ``bf16-true``."""

from __future__ import annotations

from typing import Any

from memfit.spec.rules import FP16_COUNTERPART

__all__ = ["FP16_COUNTERPART", "precision_on"]


def precision_on(precision: str, gpu: Any) -> str:
    """``precision`` as ``gpu`` runs it: its fp16 counterpart where the GPU has no bf16 (a GPU of
    None or without the flag: unchanged)."""
    if gpu is None or getattr(gpu, "supports_bf16", True):
        return precision
    return FP16_COUNTERPART.get(precision, precision)


__all__ = ["FP16_COUNTERPART", "precision_on"]
