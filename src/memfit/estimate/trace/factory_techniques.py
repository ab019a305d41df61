"""The techniques a factory model may declare it supports, applied to any ``nn.Module``.

A factory (``package.module:function``, or a ``timm/`` / ``torchvision/`` model) is the user's own
module: memfit cannot know how to checkpoint or adapt it unless the factory says it may. It
declares the techniques it supports as ``memfit_supports`` — an attribute of the factory function
(``make_model.memfit_supports = {"checkpointing", "lora"}``) or of the model it returns, or the
third element of a returned ``(model, inputs, {"supports": {...}})`` — and memfit applies them
as HF users apply them to transformers models:

* ``checkpointing``: the model's own switch when it has one (transformers'
  ``gradient_checkpointing_enable``, timm's ``set_grad_checkpointing``), else every block of its
  longest ``nn.ModuleList`` runs under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``
  (``selective``: torchtitan's op-level policy, as for transformers models);
* ``lora``: peft's ``get_peft_model`` with ``target_modules`` = the names given, or every linear
  layer's leaf name for ``all-linear`` (peft's own ``all-linear`` only knows transformers models);
* ``freeze``: ``requires_grad_(False)`` on the first N blocks of the longest ``ModuleList`` (and
  ``get_input_embeddings()`` where the model has it);
* ``quant``: the quantized-linear stand-ins of :mod:`memfit.estimate.trace.quantized` replace its
  ``nn.Linear`` layers (as transformers' quantizers replace them).

Everything else that changes how the model is built or spread (tensor parallelism, sharding,
offload, several GPUs) stays the user's code and is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import quant
from memfit.spec import WorkloadSpec

#: The techniques a factory may declare, and the workload field (with its neutral value) each one
#: unlocks.
TECHNIQUES: dict[str, tuple[str, Any]] = {
    "checkpointing": ("checkpointing", "none"),
    "lora": ("lora_rank", None),
    "freeze": ("freeze_layers", 0),
    "quant": ("quant", "none"),
}
#: Settings no factory can declare (they change how the model is distributed), neutral values.
NEVER: dict[str, Any] = {"gpus": 1, "tp": 1, "shard": "none", "offload": "none"}


def declared_supports(*holders: Any, extra: Any = None) -> frozenset[str]:
    """The techniques declared on the factory / model (``memfit_supports``) or returned."""
    names: set[str] = set()
    for holder in holders:
        names |= _names(getattr(holder, "memfit_supports", None), holder)
    if extra is not None:
        supports = extra.get("supports") if isinstance(extra, dict) else None
        names |= _names(supports, "the factory's third return value")
    return frozenset(names)


def _names(value: Any, where: Any) -> set[str]:
    if value is None:
        return set()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise SpecError(
            f"memfit_supports ({value!r}) must be a set of technique names "
            f"({', '.join(TECHNIQUES)})"
        )
    out = {str(v) for v in value}
    unknown = sorted(out - set(TECHNIQUES))
    if unknown:
        raise SpecError(
            f"memfit_supports names {', '.join(map(repr, unknown))}: the techniques a factory "
            f"may declare are {', '.join(TECHNIQUES)}"
        )
    return out


def refuse_undeclared(name: str, workload: WorkloadSpec, supports: frozenset[str]) -> None:
    """SpecError listing every requested setting the factory did not declare (or cannot)."""
    spread = NEVER if workload.is_train else {"gpus": 1, "tp": 1}
    layout = [
        f"{k}={getattr(workload, k)!r}" for k, v in spread.items() if getattr(workload, k) != v
    ]
    if layout:
        raise SpecError(
            f"{', '.join(layout)} cannot be applied to factory model {name!r}: memfit runs your "
            "module on one GPU as it is; spread it inside the factory (or trace your own step "
            "with memfit.trace_step)"
        )
    asked = TECHNIQUES if workload.is_train else {"quant": TECHNIQUES["quant"]}
    bad = [
        f"{field}={getattr(workload, field)!r}"
        for tech, (field, neutral) in asked.items()
        if getattr(workload, field) != neutral and tech not in supports
    ]
    if bad:
        declared = "{" + ", ".join(sorted(supports)) + "}" if supports else "nothing"
        raise SpecError(
            f"{', '.join(bad)} cannot be applied to factory model {name!r}: it declares "
            f"memfit_supports = {declared}; declare the technique (checkpointing, lora, freeze, "
            "quant; docs/factories.md) or apply it inside the factory"
        )


def apply_techniques_(model: torch.nn.Module, workload: WorkloadSpec) -> torch.nn.Module:
    """``model`` with the workload's declared techniques applied (LoRA returns a new wrapper)."""
    from memfit.estimate.trace import build, quantized

    quant = workload.quant
    to_quantize = _linears_to_quantize(model, quant) if quant != "none" else []
    if quant != "none" and not to_quantize:
        raise SpecError(f"quant ({workload.quant!r}): the factory model has no nn.Linear layers")
    if workload.is_train:
        if workload.freeze_layers:
            build.freeze_first_layers_(model, workload.freeze_layers)
        if workload.checkpointing != "none":
            checkpoint_blocks_(model, workload.checkpointing)
        if workload.lora_rank:
            model = _lora(model, workload)
    if to_quantize:
        quantized.quantize_(model, to_quantize, workload, device="meta")
    return model


def _linears_to_quantize(model: torch.nn.Module, fmt: str) -> list[str]:
    """The ``nn.Linear`` layers a transformers quantizer would replace, for any module: its
    default keeps the output layer (the last module, ``get_keys_to_not_convert``) unquantized;
    formats that quantize only the repeated blocks keep everything outside a ``ModuleList``."""
    from memfit.estimate.trace import quantized

    if hasattr(model, "all_tied_weights_keys"):  # a transformers model: its own rule
        return quantized.linears_to_quantize(model, fmt)
    rule = quant.KEPT_OUT[fmt]
    names = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    if rule.skip_output_embeddings and names:
        names = names[:-1]
    if rule.only_repeated_blocks:
        blocks = [n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and n]
        names = [n for n in names if any(n.startswith(b + ".") for b in blocks)]
    return names


def _lora(model: torch.nn.Module, workload: WorkloadSpec) -> torch.nn.Module:
    import dataclasses

    from memfit.estimate.trace import build

    targets = workload.lora_targets
    if targets == "all-linear":
        targets = tuple(build.linear_module_names(model))
        if not targets:
            raise SpecError("lora_rank: the factory model has no linear layers to adapt")
    return build.apply_lora_(model, dataclasses.replace(workload, lora_targets=targets))


def checkpoint_blocks_(model: torch.nn.Module, mode: str) -> str:
    """Turn on activation checkpointing; returns how (for the notes)."""
    from memfit.estimate.trace import build

    if mode == "selective-layer":
        raise NotModelledError(
            "checkpointing 'selective-layer' on a factory model: memfit checkpoints a factory's "
            "blocks all alike; use --checkpointing full",
            engine="trace",
        )
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if mode in build.SAC_CONTEXTS:
        kwargs["context_fn"] = build.SAC_CONTEXTS[mode]
    hf = getattr(model, "gradient_checkpointing_enable", None)
    if callable(hf) and getattr(model, "supports_gradient_checkpointing", False):
        hf(gradient_checkpointing_kwargs=kwargs)
        return "gradient_checkpointing_enable()"
    timm_switch = getattr(model, "set_grad_checkpointing", None)
    if callable(timm_switch) and mode == "full":
        timm_switch(True)
        return "set_grad_checkpointing(True)"
    blocks = build.decoder_layers(model)
    if blocks is None or len(blocks) == 0:
        raise SpecError(
            f"checkpointing ({mode!r}): the factory model has no nn.ModuleList of blocks to "
            "checkpoint and no gradient_checkpointing_enable(); checkpoint inside the factory"
        )
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward, kwargs)  # type: ignore[method-assign]
    return f"torch.utils.checkpoint on each of {len(blocks)} blocks"


def _checkpointed(forward: Any, kwargs: dict[str, Any], *args: Any, **kw: Any) -> Any:
    from torch.utils.checkpoint import checkpoint

    if not torch.is_grad_enabled():
        return forward(*args, **kw)
    return checkpoint(forward, *args, **kw, **kwargs)
