"""torchtune recipe YAML (recipes/configs/<model>/<recipe>.yaml of pytorch/torchtune) and the
``key=value`` overrides ``tune run`` takes on its command line.

torchtune trains in the dtype it loads (``dtype: bf16`` is pure bf16: no fp32 master weights), its
``qlora_*`` builders store the base weights in its own NF4 tensors, ``lora_attn_modules`` names
``q_proj, k_proj, v_proj, output_proj`` and ``apply_lora_to_mlp`` adds ``w1, w2, w3``. The model
comes from the builder name (``torchtune.models.llama3_1.lora_llama3_1_8b``) or from
``checkpointer.checkpoint_dir`` when that folder holds a ``config.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.jobfiles import yaml_load
from memfit.jobfiles.hf import compile_of, lora_dropout_of
from memfit.jobfiles.names import CLASS_OPTIMIZERS, ROLE_OF_MODULE, TORCHTUNE_MODELS, TRUE
from memfit.jobfiles.reader import KeyReader, Warning_, as_bool, as_int

#: torchtune losses that run the output projection and cross-entropy in chunks of tokens
#: (pytorch/torchtune@bd2a0fc7c314 torchtune/modules/loss/cross_entropy_loss.py,
#: ce_chunked_output_loss.py): memfit's ``loss: chunked``
CHUNKED_LOSSES = ("LinearCrossEntropyLoss", "CEWithChunkedOutputLoss")
TORCHTUNE_NO_EFFECT = (
    "output_dir",
    "tokenizer._component_",
    "tokenizer.path",
    "tokenizer.prompt_template",
    "checkpointer._component_",
    "checkpointer.checkpoint_files",
    "checkpointer.recipe_checkpoint",
    "checkpointer.output_dir",
    "checkpointer.model_type",
    "resume_from_checkpoint",
    "save_adapter_weights_only",
    "dataset",
    "seed",
    "shuffle",
    "lr_scheduler",
    "loss._component_",
    "epochs",
    "max_steps_per_epoch",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "log_level",
    "profiler",
    "model.lora_alpha",
    "optimizer.lr",
    "optimizer.weight_decay",
    "optimizer.betas",
    "optimizer.eps",
    "device",
    "clip_grad_norm",
    "collate_fn",
    "tokenizer.max_seq_len_hint",
    "run_val_every_n_steps",
    "dataset_val",
)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``tune run``'s ``key=value`` overrides (dotted keys, YAML values) applied to ``data``."""

    out: dict[str, Any] = _copy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"override {item!r} must be key=value (e.g. batch_size=4)")
        try:
            value = yaml_load.safe_load(text, f"override {key.strip()}") if text else None
        except SpecError:
            value = text
        node = out
        *parents, leaf = key.strip().split(".")
        for p in parents:
            child = node.get(p)
            if not isinstance(child, dict):
                child = node[p] = {}
            node = child
        node[leaf] = value
    return out


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    return data


def read_torchtune(r: KeyReader) -> None:
    r.set("mode", "train", "(a training config)", "train")
    component = r.take("model._component_", None)
    if not isinstance(component, str):
        raise r.fail("model._component_", component, "must name a torchtune model builder")
    builder = component.rsplit(".", 1)[-1]
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    ckpt = r.take("checkpointer.checkpoint_dir", None)
    if isinstance(ckpt, str) and (Path(ckpt).expanduser() / "config.json").is_file():
        r.set("model", str(Path(ckpt).expanduser()), "checkpointer.checkpoint_dir", ckpt)
    elif base in TORCHTUNE_MODELS:
        r.set("model", TORCHTUNE_MODELS[base], "model._component_", component)
    else:
        raise r.fail(
            "model._component_",
            component,
            "is a builder memfit has no hub id for; point checkpointer.checkpoint_dir at a "
            "folder with the model's config.json, or pass the model on the command line",
        )
    if builder.startswith(("lora_", "qlora_")):
        rank = r.take("model.lora_rank", 8)
        r.set("lora_rank", as_int(r, "model.lora_rank", rank), "model.lora_rank", rank)
        attn = r.take("model.lora_attn_modules", ["q_proj", "v_proj"])
        roles = [ROLE_OF_MODULE.get(str(m), str(m)) for m in (attn or [])]
        if as_bool(r, "model.apply_lora_to_mlp", r.take("model.apply_lora_to_mlp", False)):
            roles += ["gate", "up", "down"]
        if as_bool(r, "model.apply_lora_to_output", r.take("model.apply_lora_to_output", False)):
            r.warnings.append(
                Warning_(
                    key="model.apply_lora_to_output",
                    file=r.file,
                    message="LoRA on the output projection is not modelled",
                )
            )
        r.set("lora_targets", tuple(roles), "model.lora_attn_modules", attn)
        # torchtune's LoRALinear: ``lora_a(self.dropout(x))`` on x in the model's dtype
        # (torchtune/modules/peft/lora.py at bd2a0fc7); estimated as peft's, which drops an fp32
        # copy (adapters kept in fp32): the estimate is the higher of the two
        lora_dropout_of(r, "model.lora_dropout", "torchtune")
    if builder.startswith("qlora_"):
        # torchao's NF4Tensor: blocks of 64 with the block scales themselves quantized (blocks
        # of 256), which is bitsandbytes' double quantization in all but name
        r.set("quant", "nf4-dq", "model._component_", component)
    dtype = r.take("dtype", "bf16")
    table = {"bf16": TRUE["bf16"], "fp32": TRUE["fp32"], "fp16": TRUE["fp16"]}
    if dtype not in table:
        raise r.fail("dtype", dtype, "must be bf16, fp16 or fp32")
    r.set("precision", table[dtype], "dtype", dtype)
    for key, field in (("batch_size", "batch_size"), ("gradient_accumulation_steps", "grad_accum")):
        if r.has(key):
            v = r.take(key)
            r.set(field, as_int(r, key, v), key, v)
    seq = r.take("tokenizer.max_seq_len", None)
    if seq is not None:
        r.set("seq_len", as_int(r, "tokenizer.max_seq_len", seq), "tokenizer.max_seq_len", seq)
    if r.has("enable_activation_checkpointing"):
        v = r.take("enable_activation_checkpointing")
        on = as_bool(r, "enable_activation_checkpointing", v)
        r.set("checkpointing", "full" if on else "none", "enable_activation_checkpointing", v)
    opt = r.take("optimizer._component_", None)
    if isinstance(opt, str):
        name = r.class_optimizer("optimizer._component_", opt, CLASS_OPTIMIZERS)
        if name == "adamw" and as_bool(r, "optimizer.fused", r.take("optimizer.fused", False)):
            name = "adamw-fused"
        r.set("optimizer", name, "optimizer._component_", opt)
    if r.has("optimizer_in_bwd"):
        # full_finetune_single_device: one optimizer per parameter, stepped in its
        # post-accumulate-grad hook (training.register_optim_in_bwd_hooks)
        v = r.take("optimizer_in_bwd")
        r.set("optimizer_in_bwd", as_bool(r, "optimizer_in_bwd", v), "optimizer_in_bwd", v)
    compile_of(r, "compile")
    loss = r.flat.get("loss._component_")
    if isinstance(loss, str) and loss.rsplit(".", 1)[-1] in CHUNKED_LOSSES:
        # the LM head and cross-entropy a chunk of tokens at a time (estimate/analytic/loss.py)
        r.set("loss", "chunked", "loss._component_", r.take("loss._component_"))
    for key, what in (
        ("enable_activation_offloading", "activation offloading to the CPU"),
        ("fsdp_cpu_offload", "FSDP CPU offload"),
        ("loss._component_", "this loss"),
        ("dataset.packed", "packed samples fill max_seq_len (the estimate uses the full length)"),
    ):
        value = r.flat.get(key)
        if key not in r.flat:
            continue
        if value in (False, None) or (key == "loss._component_" and "." in str(value)):
            r.take(key)
        else:
            r.not_modelled(key, what + " is not modelled")
    r.no_effect(TORCHTUNE_NO_EFFECT)
