"""``apply_plan_``: make a real model run a plan, in the order memfit's estimator builds it.

1. checks that every technique can run here (before anything changes);
2. precision: parameters cast to the plan's dtype (``amp-*``: fp32 masters);
3. attention implementation (transformers models);
4. training only: ``train()`` mode, layer freezing, activation checkpointing;
5. quantized base weights (bitsandbytes / torchao), then LoRA adapters (peft) on top;
6. sharding / offload / tensor parallelism are left to the launcher (:mod:`memfit.apply.launch`)
   and listed in the record's ``deferred``.

The returned model is the one to train (a ``PeftModel`` with LoRA); ``applied_plan(model)`` returns
the :class:`AppliedPlan` record and :func:`verify_plan` re-checks a model against a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from memfit.apply import attention, checkpointing, freezing, lora, precision, quantization
from memfit.apply.requirements import FLASH_ATTN_MIN_CAPABILITY, device_of
from memfit.apply.target import PlanLike, PlanTarget, resolve
from memfit.spec import WorkloadSpec

#: The attribute ``apply_plan_`` stores its record under, on the returned model.
RECORD_ATTR = "memfit_applied"


@dataclass(frozen=True, kw_only=True)
class AppliedPlan:
    """What ``apply_plan_`` did: ``applied`` maps each technique to what was called,
    ``deferred`` each technique left to someone else to why, ``quantized`` the layers
    replaced, ``notes`` anything the user should know."""

    workload: WorkloadSpec
    device: str
    applied: dict[str, str] = field(default_factory=dict)
    deferred: dict[str, str] = field(default_factory=dict)
    quantized: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    prepared_kbit: bool = False


def apply_plan_(
    model: torch.nn.Module,
    plan: PlanLike,
    *,
    quant_backend: str = "auto",
    prepare_kbit: bool | None = None,
) -> torch.nn.Module:
    """Apply ``plan`` (a Plan, PlanOption or WorkloadSpec) to ``model`` in place and return the
    model to train or serve (a peft ``PeftModel`` when the plan has LoRA adapters).

    ``quant_backend``: ``auto`` | ``bitsandbytes`` | ``torchao`` (:mod:`memfit.apply.quantization`).
    ``prepare_kbit``: call peft's ``prepare_model_for_kbit_training`` on a quantized model (casts
    the unquantized parameters — embeddings, norms, LM head — to fp32); None: as the workload
    says (``WorkloadSpec.prepare_kbit``, which the estimate models).
    Raises :class:`~memfit.apply.UnsupportedHardwareError` / ``MissingDependencyError`` /
    ``SpecError`` before changing anything when a technique cannot run here."""
    target = resolve(plan)
    w = target.workload
    if prepare_kbit is None:
        prepare_kbit = w.prepare_kbit
    device = device_of(model)
    backend = _preflight(w, device, quant_backend)
    applied: dict[str, str] = {}
    changed = precision.cast_parameters_(model, w.run_precision)
    applied["precision"] = (
        f"{w.precision}: {len(changed)} parameters cast to "
        f"{precision.PARAM_DTYPE[w.run_precision]}"
        + (
            " (autocast in the step: AmpStep)"
            if w.run_precision in precision.AUTOCAST_DTYPE
            else ""
        )
    )
    deferred = _deferred(target)
    impl = attention.set_attention_(model, w.attention)
    if impl is None:
        deferred["attention"] = "not a transformers model: its own attention code runs"
    else:
        applied["attention"] = f"attn_implementation={impl!r}"
    if w.is_train:
        model.train()
        if w.freeze_layers:
            freezing.freeze_first_layers_(model, w.freeze_layers)
            applied["freeze_layers"] = f"embeddings and blocks 0..{w.freeze_layers - 1} frozen"
        if w.checkpointing != "none":
            how = checkpointing.enable_checkpointing_(model, w.checkpointing)
            applied["checkpointing"] = f"{w.checkpointing}: {how}"
    else:
        model.eval()
    quantized: list[str] = []
    if w.quant != "none":
        library, quantized = quantization.quantize_linears_(model, w, quant_backend=quant_backend)
        applied["quant"] = f"{w.quant} via {library}: {len(quantized)} Linear layers"
    if w.is_train and w.lora_rank is not None:
        model = lora.add_lora_(model, w, prepare_kbit=prepare_kbit)
        applied["lora"] = f"peft LoraConfig(r={w.lora_rank}, lora_alpha={2 * w.lora_rank})"
    notes = _notes(w, device, backend)
    record = AppliedPlan(
        workload=w,
        device=str(device),
        applied=applied,
        deferred=deferred,
        quantized=quantized,
        notes=notes,
        prepared_kbit=prepare_kbit and w.quant != "none" and w.lora_rank is not None,
    )
    setattr(model, RECORD_ATTR, record)
    return model


def _preflight(w: WorkloadSpec, device: torch.device, quant_backend: str) -> str | None:
    """Every hardware / package requirement, checked before the model changes."""
    from memfit.apply.requirements import import_bitsandbytes, require_capability

    precision.check_precision(w.run_precision, device)
    if w.attention == "flash":
        require_capability(device, FLASH_ATTN_MIN_CAPABILITY, "attention 'flash'")
    backend = None
    if w.quant != "none":
        backend = quantization.check_quant(w, device, quant_backend)
    if w.is_train and w.optimizer in (
        "adamw-8bit",
        "paged-adamw-8bit",
        "paged-adamw-32bit",
        "lion",
    ):
        import_bitsandbytes(f"optimizer {w.optimizer!r}")
    return backend


def _deferred(target: PlanTarget) -> dict[str, str]:
    w = target.workload
    out: dict[str, str] = {}
    if w.shard not in ("none",):
        out["shard"] = (
            f"{w.shard} over {w.dp} data-parallel ranks: done by the launcher "
            "(memfit.apply.write_launch_configs writes its config)"
        )
    if w.offload != "none":
        out["offload"] = f"{w.offload}: done by DeepSpeed / FSDP (write_launch_configs)"
    if w.tp > 1:
        out["tp"] = f"tensor parallel {w.tp}: set up by the training framework"
    if w.is_train and w.optimizer not in ("none", None):
        out["optimizer"] = "build it with memfit.build_optimizer(model, plan)"
    return out


def _notes(w: WorkloadSpec, device: torch.device, backend: str | None) -> list[str]:
    notes = list(w.warnings())
    if w.optimizer == "paged-adamw-8bit" and device.type != "cuda":
        notes.append(
            "paged-adamw-8bit off CUDA: bitsandbytes keeps the states in ordinary tensors "
            "(no unified memory to page to)"
        )
    if w.quant == "fp8" and backend == "torchao" and w.is_train:
        notes.append("fp8 base weights are frozen; only LoRA adapters train")
    return notes


def applied_plan(model: torch.nn.Module) -> AppliedPlan | None:
    """The record ``apply_plan_`` left on ``model`` (None if it was not applied)."""
    record = getattr(model, RECORD_ATTR, None)
    return record if isinstance(record, AppliedPlan) else None


def verify_plan(
    model: torch.nn.Module, plan: PlanLike, *, optimizer: torch.optim.Optimizer | None = None
) -> list[str]:
    """What in ``model`` (and ``optimizer``) does not match ``plan``; empty when it all does."""
    from memfit.apply.optimizers import optimizer_name

    w = resolve(plan).workload
    p: list[str] = []
    record = applied_plan(model)
    if record is None or not record.prepared_kbit:  # prepare_kbit upcasts norms on purpose
        p += precision.check_model_dtype(model, w.run_precision)
    impl = attention.current_attention(model)
    if impl is not None and impl != attention.HF_ATTENTION[w.attention]:
        p.append(f"attention {w.attention!r}: the model runs {impl!r}")
    if w.is_train:
        on = checkpointing.is_checkpointing(model)
        if on != (w.checkpointing != "none"):
            p.append(f"checkpointing {w.checkpointing!r}: the model has it {'on' if on else 'off'}")
        if w.lora_rank is not None:
            p += lora.lora_problems(model, w.lora_rank)
        if w.freeze_layers:
            p += freezing.freezing_problems(model, w.freeze_layers)
    if w.quant != "none" and not quantization.quantized_layers(model):
        p.append(f"quant {w.quant!r}: no quantized layer in the model")
    if optimizer is not None and w.is_train:
        name = optimizer_name(optimizer)
        if name != w.optimizer:
            p.append(f"optimizer {w.optimizer!r}: got {type(optimizer).__name__} ({name})")
    return p
