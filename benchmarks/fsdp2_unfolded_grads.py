"""FSDP2 without gradient sync: a block's bf16 gradients beside the fp32 accumulator, observed.

The rule behind ``memfit.estimate.parallel.memory.unfolded_grad_bytes``: under a pipeline,
torch.distributed.pipelining runs every backward but the last without gradient sync or
resharding, and FSDP2 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, as
torchtitan sets it) keeps an fp32 ``unsharded_accumulated_grad`` per parameter; autograd still
writes each unsharded parameter's ``.grad`` in bf16, which FSDP2 folds into the accumulator only
in the block's ``post_backward``. This script runs that on the installed torch, on the CPU (gloo,
one rank, no GPU needed): two blocks of two linears, ``set_requires_gradient_sync(False)`` and
``set_reshard_after_backward(False)``, two micro-batches, and inside the first block's backward
(a hook on its first linear's output gradient, after the second linear's weight gradient is
written) prints, per parameter, the dtype of the unsharded ``.grad`` and of the accumulator;
then the same after the backward. Output: one JSON object.

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp2_unfolded_grads.py
"""

from __future__ import annotations

import json
import tempfile
from typing import Any


def observe() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(64, 64, bias=False)
            self.b = nn.Linear(64, 64, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group("gloo", store=dist.FileStore(f.name, 1), rank=0, world_size=1)
        try:
            torch.manual_seed(0)
            model = nn.Sequential(Block(), Block())
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model:
                fully_shard(block, mp_policy=mp, reshard_after_forward=False)
            fully_shard(model, mp_policy=mp, reshard_after_forward=False)
            model.set_requires_gradient_sync(False)
            model.set_reshard_after_backward(False)
            params = model[0]._get_fsdp_state()._fsdp_param_group.fsdp_params

            def name(t: torch.Tensor | None) -> str | None:
                return None if t is None else str(t.dtype).removeprefix("torch.")

            def state() -> list[list[str | None]]:
                return [
                    [name(p._unsharded_param.grad), name(p.unsharded_accumulated_grad)]
                    for p in params
                ]

            result: dict[str, Any] = {"torch": torch.__version__, "micro_batches": []}
            for _ in range(2):
                inside: list[Any] = []

                def probe(grad: torch.Tensor, inside: list[Any] = inside) -> torch.Tensor:
                    inside.append(state())
                    return grad

                hook = model[0].a.register_forward_hook(
                    lambda mod, args, out: out.register_hook(probe) and None
                )
                model(torch.randn(4, 64)).float().sum().backward()
                hook.remove()
                result["micro_batches"].append({"inside_block_backward": inside[0],
                                                "after_backward": state()})  # fmt: skip
            result["parameters"] = ["0.a.weight", "0.b.weight"]
            return result
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    print(json.dumps(observe()))
