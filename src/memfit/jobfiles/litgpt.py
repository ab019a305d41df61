"""LitGPT fine-tune YAML (config_hub/finetune/<model>/<method>.yaml of Lightning-AI/litgpt):
``checkpoint_dir``, ``precision`` (Lightning's names), ``quantize: bnb.nf4``, ``lora_r`` and the
``lora_query / key / value / projection / mlp / head`` switches, ``train.micro_batch_size``,
``train.global_batch_size``, ``train.max_seq_length``, ``devices``, ``optimizer``.

The estimate runs Hugging Face's implementation of the model: LitGPT's own ``GPT`` and its
bitsandbytes path quantize a different set of layers (issue 15 part 2) — said in the warnings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.jobfiles.hf import lora_dropout_of
from memfit.jobfiles.names import CLASS_OPTIMIZERS, MIXED, TRUE
from memfit.jobfiles.reader import KeyReader, Warning_, as_bool, as_int

LIGHTNING_PRECISION = {
    "bf16-true": TRUE["bf16"],
    "bf16-mixed": MIXED["bf16"],
    "16-true": TRUE["fp16"],
    "16-mixed": MIXED["fp16"],
    "32-true": TRUE["fp32"],
    "bf16": MIXED["bf16"],
    "16": MIXED["fp16"],
    "32": TRUE["fp32"],
}
LITGPT_QUANT = {
    "bnb.nf4": "nf4",
    "bnb.nf4-dq": "nf4-dq",
    "bnb.fp4": "fp4",
    "bnb.fp4-dq": "fp4",
    "bnb.int8": "int8",
}
LITGPT_NO_EFFECT = (
    "out_dir",
    "lora_alpha",
    "data",
    "train.save_interval",
    "train.log_interval",
    "train.lr_warmup_steps",
    "train.lr_warmup_fraction",
    "train.epochs",
    "train.max_tokens",
    "train.max_steps",
    "train.tie_embeddings",
    "train.max_norm",
    "train.min_lr",
    "eval",
    "logger_name",
    "seed",
    "access_token",
    "num_nodes",
    "optimizer.init_args",
    "resume",
    "log",
)


def _strategy(r: KeyReader, devices: Any) -> None:
    """LitGPT's finetune scripts on several devices (Lightning-AI/litgpt 26857050):
    ``finetune/full.py`` wraps each ``Block`` with Lightning's ``FSDPStrategy`` (FSDP1, FULL_SHARD,
    ``activation_checkpointing_policy={Block}``, gradient accumulation under
    ``fabric.no_backward_sync``); ``finetune/lora.py`` uses ``ModelParallelStrategy`` whose
    ``parallelize_fn`` applies ``fully_shard`` (FSDP2) per block with activation checkpointing."""
    r.set("shard", "fsdp", "devices", devices)
    r.set("checkpointing", "full", "devices", devices)
    if not r.has("lora_r"):
        r.set("fsdp_version", 1, "devices", devices)


def read_litgpt(r: KeyReader) -> None:
    r.set("mode", "train", "(a training config)", "train")
    ckpt = r.take("checkpoint_dir", None)
    if not isinstance(ckpt, str):
        raise r.fail("checkpoint_dir", ckpt, "must name the model's checkpoint folder")
    path = Path(ckpt).expanduser()
    if (path / "config.json").is_file():
        r.set("model", str(path), "checkpoint_dir", ckpt)
    else:  # checkpoints/<org>/<name>, as `litgpt download` lays them out
        parts = Path(ckpt).parts
        r.set("model", "/".join(parts[-2:]) if len(parts) >= 2 else ckpt, "checkpoint_dir", ckpt)
    prec = r.take("precision", "bf16-true")
    if prec not in LIGHTNING_PRECISION:
        raise r.fail("precision", prec, f"must be one of {', '.join(LIGHTNING_PRECISION)}")
    r.set("precision", LIGHTNING_PRECISION[prec], "precision", prec)
    quant = r.take("quantize", None)
    if quant is not None:
        if quant not in LITGPT_QUANT:
            raise r.fail("quantize", quant, f"must be one of {', '.join(LITGPT_QUANT)}")
        r.set("quant", LITGPT_QUANT[quant], "quantize", quant)
    if r.has("lora_r"):
        rank = r.take("lora_r")
        r.set("lora_rank", as_int(r, "lora_r", rank), "lora_r", rank)
        roles: list[str] = []
        for key, names in (
            ("lora_query", ["q"]),
            ("lora_key", ["k"]),
            ("lora_value", ["v"]),
            ("lora_projection", ["o"]),
            ("lora_mlp", ["gate", "up", "down"]),
        ):
            if as_bool(r, key, r.take(key, key in ("lora_query", "lora_value"))):
                roles += names
        if as_bool(r, "lora_head", r.take("lora_head", False)):
            r.warnings.append(
                Warning_(
                    key="lora_head", file=r.file, message="LoRA on the LM head is not modelled"
                )
            )
        r.set("lora_targets", tuple(roles), "lora_query", "…")
        if lora_dropout_of(r, "lora_dropout", "litgpt") > 0.0:
            r.warnings.append(
                Warning_(
                    key="lora_dropout",
                    file=r.file,
                    message="estimated with peft's LoRA dropout (an fp32 dropped copy and a mask "
                    "per adapted projection); LitGPT's LoRAQKVLinear drops the fused q/k/v input "
                    "once, in the model's dtype (litgpt/lora.py): it needs less than estimated",
                )
            )
    micro = r.take("train.micro_batch_size", 1)
    r.set("batch_size", as_int(r, "train.micro_batch_size", micro), "train.micro_batch_size", micro)
    devices = r.take("devices", 1)
    n = as_int(r, "devices", devices) if devices not in ("auto", -1) else 1
    n = r.gpus("devices", n, devices, "litgpt finetune --devices")
    if n > 1:
        _strategy(r, devices)
    glob = r.take("train.global_batch_size", None)
    if glob is not None:
        g = as_int(r, "train.global_batch_size", glob)
        m = as_int(r, "train.micro_batch_size", micro)
        r.set("grad_accum", max(1, g // (m * n)), "train.global_batch_size", glob)
    seq = r.take("train.max_seq_length", None)
    if seq is not None:
        r.set("seq_len", as_int(r, "train.max_seq_length", seq), "train.max_seq_length", seq)
    opt = r.take("optimizer", None) or r.take("optimizer.class_path", None)
    if isinstance(opt, str):
        path_ = opt if "." in opt else f"torch.optim.{opt}"
        name = r.class_optimizer("optimizer", path_, CLASS_OPTIMIZERS)
        r.set("optimizer", name, "optimizer", opt)
    r.warnings.append(
        Warning_(
            key="(framework)",
            file=r.file,
            message="estimated with Hugging Face's implementation of the model; LitGPT's own GPT "
            "and its bitsandbytes path quantize a different set of layers",
        )
    )
    r.no_effect(LITGPT_NO_EFFECT)
