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

from memfit.plan.advice import GPUAdvice, recommend_gpus
from memfit.plan.budget import DEFAULT_HEADROOM, Budget
from memfit.plan.cost import COST_CONSTANTS
from memfit.plan.doctor import DoctorReport, Finding, doctor
from memfit.plan.request import GOALS, PlanOption, PlanRequest
from memfit.plan.search import Plan, plan
from memfit.plan.solve import SOLVES, FitResult, fit
from memfit.plan.space import RISK_LEVELS, Settings
from memfit.plan.upgrade import CheckItem, UpgradeVerdict, upgrade_verdict

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
