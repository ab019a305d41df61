"""FSDP1's SHARDED_STATE_DICT copies, run for real on CPU, against memfit's checkpoint phase.

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp1_sharded_save.py          # print
    PYTHONPATH=src .venv/bin/python benchmarks/fsdp1_sharded_save.py --write  # + results file

Runs torch's own FSDP1 (``FullyShardedDataParallel``, FULL_SHARD, ``use_orig_params=False``, as
accelerate's FSDP-QLoRA config sets it) on two CPU processes (gloo) over the small transformers
Llama of ``benchmarks/fsdp1_units.py`` (odd sizes: FSDP1 pads, ``chunk`` splits unevenly) with
peft LoRA on all linear layers wrapped by peft's ``fsdp_auto_wrap_policy``, fp32. Each rank then
builds the state dict the way accelerate's ``save_fsdp_model(adapter_only=True)`` does for a PEFT
model under ``SHARDED_STATE_DICT`` (the whole ``model.state_dict()`` inside
``FSDP.state_dict_type`` with torch's default ``ShardedStateDictConfig``; peft's
``get_peft_model_state_dict`` keeps the adapter keys afterwards) and records the bytes of every
local shard whose storage is not one of the flat parameters' own: the copies the state dict holds
at once. memfit's :func:`memfit.estimate.fsdp1_save.chunk_bytes` gives the same figure for the
same config (it splits bytes where ``chunk`` splits rows: rank 0 may hold one row more a tensor).
tests/estimate/test_fsdp1_save.py runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.fsdp1_units import CONFIG, LORA_RANK

RESULTS = Path(__file__).resolve().parent / "results" / "fsdp1_sharded_save.txt"
WORLD = 2
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _model() -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    return get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=8, target_modules=TARGETS))


def _worker(rank: int, port: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy, StateDictType

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    model = _model()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    fsdp = FSDP(
        model,
        auto_wrap_policy=fsdp_auto_wrap_policy(model),
        use_orig_params=False,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=torch.device("cpu"),
    )
    own = {
        m._handle.flat_param.untyped_storage().data_ptr()
        for m in fsdp.modules()
        if isinstance(m, FSDP) and m._handle is not None
    }
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        state = fsdp.state_dict()  # accelerate 0.28 passes no config: torch's default
    copies = n_sharded = 0
    for value in state.values():
        shards = value.local_shards() if hasattr(value, "local_shards") else []
        for shard in shards:
            n_sharded += 1
            t = shard.tensor
            if t.untyped_storage().data_ptr() not in own:
                copies += t.numel() * t.element_size()
    out = {"trainable": trainable, "copy_bytes": copies, "sharded_tensors": n_sharded}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
    dist.destroy_process_group()


def measure(port: str = "29563") -> list[dict[str, Any]]:
    """Per rank: the trainable count, the bytes of the state dict's local-shard copies and how
    many sharded tensors it holds."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(port, tmp), nprocs=WORLD)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(WORLD)]


def memfit_chunks(trainable: int, config_dir: Path) -> int:
    """memfit's per-rank copy bytes for the same job (before the CUDA allocator's rounding)."""
    from memfit.estimate.fsdp1_save import chunk_bytes
    from memfit.estimate.parallel.shape import read_shape
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    work = WorkloadSpec(
        gpus=WORLD,
        shard="fsdp",
        fsdp_version=1,
        fsdp_state_dict_type="SHARDED_STATE_DICT",
        precision="32-true",
        seq_len=16,
        lora_rank=LORA_RANK,
        lora_targets="all-linear",
    )
    shape = read_shape(resolve_model(str(config_dir)).spec)
    return sum(chunk_bytes(shape, work, trainable))


def report(ranks: list[dict[str, Any]]) -> str:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
        mine = memfit_chunks(ranks[0]["trainable"], Path(tmp))
    got = [r["copy_bytes"] for r in ranks]
    return (
        f"torch {torch.__version__}, FSDP1 FULL_SHARD use_orig_params=False on {WORLD} CPU ranks "
        f"(gloo), fp32, LoRA r {LORA_RANK} on all linear layers (peft's wrap policy)\n"
        f"SHARDED_STATE_DICT copies per rank: measured {got} B over "
        f"{ranks[0]['sharded_tensors']} sharded tensors, memfit {mine} B\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS.name}")
    args = parser.parse_args(argv)
    text = report(measure())
    print(text, end="")
    if args.write:
        RESULTS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
