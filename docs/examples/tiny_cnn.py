"""A worked ``package.module:factory`` for ``memfit estimate`` (docs/factories.md).

    cd docs/examples && memfit estimate tiny_cnn:make --batch 8 --precision fp32

memfit calls ``make()`` under ``torch.device("meta")`` (nothing is allocated) and traces the
returned module on fake tensors with one micro-batch built from the input description.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def make() -> tuple[nn.Module, dict[str, tuple[object, ...]]]:
    # "batch" is replaced by --batch; every other dimension is fixed by the factory
    return TinyCNN(), {"x": ("batch", 3, 64, 64)}
