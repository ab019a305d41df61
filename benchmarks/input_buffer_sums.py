"""Autograd's input-buffer sums that a dispatch mode makes out of place (issue 19, accuracy.md §18).

Runs one backward of a tiny Llama on real CPU tensors under a counting dispatch mode and lists
the ``aten.add.Tensor`` calls the autograd engine makes between nodes (after a node's post-hook,
before the next node's pre-hook): ``InputBuffer::accumulate`` summing a node's incoming
gradients. Without a dispatch mode torch sums most of them in place; under one
(``isTensorSubclassLike``) each allocates a new gradient-sized block. Writes
``benchmarks/results/input_buffer_sums.md``.

    PYTHONPATH=src python benchmarks/input_buffer_sums.py
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "input_buffer_sums.md"
CONFIG = dict(
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=500,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
BATCH, SEQ = 2, 128


def main() -> int:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    between = {"nodes": False}

    class Sums(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sums: list[tuple[tuple[int, ...], str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if between["nodes"] and func is torch.ops.aten.add.Tensor:
                self.sums.append(
                    (tuple(out.shape), str(out.dtype), out.numel() * out.element_size())
                )
            return out

    loss = model(input_ids=ids, labels=ids).loss
    for node in _nodes(loss.grad_fn):
        node.register_prehook(lambda _g: between.__setitem__("nodes", False))
        node.register_hook(lambda _gi, _go: between.__setitem__("nodes", True))
    mode = Sums()
    with mode:
        loss.backward()
    lines = [
        "# Input-buffer sums in one backward under a dispatch mode",
        "",
        f"Tiny Llama ({CONFIG['num_hidden_layers']} layers, hidden {CONFIG['hidden_size']}, fp32), "
        f"batch {BATCH} x {SEQ} tokens, real CPU tensors, torch {torch.__version__}.",
        f"{len(mode.sums)} sums, {sum(n for *_, n in mode.sums):,} B allocated by them in all.",
        "",
        "| shape | dtype | bytes each | count |",
        "|---|---|---|---|",
    ]
    for (shape, dtype, n_bytes), count in Counter(mode.sums).most_common():
        lines.append(f"| {shape} | {dtype} | {n_bytes:,} | {count} |")
    OUT.write_text("\n".join([*lines, ""]))
    print(OUT.read_text())
    return 0


def _nodes(root: Any) -> list[Any]:
    seen: list[Any] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or any(node is s for s in seen):
            continue
        seen.append(node)
        stack += [nxt for nxt, _ in node.next_functions]
    return seen


if __name__ == "__main__":
    sys.exit(main())
