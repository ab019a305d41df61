"""FSDP1 gradient sizes of a block whose frozen weights and LoRA weights share one FlatParameter,
under gradient accumulation with ``no_sync()`` — the mechanism behind LitGPT's 2023 FSDP LoRA
rows of ``benchmarks/data/multigpu_published.jsonl`` (marked not expressible there).

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp1_lora_no_sync.py          # print
    PYTHONPATH=src .venv/bin/python benchmarks/fsdp1_lora_no_sync.py --write  # + results file

Runs torch's own FSDP1 (``FullyShardedDataParallel``) on two CPU processes (gloo): two blocks,
each wrapped as one unit with ``use_orig_params=True`` as Lightning Fabric's FSDPStrategy does
(lit-gpt 8641822 ``finetune/lora.py``: ``auto_wrap_policy={Block}``), frozen base weights and
trainable LoRA A/B inside; one micro-batch under ``no_sync()`` (Fabric's ``no_backward_sync``),
then one synced. It prints, per block and rank, the flat parameter's ``requires_grad``, its
sharded and unsharded sizes and its gradient's size. What it shows (torch 2.13 here; the code
paths are the ones lit-gpt ran on torch 2.1: ``_flat_param.py`` ``_validate_tensors_to_flatten``,
``_runtime_utils.py`` ``_post_backward_hook``): the flat parameter requires grad because one of
its tensors does, and after the ``no_sync`` micro-batch each rank holds a gradient of the whole
block (frozen weights included), not of its shard; after the synced one, the shard's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

RESULTS = Path(__file__).resolve().parent / "results" / "fsdp1_lora_no_sync.txt"
HIDDEN = 256
RANK = 8
WORLD = 2


class Block(nn.Module):
    """Two frozen projections and a LoRA pair, one FSDP1 unit (as a LitGPT ``Block``)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.mlp = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.lora_a = nn.Linear(HIDDEN, RANK, bias=False)
        self.lora_b = nn.Linear(RANK, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.relu(self.base(x) + self.lora_b(self.lora_a(x))))


def _lines(rank: int, model: FSDP, tag: str) -> list[str]:
    units = [m for m in model.modules() if isinstance(m, FSDP) and m is not model]
    out = []
    for i, unit in enumerate(units):
        flat = unit._handle.flat_param  # FSDP1's FlatParameter of this unit
        grad = flat.grad
        out.append(
            f"rank {rank} {tag}, block {i}: requires_grad={flat.requires_grad} sharded "
            f"{flat.numel()} unsharded {flat._unpadded_unsharded_size.numel()} gradient "
            f"{None if grad is None else grad.numel()}"
        )
    return out


def _worker(rank: int, port: str, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    for name, p in model.named_parameters():
        p.requires_grad = "lora" in name  # mark_only_lora_as_trainable
    fsdp = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        use_orig_params=True,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=torch.device("cpu"),
    )
    x = torch.randn(4, HIDDEN)
    with fsdp.no_sync():
        fsdp(x).sum().backward()
    lines = _lines(rank, fsdp, "after the no_sync micro-batch")
    fsdp(x).sum().backward()
    lines += _lines(rank, fsdp, "after the synced micro-batch")
    Path(out_dir, f"rank{rank}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS.name}")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=("29533", tmp), nprocs=WORLD)
        text = "".join(Path(tmp, f"rank{r}.txt").read_text() for r in range(WORLD))
    text = f"torch {torch.__version__}, FSDP1 FULL_SHARD on {WORLD} CPU ranks (gloo)\n" + text
    print(text, end="")
    if args.write:
        RESULTS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
