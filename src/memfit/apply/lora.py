"""LoRA / QLoRA adapters with peft: the same ``LoraConfig`` memfit's estimator builds (rank r,
``lora_alpha = 2r``, no dropout, the plan's target modules; peft keeps adapters in fp32), applied
with ``get_peft_model`` — reused from :func:`memfit.estimate.trace.build.apply_lora_`.

On a quantized model (QLoRA) peft wraps the bitsandbytes / torchao layers with its
format-specific LoRA layers. ``prepare_model_for_kbit_training`` is opt-in
(``prepare_kbit=True``, or ``WorkloadSpec.prepare_kbit``): it casts the unquantized modules
(embeddings, norms, ``lm_head``) to fp32, as the estimate of such a workload assumes
(docs/quantization.md); with non-reentrant checkpointing, the only other thing it does (input
gradients) is not needed.
"""

from __future__ import annotations

import torch

from memfit.apply.requirements import device_of, require_package
from memfit.estimate.pipeline import lora_by_role
from memfit.estimate.trace.build import apply_lora_
from memfit.spec import WorkloadSpec


def add_lora_(
    model: torch.nn.Module, workload: WorkloadSpec, *, prepare_kbit: bool = False
) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters; returns the ``PeftModel`` (the base model is modified
    in place: its targeted Linear layers become LoRA layers)."""
    require_package("peft", "peft", "lora_rank (LoRA adapters)")
    if prepare_kbit and workload.quant != "none":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    if callable(to_dict):  # a Hugging Face model: roles (q,v, mlp) → its module names
        workload, _ = lora_by_role(to_dict(), workload)
    return apply_lora_(model, workload, device=str(device_of(model)))


def lora_problems(model: torch.nn.Module, rank: int) -> list[str]:
    """What is wrong with a model that should carry rank-``rank`` LoRA adapters."""
    adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
    if not adapters:
        return [f"lora_rank {rank}: the model has no LoRA adapter (apply_plan_ wraps it with peft)"]
    p: list[str] = []
    if not all(t.requires_grad for t in adapters.values()):
        p.append("lora: some adapter weights are frozen")
    base = [n for n, t in model.named_parameters() if "lora_" not in n and t.requires_grad]
    if base:
        p.append(f"lora: {len(base)} base parameters are trainable (e.g. {base[0]})")
    ranks = {min(t.shape) for n, t in adapters.items() if "lora_A" in n}
    if ranks and ranks != {rank}:
        p.append(f"lora: adapter ranks {sorted(ranks)} differ from lora_rank {rank}")
    return p
