"""FSDP1's gradient bytes per rank, run for real on CPU, against memfit's FSDP1 terms.

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp1_units.py          # print
    PYTHONPATH=src .venv/bin/python benchmarks/fsdp1_units.py --write  # + results file

Runs torch's own FSDP1 (``FullyShardedDataParallel``, FULL_SHARD, ``use_orig_params=True``) on
two CPU processes (gloo) over a small transformers Llama (2 layers, sizes chosen so that no unit
divides evenly by the world size: FSDP1 pads) with peft LoRA on q and v, fp32 (``32-true``),
wrapped both ways memfit models (``--fsdp-lora-wrap``): ``block`` (each ``LlamaDecoderLayer``
one unit with its adapters, LitGPT's ``auto_wrap_policy={Block}``) and ``peft`` (peft's
``fsdp_auto_wrap_policy``, as HF Trainer installs it), and a full fine-tune. One micro-batch
under ``no_sync()`` and one synced. Per rank it records the bytes of every flat parameter's
gradient after each, and compares them with :func:`memfit.estimate.fsdp1.terms` for the same
config: ``held_grad_bytes`` (after the no_sync micro-batch) and the whole-flat-parameter
sharded gradients (after the synced one: ``frozen_grad_bytes`` plus the trainable shard FSDP2
would hold). tests/estimate/test_fsdp1.py runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "fsdp1_units.txt"
WORLD = 2
#: A Llama whose units do not divide by 2: hidden 50, vocab 251 (odd), intermediate 97.
CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 50,
    "intermediate_size": 97,
    "num_attention_heads": 5,
    "num_key_value_heads": 5,
    "num_hidden_layers": 2,
    "vocab_size": 251,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
CASES = ("block", "peft", "full")
LORA_RANK = 4


def _model(case: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    if case == "full":
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=LORA_RANK, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    return get_peft_model(model, lora)


def _wrap_policy(case: str, model: Any) -> Any:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    if case == "peft":
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(model)
    return ModuleWrapPolicy({LlamaDecoderLayer})


def _grad_bytes(model: Any) -> int:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    total = 0
    for m in model.modules():
        if isinstance(m, FSDP) and m._handle is not None:
            grad = m._handle.flat_param.grad  # FSDP1's FlatParameter of this unit
            total += 0 if grad is None else grad.numel() * grad.element_size()
    return total


def _worker(rank: int, port: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    out: dict[str, Any] = {}
    for case in CASES:
        model = _model(case)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        fsdp = FSDP(
            model,
            auto_wrap_policy=_wrap_policy(case, model),
            use_orig_params=True,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            device_id=torch.device("cpu"),
        )
        ids = torch.randint(0, CONFIG["vocab_size"], (2, 16))
        with fsdp.no_sync():
            fsdp(input_ids=ids, labels=ids).loss.backward()
        held = _grad_bytes(fsdp)
        fsdp(input_ids=ids, labels=ids).loss.backward()
        out[case] = {"trainable": trainable, "held": held, "synced": _grad_bytes(fsdp)}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
    dist.destroy_process_group()


def measure(port: str = "29547") -> dict[str, dict[str, Any]]:
    """Per case, per rank: the trainable count, the gradient bytes after the no_sync
    micro-batch (``held``) and after the synced one (``synced``)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(port, tmp), nprocs=WORLD)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {case: {"ranks": [r[case] for r in ranks]} for case in CASES}


def memfit_terms(case: str, trainable: int, config_dir: Path) -> dict[str, int]:
    """memfit's FSDP1 terms for ``case``: held unsharded and whole sharded gradient bytes."""
    from memfit.estimate.fsdp1 import fsdp2_grad_bytes, terms, units_of
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    lora: dict[str, Any] = {}
    if case != "full":
        lora = {"lora_rank": LORA_RANK, "lora_targets": ("q", "v"), "fsdp_lora_wrap": case}
    work = WorkloadSpec(
        gpus=WORLD,
        shard="fsdp",
        fsdp_version=1,
        grad_accum=2,
        precision="32-true",
        seq_len=16,
        **lora,
    )
    source = resolve_model(str(config_dir))
    units = units_of(source, work, trainable)
    t = terms(units, work, trainable)
    fsdp2 = -(-trainable // WORLD) * fsdp2_grad_bytes(work)
    return {"held": t.held_grad_bytes, "synced": t.frozen_grad_bytes + fsdp2}


def report(measured: dict[str, dict[str, Any]]) -> str:
    import torch

    lines = [f"torch {torch.__version__}, FSDP1 FULL_SHARD on {WORLD} CPU ranks (gloo), fp32"]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
        for case, got in measured.items():
            rank0 = got["ranks"][0]
            mine = memfit_terms(case, rank0["trainable"], Path(tmp))
            lines.append(
                f"{case}: trainable {rank0['trainable']}; after no_sync: measured "
                f"{[r['held'] for r in got['ranks']]} B per rank, memfit {mine['held']} B; "
                f"after the synced micro-batch: measured {[r['synced'] for r in got['ranks']]} "
                f"B, memfit {mine['synced']} B"
            )
    return "\n".join(lines) + "\n"


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
