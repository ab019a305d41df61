"""A factory that declares the techniques memfit may apply to it (docs/factories.md).

    cd docs/examples
    memfit estimate tiny_vit:make --allow-code --batch 16 --precision bf16-mixed
    memfit estimate tiny_vit:make --allow-code --batch 16 --checkpointing full --lora-rank 8

A small pre-norm Vision Transformer in plain PyTorch: its blocks live in one ``nn.ModuleList``
(what memfit checkpoints or freezes block by block) and its projections are ``nn.Linear`` (what
peft's LoRA and the quantized-linear stand-ins replace). ``make.memfit_supports`` says so.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    def __init__(self, image: int = 64, patch: int = 8, dim: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads=4) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def make() -> tuple[nn.Module, dict[str, tuple[object, ...]]]:
    return TinyViT(), {"x": ("batch", 3, 64, 64)}


# memfit may checkpoint the blocks, add LoRA adapters (all-linear or named: qkv, proj, fc1, fc2),
# freeze the first N blocks (--freeze N) and quantize the nn.Linear layers (--quant).
make.memfit_supports = {"checkpointing", "lora", "freeze", "quant"}  # type: ignore[attr-defined]
