"""What a plan asks for, in one shape: a :class:`WorkloadSpec` (the techniques, as the estimator
reads them) and the planner's :class:`Settings` (the same techniques plus the batch split).

Every function of :mod:`memfit.apply` accepts a :class:`~memfit.plan.Plan` (its recommended
option), a :class:`~memfit.plan.PlanOption` or a bare :class:`WorkloadSpec`; this module turns any
of them into a :class:`PlanTarget`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from memfit.errors import SpecError
from memfit.plan.request import PlanOption
from memfit.plan.search import Plan
from memfit.plan.space import Settings
from memfit.spec import WorkloadSpec


@dataclass(frozen=True, kw_only=True)
class PlanTarget:
    """The workload (what the estimate assumed) and the settings (what the exports render)."""

    workload: WorkloadSpec
    settings: Settings
    model_name: str | None = None

    @property
    def grad_accum(self) -> int:
        return self.settings.grad_accum

    @property
    def sharded(self) -> bool:
        """Needs a launcher: data-parallel ranks, a ZeRO/FSDP engine, offload or tensor parallel."""
        w = self.workload
        return w.gpus > 1 or w.shard not in ("none", "ddp") or w.offload != "none" or w.tp > 1


#: What every :mod:`memfit.apply` function takes as its plan.
PlanLike: TypeAlias = "Plan | PlanOption | WorkloadSpec | PlanTarget"


def resolve(plan: PlanLike) -> PlanTarget:
    """``plan``: a Plan (its recommended option; raises DoesNotFitError when nothing fits), a
    PlanOption, a WorkloadSpec, or a PlanTarget."""

    if isinstance(plan, PlanTarget):
        return plan
    if isinstance(plan, Plan):
        plan.raise_if_not_fit()
        option = plan.recommended
        assert option is not None  # raise_if_not_fit guarantees it
        return PlanTarget(
            workload=option.workload, settings=option.settings, model_name=plan.model_name
        )
    if isinstance(plan, PlanOption):
        return PlanTarget(workload=plan.workload, settings=plan.settings)
    if isinstance(plan, WorkloadSpec):
        return PlanTarget(workload=plan, settings=Settings.of(plan))
    raise SpecError(
        f"plan ({type(plan).__name__}) must be a memfit Plan, PlanOption or WorkloadSpec: pass "
        "memfit.plan(...), one of its options, or memfit.WorkloadSpec(...)"
    )
