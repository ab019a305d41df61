"""memfit's chunked / fused cross-entropy and host-RAM checkpoints against published peaks.

    PYTHONPATH=src .venv/bin/python benchmarks/loss_published.py

Prints the two tables of docs/accuracy.md "Chunked / fused cross-entropy and checkpoints in host
RAM": torchtune's README rows (pytorch/torchtune@bd2a0fc7c314 README.md 'Memory and training
speed': batch 2, packed 2048 tokens; torch's peak, compared with memfit's peak allocated less its
paged bytes) and Unsloth's T4 notebooks (unslothai/notebooks@bdda2efc7ad5, each notebook's saved
'Peak reserved memory = ... GB', torch.cuda.max_memory_reserved() / 1024**3, compared with
memfit's peak reserved). Analytic engine.
"""

from __future__ import annotations

from memfit.estimate import estimate
from memfit.spec import WorkloadSpec

GIB = 2**30
TT_FULL = {"optimizer": "paged-adamw-8bit", "optimizer_in_bwd": True}
TT_LORA = {"lora_rank": 8, "lora_targets": ("q", "v", "o", "gate", "up", "down")}
#: README row, published GiB, workload fields, GPU
TORCHTUNE = (
    ("full, 1x 4090", 18.9, TT_FULL, "RTX-4090"),
    ("full, 1x A6000", 37.4, TT_FULL, "RTX-A6000"),
    ("LoRA r8, 1x 4090", 16.2, {"optimizer": "adamw-fused", **TT_LORA}, "RTX-4090"),
    ("LoRA r8, 1x A6000", 30.3, {"optimizer": "adamw-fused", **TT_LORA}, "RTX-A6000"),
    ("QLoRA r8, 1x 4090", 7.4, {"optimizer": "adamw-fused", "quant": "nf4", **TT_LORA}, "RTX-4090"),
)  # fmt: skip
#: notebook, memfit model, published 'Peak reserved memory' (GiB)
UNSLOTH = (
    ("Llama3.1_(8B)-Alpaca", "llama-3.1-8b", 7.922),
    ("Llama3.2_(1B_and_3B)-Conversational", "llama-3.2-3b", 6.531),
    ("Qwen2.5_(7B)-Alpaca", "qwen2.5-7b", 7.893),
    ("Mistral_v0.3_(7B)-Conversational", "mistral-7b-v0.1", 6.289),
    ("Gemma2_(9B)-Alpaca", "gemma-2-9b", 9.383),
    ("Qwen3_(14B)-Alpaca", "qwen3-14b", 12.949),
)


def _err(value: float, published: float) -> str:
    return f"{value:.2f} ({(value / published - 1) * 100:+.1f} %)"


def torchtune_rows() -> list[str]:
    out = []
    for row, published, fields, gpu in TORCHTUNE:
        cells = []
        for loss in ("full", "chunked", "fused"):
            wl = WorkloadSpec(
                batch_size=2,
                seq_len=2048,
                precision="bf16-true",
                checkpointing="full",
                loss=loss,
                **fields,
            )
            est = estimate("llama-3.1-8b", wl, engine="analytic", gpu=gpu)
            resident = (est.peak_allocated_bytes - est.unified_memory_bytes) / GIB
            cells.append(_err(resident, published))
        out.append(f"| {row} | {published} GiB | " + " | ".join(cells) + " |")
    return out


def unsloth_rows() -> list[str]:
    out = []
    for notebook, model, published in UNSLOTH:
        cells = []
        for ckpt, loss in (("full", "full"), ("offload", "fused")):
            wl = WorkloadSpec(
                batch_size=2,
                seq_len=2048,
                grad_accum=4,
                zero_grad_set_to_none=False,
                precision="16-true",
                optimizer="adamw-8bit",
                checkpointing=ckpt,
                loss=loss,
                lora_rank=16,
                lora_targets=("q", "k", "v", "o", "gate", "up", "down"),
                quant="nf4-dq",
            )
            est = estimate(model, wl, engine="analytic", gpu="T4")
            cells.append(_err(est.peak_reserved_bytes / GIB, published))
        out.append(f"| {notebook} ({model}) | {published} GiB | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    print("| README row | published | --loss full | --loss chunked | --loss fused |")
    print("\n".join(torchtune_rows()))
    print()
    print("| notebook | published reserved | full ckpt, full loss | offload ckpt, fused loss |")
    print("\n".join(unsloth_rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
