"""The ecosystem's names for memfit's settings, in one place: optimizers, precisions, quantization,
LoRA targets, attention, as Hugging Face ``TrainingArguments`` / TRL, axolotl, LLaMA-Factory,
torchtune and LitGPT spell them (each table cites where the names come from)."""

from __future__ import annotations

#: memfit's canonical precision names (Lightning's, memfit.spec.rules.PRECISION_RULES).
MIXED = {"bf16": "bf16-mixed", "fp16": "16-mixed"}
TRUE = {"bf16": "bf16-true", "fp16": "16-true", "fp32": "32-true"}

#: ``TrainingArguments.optim`` values (transformers/training_args.py ``OptimizerNames``), which
#: axolotl's ``optimizer`` and LLaMA-Factory's ``optim`` take too. None: not modelled.
HF_OPTIMIZERS: dict[str, str | None] = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_torch_fused": "adamw-fused",
    "adamw_apex_fused": "adamw-fused",
    "adamw_torch_xla": "adamw",
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "bnb_8bit": "adamw-8bit",
    "paged_adamw_8bit": "paged-adamw-8bit",
    "paged_adamw_32bit": "paged-adamw-32bit",
    "adamw_torch_4bit": None,
    "adamw_torch_8bit": "adamw-8bit",
    "adafactor": "adafactor",
    "lion_32bit": "lion",
    "paged_lion_32bit": "lion",
    "lion_8bit": None,
    "paged_lion_8bit": None,
    "sgd": "sgd",
    "adagrad": None,
    "rmsprop": None,
    "galore_adamw": None,
    "galore_adamw_8bit": None,
    "apollo_adamw": None,
    "schedule_free_adamw": None,
    "ademamix": None,
    "muon": None,
}
#: memfit optimizer → its ``TrainingArguments.optim`` name (what memfit writes: plan/export.py
#: and the fixes ``memfit check`` writes back).
HF_OPTIM_OF = {
    "adamw": "adamw_torch",
    "adamw-fused": "adamw_torch_fused",
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "paged-adamw-32bit": "paged_adamw_32bit",
    "adafactor": "adafactor",
    "lion": "lion_32bit",
    "sgd": "sgd",
}
#: torchtune / LitGPT optimizers by class path (the ``_component_`` / ``class_path`` value).
CLASS_OPTIMIZERS: dict[str, str | None] = {
    "torch.optim.AdamW": "adamw",
    "torch.optim.Adam": "adamw",
    "torch.optim.SGD": "sgd",
    "bitsandbytes.optim.AdamW8bit": "adamw-8bit",
    "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit",
    "bitsandbytes.optim.PagedAdamW": "paged-adamw-32bit",
    "bitsandbytes.optim.PagedAdamW32bit": "paged-adamw-32bit",
    "bitsandbytes.optim.Lion": "lion",
    "torchao.optim.AdamW8bit": "adamw-8bit",
    "torchao.prototype.low_bit_optim.AdamW8bit": "adamw-8bit",
    "torchao.optim.AdamW4bit": None,
    "transformers.Adafactor": "adafactor",
}
#: LoRA target roles memfit knows (models/lora_targets.py), as frameworks' names for them.
ROLE_OF_MODULE = {
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
    "output_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
    "w1": "gate",
    "w3": "up",
    "w2": "down",
}

#: Hub ids of torchtune model builders (torchtune/models/<family>/_model_builders.py): the
#: builder's base name (``lora_`` / ``qlora_`` stripped) → the hub repo its checkpoints come from.
TORCHTUNE_MODELS = {
    "llama2_7b": "meta-llama/Llama-2-7b-hf",
    "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_70b": "meta-llama/Meta-Llama-3-70B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "llama3_1_405b": "meta-llama/Llama-3.1-405B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B",
    "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_3_70b": "meta-llama/Llama-3.3-70B-Instruct",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "gemma_2b": "google/gemma-2b",
    "gemma_7b": "google/gemma-7b",
    "gemma2_2b": "google/gemma-2-2b",
    "gemma2_9b": "google/gemma-2-9b",
    "gemma2_27b": "google/gemma-2-27b",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B",
    "qwen2_5_1_5b_base": "Qwen/Qwen2.5-1.5B",
    "qwen2_5_3b": "Qwen/Qwen2.5-3B",
    "qwen2_5_7b_base": "Qwen/Qwen2.5-7B",
    "qwen2_5_14b_base": "Qwen/Qwen2.5-14B",
    "qwen2_5_32b_base": "Qwen/Qwen2.5-32B",
    "qwen2_5_72b_base": "Qwen/Qwen2.5-72B",
    "qwen3_0_6b_base": "Qwen/Qwen3-0.6B-Base",
    "qwen3_1_7b_base": "Qwen/Qwen3-1.7B-Base",
    "qwen3_4b_base": "Qwen/Qwen3-4B-Base",
    "qwen3_8b_base": "Qwen/Qwen3-8B-Base",
    "qwen3_14b_base": "Qwen/Qwen3-14B-Base",
    "qwen3_32b": "Qwen/Qwen3-32B",
}
