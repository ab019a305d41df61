"""Hugging Face ``TrainingArguments`` and TRL's ``SFTConfig`` / ``DPOConfig`` (with TRL's
``ModelConfig`` keys, which ``trl sft --config`` files carry in the same YAML), and LLaMA-Factory's
YAML (``TrainingArguments`` keys plus its own ``ModelArguments`` / ``FinetuningArguments``).

Names: transformers/training_args.py (5.x: ``activation_checkpointing`` with
``gradient_checkpointing`` as its alias), trl/trainer/sft_config.py (``max_length``, formerly
``max_seq_length``), trl/trainer/model_config.py, LLaMA-Factory's ``src/llamafactory/hparams/``.
"""

from __future__ import annotations

from typing import Any

from memfit.jobfiles.distributed import read_fsdp_state_dict_type
from memfit.jobfiles.llamafactory import llamafactory_precision_
from memfit.jobfiles.names import HF_OPTIMIZERS, MIXED, ROLE_OF_MODULE, TRUE
from memfit.jobfiles.reader import KeyReader, Warning_, as_bool, as_int, is_unset
from memfit.spec.rules import UNSLOTH_DEFAULTS

#: TrainingArguments keys that do not change the memory of a training step.
HF_NO_EFFECT = (
    "output_dir",
    "overwrite_output_dir",
    "do_train",
    "do_eval",
    "do_predict",
    "eval_strategy",
    "evaluation_strategy",
    "per_device_eval_batch_size",
    "eval_steps",
    "eval_accumulation_steps",
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "num_train_epochs",
    "max_steps",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_ratio",
    "warmup_steps",
    "logging_dir",
    "logging_strategy",
    "logging_first_step",
    "logging_steps",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "save_safetensors",
    "save_only_model",
    "seed",
    "data_seed",
    "run_name",
    "report_to",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
    "hub_token",
    "hub_private_repo",
    "dataloader_num_workers",
    "dataloader_pin_memory",
    "dataloader_drop_last",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "remove_unused_columns",
    "label_names",
    "load_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
    "disable_tqdm",
    "tf32",
    "ddp_timeout",
    "ddp_find_unused_parameters",
    "group_by_length",
    "length_column_name",
    "resume_from_checkpoint",
    "bf16_full_eval",
    "fp16_full_eval",
    "include_num_input_tokens_seen",
    "neftune_noise_alpha",
    "log_level",
    "gradient_checkpointing_kwargs",
    "activation_checkpointing_kwargs",
    "use_reentrant",
    "optim_args",
    "label_smoothing_factor",
    "warmup",
    "prediction_loss_only",
    "ignore_data_skip",
    "accelerator_config",
    "full_determinism",
    "torchdynamo",
    "ray_scope",
    "skip_memory_metrics",
    "average_tokens_across_devices",
    "project",
    "trackio_space_id",
    # TRL SFTConfig / DPOConfig / ModelConfig
    "dataset_text_field",
    "dataset_num_proc",
    "dataset_kwargs",
    "eos_token",
    "pad_token",
    "completion_only_loss",
    "assistant_only_loss",
    "chat_template_path",
    "dataset_name",
    "dataset_config",
    "dataset_train_split",
    "dataset_test_split",
    "lora_alpha",
    "lora_task_type",
    "use_rslora",
    "use_dora",
    "model_revision",
    "trust_remote_code",
    "beta",
    "loss_type",
    "label_pad_token_id",
    "truncation_mode",
    "rpo_alpha",
    "use_weighting",
    "max_prompt_length",
    "max_completion_length",
    "pad_to_multiple_of",
    "padding_free",
    # LLaMA-Factory
    "stage",
    "template",
    "dataset",
    "dataset_dir",
    "eval_dataset",
    "overwrite_cache",
    "preprocessing_num_workers",
    "max_samples",
    "val_size",
    "plot_loss",
    "ddp_timeout",
    "lora_target_modules_to_save",
    "pref_beta",
    "pref_loss",
    "trust_remote_code",
    "report_to",
    "lora_alpha",
    "cache_dir",
)


def precision_of(r: KeyReader) -> str:
    """``bf16`` / ``fp16`` booleans: autocast over the loaded weights (``MIXED``), else fp32."""
    bf16 = r.take("bf16", False)
    fp16 = r.take("fp16", False)
    if bf16 == "auto":  # axolotl: bf16 where the GPU supports it
        bf16 = True
    bf16 = False if bf16 is None else bf16  # an empty key (axolotl's `fp16:`) is unset
    fp16 = False if fp16 is None else fp16
    if as_bool(r, "bf16", bf16) and as_bool(r, "fp16", fp16):
        # transformers' TrainingArguments.__post_init__ refuses the pair the same way
        raise r.fail("fp16", fp16, "with bf16: true: at most one of bf16 and fp16 can be true")
    if as_bool(r, "bf16", bf16):
        r.set("precision", MIXED["bf16"], "bf16", bf16)
        return MIXED["bf16"]
    if as_bool(r, "fp16", fp16):
        r.set("precision", MIXED["fp16"], "fp16", fp16)
        return MIXED["fp16"]
    r.set("precision", TRUE["fp32"], "bf16", "false (default)")
    return TRUE["fp32"]


def optimizer_of(r: KeyReader, key: str) -> None:
    name = r.take(key)
    if not isinstance(name, str):
        raise r.fail(key, name, "must be an optimizer name such as adamw_torch")
    memfit_name = HF_OPTIMIZERS.get(name.lower())
    if memfit_name is None:
        r.warnings.append(
            r_warning(
                r,
                key,
                f"optimizer {name!r} is not modelled; estimated as AdamW (two fp32 "
                "states per trainable parameter), which may differ",
            )
        )
        r.set("optimizer", "adamw", key, name)
        return
    r.set("optimizer", memfit_name, key, name)


def r_warning(r: KeyReader, key: str, message: str) -> Any:
    return Warning_(key=key, file=r.file, message=message)


def targets_of(value: Any) -> tuple[str, ...] | str:
    """``lora_target_modules`` / ``lora_target`` as memfit's roles or module names."""
    if value in (None, "all", "all-linear", "all_linear") or value is True:
        return "all-linear"
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(v).strip() for v in items if str(v).strip()]
    return tuple(ROLE_OF_MODULE.get(n, n) for n in names)


def modules_to_save_of(r: KeyReader, key: str) -> None:
    """peft's ``modules_to_save`` under the framework's key (axolotl / TRL
    ``lora_modules_to_save``, LLaMA-Factory ``additional_target``): a list or a comma-separated
    string of module names; empty or null: none."""
    if not r.has(key):
        return
    value = r.take(key)
    if is_unset(value):
        return
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise r.fail(key, value, "must be a list of module names (e.g. [embed_tokens, lm_head])")
    names = tuple(str(v).strip() for v in items if str(v).strip())
    if names:
        r.set("lora_modules_to_save", names, key, value)


#: The frameworks' own ``lora_dropout`` default where a LoRA job file leaves it out: TRL
#: ``ModelConfig.lora_dropout = 0.05`` (huggingface/trl@f2cd5771 trl/trainer/model_config.py,
#: handed to ``LoraConfig`` by ``get_peft_config``, trl/trainer/utils.py); LitGPT
#: ``finetune/lora.py`` ``setup(lora_dropout=0.05)`` (Lightning-AI/litgpt@26857050);
#: axolotl's schema ``lora_dropout: float | None = 0.0`` (axolotl-ai-cloud/axolotl@067b021c
#: src/axolotl/utils/schemas/peft.py); LLaMA-Factory ``LoraArguments.lora_dropout = 0.0``
#: (hiyouga/LLaMA-Factory@00577a85 src/llamafactory/hparams/finetuning_args.py); torchtune's
#: builders ``lora_dropout: float = 0.0`` (pytorch/torchtune@bd2a0fc7
#: torchtune/models/llama3_1/_model_builders.py).
LORA_DROPOUT_DEFAULT = {
    "trl": 0.05,
    "litgpt": 0.05,
    "axolotl": 0.0,
    "llamafactory": 0.0,
    "torchtune": 0.0,
}


def lora_dropout_of(r: KeyReader, key: str, framework: str) -> float:
    """peft's ``LoraConfig.lora_dropout`` under the framework's ``key`` (the framework's own
    default, :data:`LORA_DROPOUT_DEFAULT`, where the file leaves it out; an empty key or null is
    0, as peft's ``nn.Identity``), set as ``lora_dropout`` when above 0; the value read."""
    default = LORA_DROPOUT_DEFAULT[framework]
    value = r.take(key, default)
    if value is None or value == "":
        value = 0.0
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise r.fail(key, value, "must be a probability in [0, 1) (peft's LoraConfig.lora_dropout)")
    try:
        p = float(value)
    except ValueError:
        raise r.fail(
            key, value, "must be a probability in [0, 1) (peft's LoraConfig.lora_dropout)"
        ) from None
    if not 0.0 <= p < 1.0:
        raise r.fail(key, value, "must be a probability in [0, 1) (peft's LoraConfig.lora_dropout)")
    if p > 0.0:
        r.set("lora_dropout", p, key, value)
    return p


def read_shape_and_steps(r: KeyReader, *, seq_keys: tuple[str, ...]) -> None:
    r.int_key("per_device_train_batch_size", "batch_size")
    r.int_key("gradient_accumulation_steps", "grad_accum")
    for key in seq_keys:
        if r.has(key):
            v = r.take(key)
            if v is not None:
                r.set("seq_len", as_int(r, key, v), key, v)
            break
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        if r.has(key):
            v = r.take(key)
            if v is not None:
                on = as_bool(r, key, v)
                r.set("checkpointing", "full" if on else "none", key, v)
                break
    if r.has("optim"):
        optimizer_of(r, "optim")
    attention_of(r, "attn_implementation")


def attention_of(r: KeyReader, key: str) -> None:
    if not r.has(key):
        return
    v = r.take(key)
    table = {
        "eager": "eager",
        "sdpa": "sdpa",
        "flash_attention_2": "flash",
        "flash_attention_3": "flash",
        "fa2": "flash",
        "disabled": "eager",
        "auto": "sdpa",
    }
    if isinstance(v, str) and v in table:
        r.set("attention", table[v], key, v)
    else:
        r.not_modelled(key, f"attention {v!r} is not modelled; estimated with sdpa")


def read_hf_common(r: KeyReader) -> None:
    """The ``TrainingArguments`` keys every Hugging Face-based format shares."""
    r.set("mode", "train", "(a training config)", "train")
    read_shape_and_steps(r, seq_keys=("max_length", "max_seq_length", "cutoff_len"))
    precision_of(r)
    compile_of(r, "torch_compile")
    compile_options_of(r)
    r.not_modelled(
        "packing",
        "packing fills every sample to the full length: the estimate "
        "uses the full sequence length, which is right for packed batches",
    )
    read_trainer_fsdp(r)
    r.not_modelled("precompute_ref_log_probs", "DPO without a reference model in memory")
    r.not_modelled("gradient_checkpointing_kwargs", "non-default checkpointing options")
    liger_loss_of(r, "use_liger_kernel")


def compile_of(r: KeyReader, key: str) -> None:
    """A job file's torch.compile switch (HF ``torch_compile``, axolotl ``torch_compile``,
    torchtune ``compile``) as memfit's ``compile`` field: AOTAutograd's saved set where it is
    measured (estimate/analytic/compile.py), the eager estimate with a note where it is not."""
    if r.has(key):
        v = r.take(key)
        r.set("compile", as_bool(r, key, v), key, v)


#: TrainingArguments' torch.compile options (axolotl spells them the same) and the value memfit
#: models: the measured saved set is inductor's default mode; CUDA-graph modes add static input
#: / output buffers and a graph pool, another backend another partitioner.
COMPILE_OPTIONS = (
    ("torch_compile_backend", "inductor", "torch.compile backend {!r} is not modelled"),
    (
        "torch_compile_mode",
        "default",
        "torch.compile mode {!r} (CUDA graphs' static buffers and pool) is not modelled",
    ),
)


def compile_options_of(r: KeyReader) -> None:
    """``torch_compile_backend`` / ``torch_compile_mode``: read where they are what memfit
    models (or unset), a "not modelled" warning otherwise."""
    for key, modelled, message in COMPILE_OPTIONS:
        value = r.flat.get(key)
        if key in r.flat and value not in (None, "", modelled):
            r.not_modelled(key, message.format(value))
        else:
            r.take(key, None)


def unsloth_of(r: KeyReader, key: str) -> None:
    """LLaMA-Factory's ``use_unsloth: true`` on a LoRA job loads the model with Unsloth's
    ``FastLanguageModel`` and adds the adapters with ``get_peft_model(...,
    use_gradient_checkpointing="unsloth")`` whatever the file says about checkpointing
    (hiyouga/LlamaFactory@355d5c5e ``src/llamafactory/model/model_utils/unsloth.py``
    ``get_unsloth_peft_model``): Unsloth's kernels (``kernels: unsloth``), its offloaded
    checkpoints and, from the patched model's forward, its fused CE (rules.UNSLOTH_DEFAULTS)."""
    value = r.take(key)
    r.set("kernels", "unsloth", key, value)
    for field_, default in UNSLOTH_DEFAULTS:
        r.drop_setting(field_)
        r.set(field_, default, key, value)


def liger_loss_of(r: KeyReader, key: str) -> None:
    """``TrainingArguments(use_liger_kernel=True)`` / LLaMA-Factory's ``enable_liger_kernel``
    patch the model with Liger's kernels, whose default includes the fused linear cross-entropy
    (linkedin/Liger-Kernel@ead96b61 src/liger_kernel/transformers/monkey_patch.py,
    ``apply_liger_kernel_to_llama(fused_linear_cross_entropy=True)``): memfit's ``loss: fused``.
    Its other kernels (RMSNorm, SwiGLU, RoPE) are not modelled."""
    if r.has(key) and as_bool(r, key, r.flat.get(key)):
        r.set("loss", "fused", key, r.take(key))
    elif r.has(key):
        r.take(key)


def read_trl_model(r: KeyReader) -> None:
    """TRL ``ModelConfig`` keys: model, dtype, peft, bitsandbytes."""
    for key in ("model_name_or_path", "model_name"):
        if r.has(key):
            r.set("model", str(r.take(key)), key)
            break
    for key in LOAD_DTYPE_KEYS:
        if r.has(key):
            r.take(key)  # the load dtype: read by read_hf with bf16 / fp16
    use_peft = as_bool(r, "use_peft", r.take("use_peft", False))
    four = as_bool(r, "load_in_4bit", r.take("load_in_4bit", False))
    eight = as_bool(r, "load_in_8bit", r.take("load_in_8bit", False))
    if use_peft or r.has("lora_r"):
        rank = r.take("lora_r", 16)  # TRL ModelConfig default
        r.set("lora_rank", as_int(r, "lora_r", rank), "lora_r", rank)
        if r.has("lora_target_modules"):
            v = r.take("lora_target_modules")
            r.set("lora_targets", targets_of(v), "lora_target_modules", v)
        modules_to_save_of(r, "lora_modules_to_save")  # TRL ModelConfig
        lora_dropout_of(r, "lora_dropout", "trl")
    if four:
        qt = r.take("bnb_4bit_quant_type", "nf4")
        dq = as_bool(r, "use_bnb_nested_quant", r.take("use_bnb_nested_quant", False))
        quant = "fp4" if qt == "fp4" else ("nf4-dq" if dq else "nf4")
        r.set("quant", quant, "load_in_4bit", True)
        r.set(
            "prepare_kbit", True, "load_in_4bit", True
        )  # SFTTrainer's prepare_model_for_kbit_training
    elif eight:
        r.set("quant", "int8", "load_in_8bit", True)


#: Where a config names the dtype the base model is loaded in: TRL's ``ModelConfig.dtype``
#: (``torch_dtype`` before TRL 0.22; trl/trainer/model_config.py), ``SFTConfig.model_init_kwargs``
#: (the kwargs of ``from_pretrained``, whose ``dtype`` replaced ``torch_dtype`` in transformers
#: 4.56). Any of them next to ``bf16`` / ``fp16`` is one reading: weights in that dtype, autocast.
LOAD_DTYPE_KEYS = (
    "dtype",
    "torch_dtype",
    "model_init_kwargs.dtype",
    "model_init_kwargs.torch_dtype",
)
HALF = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16"}
FULL = ("float32", "fp32", "float")


def _load_dtype(r: KeyReader) -> tuple[str, Any] | None:
    """The load dtype the file names (key, value), or None; two keys that name different
    dtypes are refused (``auto`` / empty defer to the other)."""
    found = [(k, r.flat[k]) for k in LOAD_DTYPE_KEYS if k in r.flat and not is_unset(r.flat[k])]
    named = {_dtype_name(v) for _, v in found if str(v) != "auto"}
    if len(named) > 1:
        (k1, v1), (k2, v2) = (
            found[0],
            next(f for f in found if _dtype_name(f[1]) != _dtype_name(found[0][1])),
        )
        raise r.fail(k2, v2, f"contradicts {k1}: {v1!r}: the model is loaded in one dtype")
    return found[0] if found else None


def _dtype_name(value: Any) -> str:
    name = str(value).removeprefix("torch.")
    return HALF.get(name) or ("fp32" if name in FULL else name)


def read_hf(r: KeyReader) -> None:
    read_trl_model(r)
    read_hf_common(r)
    load = _load_dtype(r)
    precision = next(s for s in reversed(r.settings) if s.field == "precision")
    half = HALF.get(str(load[1]).removeprefix("torch.")) if load is not None else None
    if load is not None and half is not None:
        # the base model is loaded in half precision (from_pretrained's dtype / torch_dtype, or
        # TRL's model_init_kwargs): the optimizer holds those weights (and its states) in that
        # dtype, and bf16 / fp16 autocast over them is pure half-precision training: one
        # precision, *-true. The flag says only the autocast dtype, so the pair is one reading,
        # not a disagreement (LoRA adapters: peft keeps them in fp32, which the engines model).
        r.drop_setting("precision")
        r.set("precision", TRUE[half], load[0], load[1])
    elif load is None or str(load[1]) in ("auto", "None"):
        r.warnings.append(
            r_warning(
                r,
                "bf16" if precision.value != TRUE["fp32"] else "dtype",
                f"estimated as {precision.value}: fp32 weights, as TRL loads a model it is given "
                "by name (ModelConfig / model_init_kwargs dtype defaults to float32, "
                "huggingface/trl#4778). Your own from_pretrained under transformers 5 loads the "
                "checkpoint's dtype (bf16 for most), which trains in pure bf16 and needs about "
                "half the weight + optimizer memory: pass --precision bf16-true (or set dtype: "
                "bfloat16 here) if that is your run",
            )
        )
    if r.has("deepspeed") and not isinstance(r.flat.get("deepspeed"), str):
        r.take("deepspeed")  # an inline DeepSpeed dict: read by the combiner
    r.no_effect(HF_NO_EFFECT)


def read_llamafactory(r: KeyReader) -> None:
    if r.has("model_name_or_path"):
        r.set("model", str(r.take("model_name_or_path")), "model_name_or_path")
    read_hf_common(r)
    kind = r.take("finetuning_type", "lora")  # LLaMA-Factory's default
    if kind == "lora":
        rank = r.take("lora_rank", 8)
        r.set("lora_rank", as_int(r, "lora_rank", rank), "lora_rank", rank)
        target = r.take("lora_target", "all")
        r.set("lora_targets", targets_of(target), "lora_target", target)
        modules_to_save_of(r, "additional_target")
        lora_dropout_of(r, "lora_dropout", "llamafactory")
    elif kind == "freeze":
        n = r.take("freeze_trainable_layers", 2)
        r.not_modelled("freeze_trainable_modules", "which modules stay trainable")
        r.set(
            "freeze_layers", -as_int(r, "freeze_trainable_layers", n), "freeze_trainable_layers", n
        )
    elif kind != "full":
        raise r.fail("finetuning_type", kind, "must be lora, freeze or full")
    bits = r.take("quantization_bit", None)
    if bits is not None:
        method = r.take("quantization_method", "bnb")
        if method != "bnb":
            r.not_modelled("quantization_method", f"{method} on-the-fly quantization")
        bits = as_int(r, "quantization_bit", bits)
        if bits == 4:
            qtype = r.take("quantization_type", "nf4")
            dq = as_bool(r, "double_quantization", r.take("double_quantization", True))
            quant = "fp4" if qtype == "fp4" else ("nf4-dq" if dq else "nf4")
            r.set("quant", quant, "quantization_bit", bits)
        elif bits == 8:
            r.set("quant", "int8", "quantization_bit", bits)
        else:
            raise r.fail("quantization_bit", bits, "must be 4 or 8 with bitsandbytes")
    attention_of(r, "flash_attn")
    if r.has("disable_gradient_checkpointing"):
        off = as_bool(r, "disable_gradient_checkpointing", r.take("disable_gradient_checkpointing"))
        r.set("checkpointing", "none" if off else "full", "disable_gradient_checkpointing", off)
    if r.has("pure_bf16") and as_bool(r, "pure_bf16", r.take("pure_bf16")):
        r.drop_setting("precision")
        r.set("precision", TRUE["bf16"], "pure_bf16", True)
    llamafactory_precision_(r, kind, quantized=bits is not None)
    liger_loss_of(r, "enable_liger_kernel")
    unsloth = r.has("use_unsloth") and as_bool(r, "use_unsloth", r.flat["use_unsloth"])
    if unsloth and kind == "lora":
        unsloth_of(r, "use_unsloth")
    for key, what in (
        ("use_unsloth", "Unsloth's kernels without LoRA (its full fine-tuning path)"),
        ("use_galore", "GaLore projected optimizer states"),
        ("use_badam", "BAdam block-wise optimizer"),
    ):
        if key == "use_unsloth" and kind == "lora":
            if not unsloth and r.has(key):
                r.take(key)
            continue  # use_unsloth: true is read above (unsloth_of)
        if r.has(key) and as_bool(r, key, r.flat[key]):
            r.not_modelled(key, what + " is not modelled")
        elif r.has(key):
            r.take(key)
    r.no_effect(HF_NO_EFFECT)


#: TrainingArguments' ``fsdp`` words onto memfit's shard (accelerate's strategy names, as
#: ``distributed.read_accelerate`` maps them; ``auto_wrap`` is the block wrap memfit assumes).
TRAINER_FSDP_SHARDS = {
    "full_shard": "fsdp",
    "hybrid_shard": "fsdp",
    "shard_grad_op": "zero2",
    "no_shard": "ddp",
}


#: ``fsdp_config`` keys that leave memfit's per-rank answer as it is: the wrap policy (memfit
#: wraps each decoder block, as ``transformer_layer_cls_to_wrap`` / ``_no_split_modules`` do),
#: prefetch and rate limiting (:mod:`memfit.estimate.fsdp1`: the same two units in flight),
#: how states are saved or loaded.
TRAINER_FSDP_NO_EFFECT = (
    "transformer_layer_cls_to_wrap",
    "min_num_params",
    "backward_prefetch",
    "forward_prefetch",
    "limit_all_gathers",
    "sync_module_states",
    "use_orig_params",
    "cpu_ram_efficient_loading",
    "reshard_after_forward",
)


def read_trainer_fsdp(r: KeyReader) -> None:
    """HF Trainer's ``fsdp`` (``"full_shard auto_wrap"``, a list, or True) and
    ``fsdp_config.version``: FSDP2 unless the version is 1 (transformers 5.23
    ``training_args.py``: ``version = int(fsdp_config.get("version", 2))``; transformers 4.x ran
    FSDP1 only). The process count comes from the launcher (accelerate config or ``--gpus``)."""
    raw = r.take("fsdp", None) if r.has("fsdp") else None
    if is_unset(raw):
        r.not_modelled("fsdp_config", "FSDP options without fsdp set")
        return
    items = raw.split() if isinstance(raw, str) else ["full_shard"] if raw is True else raw
    if not isinstance(items, list):
        raise r.fail("fsdp", raw, 'must be FSDP options ("full_shard auto_wrap"), a list or true')
    words = [str(i).lower() for i in items]
    shards = [TRAINER_FSDP_SHARDS[w] for w in words if w in TRAINER_FSDP_SHARDS]
    shard = shards[0] if shards else "fsdp"
    r.set("shard", shard, "fsdp", raw)
    if "offload" in words:
        r.set("offload", "params", "fsdp", raw)
    version = r.take("fsdp_config.version", 2) if r.has("fsdp_config.version") else 2
    version = as_int(r, "fsdp_config.version", version)
    if version == 1 and shard == "fsdp":
        r.set("fsdp_version", 1, "fsdp_config.version", version)
    # transformers' TrainingArguments: fsdp_plugin_args["state_dict_type"] =
    # fsdp_config.get("state_dict_type", "FULL_STATE_DICT"), saved by accelerate's save_fsdp_model
    read_fsdp_state_dict_type(r, "fsdp_config.state_dict_type", version, shard)
    ac = "fsdp_config.activation_checkpointing"
    if r.has(ac) and as_bool(r, ac, r.take(ac)):
        r.set("checkpointing", "full", ac, True)
    r.no_effect(tuple(f"fsdp_config.{k}" for k in TRAINER_FSDP_NO_EFFECT))
    for key in [k for k in r.flat if k.startswith("fsdp_config.") and k not in r.used]:
        r.not_modelled(key, "an FSDP option memfit does not model")
