"""Layer freezing: ``requires_grad_(False)`` on the input embeddings and the first N repeated
blocks — the estimator's own function (:func:`memfit.estimate.trace.build.freeze_first_layers_`),
so what is frozen is exactly what was estimated."""

from __future__ import annotations

import torch

from memfit.estimate.trace.build import decoder_layers, freeze_first_layers_

__all__ = ["freeze_first_layers_", "freezing_problems"]


def freezing_problems(model: torch.nn.Module, n_layers: int) -> list[str]:
    """Blocks among the first ``n_layers`` that still train (LoRA adapters excepted)."""
    layers = decoder_layers(model)
    if layers is None:
        return [f"freeze_layers {n_layers}: the model has no repeated blocks"]
    p = []
    for i, block in enumerate(layers[:n_layers]):
        live = [n for n, t in block.named_parameters() if t.requires_grad and "lora_" not in n]
        if live:
            p.append(f"freeze_layers {n_layers}: block {i} still trains {live[0]}")
    return p
