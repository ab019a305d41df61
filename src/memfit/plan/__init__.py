"""Make it fit: search technique combinations, rank them by predicted speed, solve limits.

>>> from memfit.plan import plan, PlanRequest
>>> p = plan("llama-3.1-8b", PlanRequest(seq_len=4096, global_batch=16), gpu="A100-80GB")
>>> p.raise_if_not_fit(); print(p.recommended.settings.describe())

- :func:`plan` (search.py): the fastest stack that fits, alternatives, why faster ones fail.
- :func:`fit` (solve.py): the largest batch / sequence / concurrency that fits.
- :func:`recommend_gpus` (advice.py): GPUs and counts on which a plan fits, with price, ranked
  by cost per 1M tokens (default), speed or free memory.
- :func:`upgrade_verdict` (upgrade.py): the "when should you upgrade" checklist, computed.
- :func:`doctor` (doctor.py): a described job checked for the seven common mistakes.
- checklist.py: the checklist shape both share (a result per check, a job declaring them).
- cost.py: the roofline cost model and its constants; space.py: the search space, quality risk;
  budget.py: capacity and headroom; export.py: the settings as flags and configs.
"""

from __future__ import annotations

import importlib
import sys
import types
import typing
from typing import Any

#: Each public name's module: loaded on first use (PEP 562 ``__getattr__``), so that a module
#: needing one piece (``plan.cost``'s rates for ``memfit gpus``, ``plan.budget``) does not load
#: the search, the advice and the checklists (~0.3 s, 48 modules; issue 32).
_LAZY = {
    **dict.fromkeys(("GPUAdvice", "recommend_gpus"), "advice"),
    **dict.fromkeys(("DEFAULT_HEADROOM", "Budget"), "budget"),
    "COST_CONSTANTS": "cost",
    **dict.fromkeys(("DoctorReport", "Finding", "doctor"), "doctor"),
    **dict.fromkeys(("GOALS", "PlanOption", "PlanRequest"), "request"),
    **dict.fromkeys(("Plan", "plan"), "search"),
    **dict.fromkeys(("SOLVES", "FitResult", "fit"), "solve"),
    **dict.fromkeys(("RISK_LEVELS", "Settings"), "space"),
    **dict.fromkeys(("CheckItem", "UpgradeVerdict", "upgrade_verdict"), "upgrade"),
}

if typing.TYPE_CHECKING:
    from memfit.plan.advice import GPUAdvice as GPUAdvice
    from memfit.plan.advice import recommend_gpus as recommend_gpus
    from memfit.plan.budget import DEFAULT_HEADROOM as DEFAULT_HEADROOM
    from memfit.plan.budget import Budget as Budget
    from memfit.plan.cost import COST_CONSTANTS as COST_CONSTANTS
    from memfit.plan.doctor import DoctorReport as DoctorReport
    from memfit.plan.doctor import Finding as Finding
    from memfit.plan.doctor import doctor as doctor
    from memfit.plan.request import GOALS as GOALS
    from memfit.plan.request import PlanOption as PlanOption
    from memfit.plan.request import PlanRequest as PlanRequest
    from memfit.plan.search import Plan as Plan
    from memfit.plan.search import plan as plan
    from memfit.plan.solve import SOLVES as SOLVES
    from memfit.plan.solve import FitResult as FitResult
    from memfit.plan.solve import fit as fit
    from memfit.plan.space import RISK_LEVELS as RISK_LEVELS
    from memfit.plan.space import Settings as Settings
    from memfit.plan.upgrade import CheckItem as CheckItem
    from memfit.plan.upgrade import UpgradeVerdict as UpgradeVerdict
    from memfit.plan.upgrade import upgrade_verdict as upgrade_verdict


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memfit.plan' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"memfit.plan.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _PlanPackage(types.ModuleType):
    """``memfit.plan``: its function ``doctor`` keeps its name when the module ``plan.doctor`` is
    imported (the import system binds a submodule on its package)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _PlanPackage

__all__ = [
    "COST_CONSTANTS",
    "DEFAULT_HEADROOM",
    "GOALS",
    "RISK_LEVELS",
    "SOLVES",
    "Budget",
    "CheckItem",
    "DoctorReport",
    "Finding",
    "FitResult",
    "GPUAdvice",
    "Plan",
    "PlanOption",
    "PlanRequest",
    "Settings",
    "UpgradeVerdict",
    "doctor",
    "fit",
    "plan",
    "recommend_gpus",
    "upgrade_verdict",
]
