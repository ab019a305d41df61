"""The plan's optimizer, configured as memfit's estimate assumes it (``memfit.estimate.trace.
steps.make_optimizer``) and as HF Trainer builds it for the same ``optim`` name:

===================  =====================================================================
plan                 built
===================  =====================================================================
``adamw``            ``torch.optim.AdamW(foreach=True)`` (torch's CUDA default, set
                     explicitly so CPU runs allocate what CUDA runs do)
``adamw-fused``      ``torch.optim.AdamW(fused=True)``
``adamw-8bit``       ``bitsandbytes.optim.AdamW(optim_bits=8)``; every ``nn.Embedding`` weight
                     registered for 32-bit states (``GlobalOptimManager``), as
                     ``Trainer.create_optimizer`` does
``paged-adamw-8bit`` the same with ``is_paged=True`` (states in CUDA unified memory; on CPU
                     bitsandbytes falls back to ordinary tensors and warns)
``lion``             ``bitsandbytes.optim.Lion(optim_bits=32)`` (HF ``lion_32bit``)
``adafactor``        ``transformers.optimization.Adafactor(scale_parameter=False,
                     relative_step=False)`` (HF ``optim="adafactor"``)
``sgd``              ``torch.optim.SGD(foreach=True)``; ``sgd-momentum``: ``momentum=0.9``
``muon``             ``torch.optim.Muon`` (torch >= 2.9) on the 2-D hidden weights and a
                     foreach ``AdamW`` on the embeddings, output head and 1-D parameters, as one
                     optimizer (``memfit.estimate.trace.muon.MuonWithAdamW``)
===================  =====================================================================

Only trainable parameters are given to the optimizer (frozen layers and LoRA's frozen base get no
states).
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.apply.requirements import import_bitsandbytes
from memfit.apply.target import PlanLike, resolve
from memfit.errors import SpecError
from memfit.estimate.trace.muon import MuonWithAdamW

#: Learning rates used when the caller gives none: the ones memfit's estimator uses (they change
#: no memory); pass ``lr=`` for training.
DEFAULT_LR = {
    "adamw": 1e-4,
    "adamw-fused": 1e-4,
    "adamw-8bit": 1e-3,
    "paged-adamw-8bit": 1e-3,
    "paged-adamw-32bit": 1e-4,
    "lion": 1e-4,
    "adafactor": 1e-3,
    "sgd": 1e-3,
    "sgd-momentum": 1e-3,
    "muon": 0.02,  # torch.optim.Muon's default (its AdamW group: 3e-4)
}
#: SGD momentum of ``sgd-momentum`` (the estimator's value).
SGD_MOMENTUM = 0.9


def build_optimizer(
    model: torch.nn.Module, plan: PlanLike, *, lr: float | None = None, **kwargs: Any
) -> torch.optim.Optimizer:
    """The plan's optimizer over ``model``'s trainable parameters. ``kwargs`` go to the
    optimizer's constructor (``weight_decay=0.01``, ``betas=...``)."""
    name = resolve(plan).workload.optimizer or "none"
    if name == "none":
        raise SpecError(
            "optimizer 'none': the plan runs no optimizer (mode 'infer' or optimizer 'none'); "
            "build_optimizer needs a training plan"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SpecError(
            f"optimizer {name!r}: {type(model).__name__} has no trainable parameter; apply the "
            "plan first (apply_plan_) or unfreeze something"
        )
    kwargs = {"lr": DEFAULT_LR[name] if lr is None else lr, **kwargs}
    if name in ("adamw", "adamw-fused"):
        impl: dict[str, Any] = {"fused": True} if name == "adamw-fused" else {"foreach": True}
        return torch.optim.AdamW(params, **impl, **kwargs)
    if name in ("sgd", "sgd-momentum"):
        if name == "sgd-momentum":
            kwargs.setdefault("momentum", SGD_MOMENTUM)
        return torch.optim.SGD(params, foreach=True, **kwargs)
    if name == "muon":
        return MuonWithAdamW(params, model, **kwargs)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        kwargs.setdefault("scale_parameter", False)
        kwargs.setdefault("relative_step", False)
        return Adafactor(params, **kwargs)
    return _bitsandbytes(name, model, params, kwargs)


def _bitsandbytes(
    name: str, model: torch.nn.Module, params: list[torch.nn.Parameter], kwargs: dict[str, Any]
) -> torch.optim.Optimizer:
    bnb = import_bitsandbytes(f"optimizer {name!r}")
    if name == "lion":
        opt: torch.optim.Optimizer = bnb.optim.Lion(params, optim_bits=32, is_paged=False, **kwargs)
        return opt
    if name == "paged-adamw-32bit":  # what HF Trainer's optim="paged_adamw_32bit" builds
        paged32: torch.optim.Optimizer = bnb.optim.AdamW(
            params, optim_bits=32, is_paged=True, **kwargs
        )
        return paged32
    opt = bnb.optim.AdamW(params, optim_bits=8, is_paged=name.startswith("paged"), **kwargs)
    manager = bnb.optim.GlobalOptimManager.get_instance()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})
    return opt


def optimizer_name(optimizer: torch.optim.Optimizer) -> str | None:
    """The plan name of a built optimizer (None when it is none of memfit's)."""
    cls = type(optimizer)
    module, qual = cls.__module__, cls.__name__
    d = optimizer.defaults
    if module.startswith("torch.optim") and qual == "AdamW":
        return "adamw-fused" if d.get("fused") else "adamw"
    if module.startswith("torch.optim") and qual == "SGD":
        return "sgd-momentum" if d.get("momentum") else "sgd"
    if qual == "Adafactor":
        return "adafactor"
    if isinstance(optimizer, MuonWithAdamW):
        return "muon"
    if module.startswith("bitsandbytes") and qual in ("AdamW", "AdamW8bit", "PagedAdamW8bit"):
        if getattr(getattr(optimizer, "args", None), "optim_bits", 32) != 8:
            return "paged-adamw-32bit" if getattr(optimizer, "is_paged", False) else None
        return "paged-adamw-8bit" if getattr(optimizer, "is_paged", False) else "adamw-8bit"
    if module.startswith("bitsandbytes") and qual == "Lion":
        return "lion"
    return None
