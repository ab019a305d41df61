"""axolotl's YAML (docs/config-reference.qmd of axolotl-ai-cloud/axolotl): ``base_model``,
``micro_batch_size``, ``sequence_len``, ``adapter: lora|qlora``, ``load_in_4bit``, ``lora_r``,
``lora_target_modules`` / ``lora_target_linear``, ``optimizer``, ``bf16: auto``,
``gradient_checkpointing``, ``flash_attention`` / ``sdp_attention``, ``deepspeed``, ``fsdp``.

axolotl trains through Hugging Face's Trainer, so its keys map onto the same settings; a QLoRA
adapter loads NF4 with double quantization (axolotl's ``bnb_4bit_use_double_quant`` default).
It goes through peft's ``prepare_model_for_kbit_training``, which casts every non-quantized
parameter to fp32, but axolotl casts the norms and the embedding modules (``embed_tokens``,
``lm_head``) back to ``torch_dtype`` for every adapter job before the LoRA layers are added
(axolotl-ai-cloud/axolotl@067b021c8 ``src/axolotl/loaders/model.py``
``_configure_embedding_dtypes``: ``needs_fa2_dtype`` is True for ``lora`` / ``qlora``, then
``_convert_embedding_modules_dtype(..., dist_dtype=self.cfg.torch_dtype)``; with FSDP or ZeRO-3
it skips ``prepare_model_for_kbit_training`` altogether): the base trains in its 16-bit dtype,
so a file is read without ``prepare_kbit`` (memfit's fp32 non-quantized parameters).
"""

from __future__ import annotations

from memfit.jobfiles.hf import (
    attention_of,
    compile_of,
    compile_options_of,
    lora_dropout_of,
    modules_to_save_of,
    optimizer_of,
    precision_of,
    targets_of,
)
from memfit.jobfiles.names import MIXED, TRUE
from memfit.jobfiles.reader import KeyReader, as_bool, as_int, is_unset

AXOLOTL_NO_EFFECT = (
    "base_model_config",
    "model_type",
    "tokenizer_type",
    "tokenizer_config",
    "strict",
    "datasets",
    "test_datasets",
    "dataset_prepared_path",
    "val_set_size",
    "output_dir",
    "lora_alpha",
    "lora_fan_in_fan_out",
    "lora_model_dir",
    "wandb_project",
    "wandb_entity",
    "wandb_watch",
    "wandb_name",
    "wandb_log_model",
    "wandb_mode",
    "num_epochs",
    "max_steps",
    "lr_scheduler",
    "learning_rate",
    "train_on_inputs",
    "group_by_length",
    "tf32",
    "early_stopping_patience",
    "resume_from_checkpoint",
    "local_rank",
    "logging_steps",
    "warmup_steps",
    "warmup_ratio",
    "evals_per_epoch",
    "eval_steps",
    "saves_per_epoch",
    "save_steps",
    "debug",
    "weight_decay",
    "special_tokens",
    "tokens",
    "chat_template",
    "eval_sample_packing",
    "hub_model_id",
    "seed",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "save_total_limit",
    "eval_table_size",
    "eval_max_new_tokens",
    "s2_attention",
    "gradient_checkpointing_kwargs",
    "plugins",
    "rl",
    "shuffle_merged_datasets",
    "loss_watchdog_threshold",
    "loss_watchdog_patience",
    "dataset_processes",
    "pad_to_sequence_len",
    "save_safetensors",
    "is_llama_derived_model",
    "is_mistral_derived_model",
    "trust_remote_code",
    "bnb_4bit_compute_dtype",
)


#: axolotl keys that replace the LM head's cross-entropy by a fused, chunked one
#: (axolotl-ai-cloud/axolotl@067b021c src/axolotl/integrations/liger/args.py,
#: src/axolotl/integrations/cut_cross_entropy/): memfit's ``loss: fused``
FUSED_LOSS_KEYS = ("liger_fused_linear_cross_entropy", "cut_cross_entropy")


def _precision(r: KeyReader) -> None:
    """axolotl loads the base model in the dtype its ``resolve_dtype`` derives from the flags
    (src/axolotl/utils/config/__init__.py, axolotl-ai-cloud/axolotl@70be546): bfloat16 when
    ``bf16`` (``auto``: where the GPU has bf16) or ``bfloat16``; float16 when ``fp16``,
    ``float16`` or ``load_in_8bit``; else float32 — and the Trainer's ``bf16`` / ``fp16``
    autocast runs over those weights. A half-precision base is pure half-precision training
    (``bf16-true`` / ``16-true``: the optimizer holds the weights it was given; LoRA adapters
    are fp32, as the engines model)."""
    mixed = precision_of(r)
    flags = {k: r.take(k) for k in ("bfloat16", "float16") if r.has(k)}
    on = {k for k, v in flags.items() if not is_unset(v) and as_bool(r, k, v)}
    eight = r.flat.get("load_in_8bit")
    if mixed == MIXED["bf16"] or "bfloat16" in on:
        key = "bf16" if mixed == MIXED["bf16"] else "bfloat16"
        half = "bf16"
    elif mixed == MIXED["fp16"] or "float16" in on or eight is True:
        key = (
            "fp16" if mixed == MIXED["fp16"] else ("float16" if "float16" in on else "load_in_8bit")
        )
        half = "fp16"
    else:
        return
    r.drop_setting("precision")
    r.set("precision", TRUE[half], key, r.flat.get(key))


def read_axolotl(r: KeyReader) -> None:
    r.set("mode", "train", "(a training config)", "train")
    if r.has("base_model"):
        r.set("model", str(r.take("base_model")), "base_model")
    r.int_key("micro_batch_size", "batch_size")
    r.int_key("gradient_accumulation_steps", "grad_accum")
    r.int_key("sequence_len", "seq_len")
    _precision(r)
    if r.has("gradient_checkpointing"):
        v = r.take("gradient_checkpointing")
        on = v == "unsloth" or as_bool(r, "gradient_checkpointing", v)
        r.set("checkpointing", "full" if on else "none", "gradient_checkpointing", v)
    if r.has("optimizer"):
        optimizer_of(r, "optimizer")
    for key, impl in (("flash_attention", "flash"), ("sdp_attention", "sdpa")):
        if r.has(key) and as_bool(r, key, r.take(key)):
            r.set("attention", impl, key, True)
    # the canonical key since axolotl replaced the boolean flags (normalize_attn_implementation
    # in src/axolotl/utils/schemas/config.py, axolotl-ai-cloud/axolotl@067b021c8)
    attention_of(r, "attn_implementation")
    r.not_modelled("xformers_attention", "xFormers attention is estimated as sdpa")
    for key in ("torch_dtype", "dtype"):
        # axolotl computes the load dtype from bf16 / fp16 / bfloat16 / float16 / load_in_8bit
        # and overwrites cfg.torch_dtype (resolve_dtype in src/axolotl/utils/config/__init__.py,
        # axolotl-ai-cloud/axolotl@70be546): a value written here is not what loads the model
        r.not_modelled(key, "axolotl sets the load dtype from bf16 / fp16 and overwrites this key")
    adapter = r.take("adapter", None)
    four = as_bool(r, "load_in_4bit", r.take("load_in_4bit", False))
    eight = as_bool(r, "load_in_8bit", r.take("load_in_8bit", False))
    if adapter in ("lora", "qlora"):
        rank = r.take("lora_r", 8)
        r.set("lora_rank", as_int(r, "lora_r", rank), "lora_r", rank)
        linear = r.take("lora_target_linear", False)
        modules = r.take("lora_target_modules", None)
        if as_bool(r, "lora_target_linear", linear) or modules is None:
            r.set("lora_targets", "all-linear", "lora_target_linear", linear)
        else:
            r.set("lora_targets", targets_of(modules), "lora_target_modules", modules)
        modules_to_save_of(r, "lora_modules_to_save")
        lora_dropout_of(r, "lora_dropout", "axolotl")
    elif adapter is not None:
        raise r.fail("adapter", adapter, "must be lora or qlora (or absent for full fine-tuning)")
    if adapter == "qlora" or four:
        dq = as_bool(r, "bnb_4bit_use_double_quant", r.take("bnb_4bit_use_double_quant", True))
        qtype = r.take("bnb_4bit_quant_type", "nf4")
        r.set("quant", "fp4" if qtype == "fp4" else ("nf4-dq" if dq else "nf4"), "adapter", adapter)
        # no prepare_kbit: axolotl casts its fp32 upcast back (module docstring)
    elif eight:
        r.set("quant", "int8", "load_in_8bit", True)
    compile_of(r, "torch_compile")
    compile_options_of(r)
    for key in FUSED_LOSS_KEYS:
        # Liger's fused linear cross-entropy / Apple's Cut Cross-Entropy: no logits kept
        if r.has(key) and as_bool(r, key, r.flat.get(key)):
            r.set("loss", "fused", key, r.take(key))
        elif r.has(key):
            r.take(key)
    for key, what in (
        (
            "sample_packing",
            "sample packing fills every sample to sequence_len: the estimate "
            "uses the full length, right for packed batches",
        ),
        ("unfrozen_parameters", "a parameter-name freeze list (use --freeze N for whole layers)"),
        ("liger_rms_norm", "Liger kernels"),
        ("liger_glu_activation", "Liger kernels"),
        ("liger_cross_entropy", "Liger kernels"),
        ("liger_rope", "Liger kernels"),
        ("fsdp", "FSDP from axolotl's fsdp keys: pass --shard fsdp --gpus N"),
        ("fsdp_config", "FSDP options"),
        ("relora_steps", "ReLoRA"),
        ("peft_use_dora", "DoRA's extra magnitude vectors"),
    ):
        r.not_modelled(key, what + (" is not modelled" if "estimate" not in what else ""))
    if r.flat.get("deepspeed", "x") in (None, ""):
        r.take("deepspeed")  # empty; a path is read by the combiner
    r.no_effect(AXOLOTL_NO_EFFECT)
