"""A plan's settings as the user types them: memfit flags, transformers / peft / bitsandbytes
snippets, and a DeepSpeed JSON or accelerate FSDP config for multi-GPU (or offloading) jobs.

Names follow transformers ``TrainingArguments`` (``optim`` values: ``adamw_torch_fused``,
``adamw_bnb_8bit``, ``adafactor``), ``BitsAndBytesConfig``, peft ``LoraConfig``, the DeepSpeed
config reference (``zero_optimization.stage``, ``offload_optimizer``, ``offload_param``) and
accelerate's FSDP plugin keys.
"""

from __future__ import annotations

from typing import Any

from memfit.estimate.analytic.ops import COMPUTE_DTYPE
from memfit.estimate.analytic.quant_ops import QUANT_DTYPE
from memfit.flags import workload_flags
from memfit.jobfiles.names import HF_OPTIM_OF as HF_OPTIM  # the one table, both directions
from memfit.models.lora_targets import GROUPS, ROLES
from memfit.plan.request import PlanRequest
from memfit.plan.space import Settings
from memfit.serving.command import hub_id  # a bundled name is not a hub id vLLM can load
from memfit.spec import PRECISION_RULES


def memfit_flags(s: Settings, request: PlanRequest, model: str) -> str:
    """The ``memfit estimate`` command of one micro-batch of the plan; a training plan names its
    checkpointing and optimizer even where they are the defaults."""

    w = s.workload(request.mode, request.seq_len, request.new_tokens)
    explicit = ("checkpointing", "optimizer") if w.is_train else ()
    return f"memfit estimate {model} {workload_flags(w, explicit=explicit)}"


#: The 16-bit compute dtypes by the names HF Trainer, DeepSpeed and accelerate give them.
_HALF_NAME = {"bfloat16": "bf16", "float16": "fp16"}

#: ``bnb_4bit_compute_dtype`` per precision: the workload's compute dtype, as memfit's estimators
#: assume (the analytic engine's ``COMPUTE_DTYPE``, by torch name).
BNB_COMPUTE_DTYPE = {p: QUANT_DTYPE[d] for p, d in COMPUTE_DTYPE.items()}


def bnb_kwargs(s: Settings) -> dict[str, Any] | None:
    """``BitsAndBytesConfig`` keyword arguments (the compute dtype by its torch name), or None
    when the settings use no bitsandbytes format."""
    if s.quant in ("nf4", "nf4-dq", "fp4"):
        return {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "fp4" if s.quant == "fp4" else "nf4",
            "bnb_4bit_use_double_quant": s.quant == "nf4-dq",
            "bnb_4bit_compute_dtype": BNB_COMPUTE_DTYPE[s.precision],
        }
    if s.quant == "int8":
        return {"load_in_8bit": True}
    return None


def _bnb(s: Settings) -> str | None:
    kwargs = bnb_kwargs(s)
    if kwargs is None:
        return None
    if "bnb_4bit_compute_dtype" in kwargs:
        kwargs["bnb_4bit_compute_dtype"] = _Code("torch." + kwargs["bnb_4bit_compute_dtype"])
    return _call("BitsAndBytesConfig", kwargs)


class _Code(str):
    """A value rendered as code, unquoted (``torch.bfloat16``)."""


def _call(name: str, kwargs: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, _Code):
            return str(v)
        return f'"{v}"' if isinstance(v, str) else repr(v)

    return name + "(" + ", ".join(f"{k}={value(v)}" for k, v in kwargs.items()) + ")"


def training_arguments_kwargs(s: Settings) -> dict[str, Any]:
    """``TrainingArguments`` keyword arguments of the settings (``memfit.apply`` builds the real
    object from them; ``deepspeed`` names the file :func:`deepspeed_config` is written to)."""
    args: dict[str, Any] = {
        "per_device_train_batch_size": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
    }
    rule = PRECISION_RULES[s.precision]
    if rule.autocast:  # *-mixed: HF Trainer's bf16=True / fp16=True (autocast, fp32 masters)
        args[_HALF_NAME[rule.compute]] = True
    elif s.lora_rank is not None and rule.params != "float32":
        # LoRA on a 16-bit base: the Trainer still autocasts (peft's adapters are fp32)
        args[_HALF_NAME[rule.compute]] = True
    if s.checkpointing != "none":
        args["gradient_checkpointing"] = True
    args["optim"] = HF_OPTIM.get(s.optimizer, s.optimizer)
    if s.optimizer == "sgd-momentum":  # HF Trainer's SGD reads momentum from optim_args
        args["optim"], args["optim_args"] = "sgd", "momentum=0.9"
    if s.shard in ("zero1", "zero2", "zero3"):
        args["deepspeed"] = "ds_config.json"
    elif s.shard == "fsdp":
        args["fsdp"] = "full_shard auto_wrap" + (" offload" if s.offload != "none" else "")
    return args


def training_arguments(s: Settings) -> str:
    return _call("TrainingArguments", training_arguments_kwargs(s))


def deepspeed_config(s: Settings) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": int(s.shard[-1])}
    if s.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if s.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "zero_optimization": zero,
    }
    half = _HALF_NAME.get(PRECISION_RULES[s.precision].compute)
    if half:  # DeepSpeed's bf16 / fp16 optimizer: a 16-bit model, fp32 masters in its state
        cfg[half] = {"enabled": True}
    return cfg


def fsdp_config(s: Settings) -> dict[str, Any]:
    return {
        "distributed_type": "FSDP",
        "num_processes": s.gpus,
        "mixed_precision": _HALF_NAME.get(PRECISION_RULES[s.precision].compute, "no"),
        "fsdp_config": {
            "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_offload_params": s.offload != "none",
            "fsdp_activation_checkpointing": s.checkpointing != "none",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        },
    }


def _vllm(s: Settings, request: PlanRequest, model: str) -> str:
    cmd = [f"vllm serve {hub_id(model)}", f"--max-model-len {request.seq_len + request.new_tokens}"]
    cmd.append(f"--max-num-seqs {s.micro_batch}")
    if s.tp > 1:
        cmd.append(f"--tensor-parallel-size {s.tp}")
    if s.quant in ("fp8", "int4-awq", "int4-gptq"):
        method = "fp8" if s.quant == "fp8" else s.quant.split("-")[1]  # int4-awq -> awq
        cmd.append(f"--quantization {method}")
    elif s.quant != "none":
        cmd.append("--quantization bitsandbytes")
    if s.dp > 1:
        cmd.append(f"  # one server per {s.tp} GPU(s), {s.dp} replicas")
    return " ".join(cmd)


#: ``use_gradient_checkpointing`` of Unsloth's ``FastLanguageModel.get_peft_model`` for each
#: checkpointing memfit plans (unslothai/unsloth@015bdef0d94a ``unsloth/models/llama.py``:
#: ``"unsloth"`` is its offloaded checkpointing, ``True`` transformers' full recomputation).
UNSLOTH_CHECKPOINTING = {"offload": '"unsloth"', "full": "True", "none": "False"}


def _unsloth(s: Settings) -> str:
    """How Unsloth runs the settings: its loader's checkpointing switch."""
    ckpt = UNSLOTH_CHECKPOINTING.get(s.checkpointing)
    if ckpt is None:
        return (
            f"FastLanguageModel (Unsloth's kernels); checkpointing {s.checkpointing} is not an "
            'Unsloth option (its use_gradient_checkpointing takes "unsloth", True or False)'
        )
    lora = s.techniques.lora
    if lora is None:
        call = (
            "FastLanguageModel.from_pretrained(..., full_finetuning=True, "
            f"use_gradient_checkpointing={ckpt})"
        )
    else:
        call = (
            f"FastLanguageModel.get_peft_model(model, r={lora.rank}, "
            f'lora_dropout={lora.dropout:g}, bias="none", use_gradient_checkpointing={ckpt})'
        )
    return f"{call} (Unsloth's kernels; its fused CE runs whenever labels are given)"


def export_settings(s: Settings, request: PlanRequest, model: str) -> dict[str, Any]:
    """Every form of the settings; keys absent where they do not apply."""
    out: dict[str, Any] = {"memfit": memfit_flags(s, request, model)}
    bnb = _bnb(s)
    if bnb:
        out["bitsandbytes"] = bnb
    if s.quant in ("int4-awq", "int4-gptq"):
        out["weights"] = f"load a pre-quantized {s.quant.split('-')[1].upper()} checkpoint"
    if s.quant == "fp8" and request.mode == "train":
        out["weights"] = "fp8 frozen base weights (torchao Float8WeightOnlyConfig)"
    if request.mode == "infer":
        out["vllm"] = _vllm(s, request, model)
        return out
    rule = PRECISION_RULES[s.precision]
    if not rule.autocast and rule.params != "float32":  # bf16-true / 16-true
        dtype = f"torch.{rule.params}"
        if s.lora_rank is not None:
            out["model_dtype"] = (
                f"from_pretrained(..., dtype={dtype}) (the frozen base in 16 bits; peft keeps "
                "the adapters in fp32)"
            )
        else:
            out["model_dtype"] = f"from_pretrained(..., torch_dtype={dtype}) and no autocast"
    out["training_arguments"] = training_arguments(s)
    if s.checkpointing == "selective":
        out["checkpointing"] = (
            "selective activation checkpointing: torch.utils.checkpoint with "
            "create_selective_checkpoint_contexts saving every matmul output and recomputing "
            "the rest (memfit.apply.enable_checkpointing_(model, 'selective')); "
            "TrainingArguments offers only full checkpointing"
        )
    if s.checkpointing == "selective-layer":
        out["checkpointing"] = (
            'torchtitan activation_checkpoint.mode = "selective", selective_ac_option = '
            f'"{s.techniques.selective_ac_option}" (every such block checkpointed whole, the '
            "others not); TrainingArguments offers only full checkpointing"
        )
    if s.checkpointing == "selective-op":
        out["checkpointing"] = (
            'torchtitan activation_checkpoint.mode = "selective", selective_ac_option = "op" '
            "(every other matmul output and attention saved); TrainingArguments offers only "
            "full checkpointing"
        )
    lora = s.techniques.lora
    if lora is not None:
        targets = '"all-linear"' if lora.targets == "all-linear" else repr(list(lora.targets))
        saved = f", modules_to_save={list(lora.modules_to_save)!r}" if lora.modules_to_save else ""
        out["lora"] = (
            f"LoraConfig(r={lora.rank}, lora_alpha={2 * lora.rank}, "
            f'target_modules={targets}{saved}, task_type="CAUSAL_LM")'
        )
        roles = [t for t in lora.targets if t in ROLES or t in GROUPS]
        if lora.targets != "all-linear" and roles:
            out["lora"] += f"  # {', '.join(roles)}: roles, written as your model's module names"
    if s.kernels == "unsloth":
        out["unsloth"] = _unsloth(s)
    if s.prepare_kbit:
        out["prepare_kbit"] = (
            "prepare_model_for_kbit_training(model) before get_peft_model (what TRL's "
            "SFTTrainer calls; the estimate includes its fp32 casts)"
        )
    if s.techniques.optimizer_in_bwd:
        out["optimizer_in_bwd"] = (
            "one optimizer per parameter, stepped and zeroed in "
            "param.register_post_accumulate_grad_hook (torchtune: optimizer_in_bwd: True); "
            "HF Trainer has no such option: a custom training loop, gradient_accumulation_steps=1"
        )
    if s.shard in ("zero1", "zero2", "zero3"):
        out["deepspeed"] = deepspeed_config(s)
    elif s.shard == "fsdp":
        out["accelerate_fsdp"] = fsdp_config(s)
    if s.freeze_layers:
        out["freeze"] = (
            f"requires_grad_(False) on the embeddings and layers 0..{s.freeze_layers - 1}"
        )
    return out
