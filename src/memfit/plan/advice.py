"""``recommend_gpus()``: on which GPUs (and how many of them) some plan fits, ranked by the best
plan's predicted throughput — not by memory alone (a bigger GPU is not always the faster one)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memfit.errors import SpecError
from memfit.plan.engines import Estimator
from memfit.plan.request import PlanOption, PlanRequest
from memfit.plan.search import Plan, plan

#: GPU counts tried per GPU model: one server's worth at most.
GPU_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True, kw_only=True)
class GPUAdvice:
    gpu: str
    gpus: int
    best: PlanOption
    plan: Plan

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.best.cost.tokens_per_s / self.gpus

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "tokens_per_s": self.best.cost.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_s": self.best.cost.step_s,
            "quality_risk": self.best.risk,
            "plan": self.best.settings.describe(),
            "need_bytes": self.best.need_bytes,
            "capacity_bytes": self.plan.budget.capacity_bytes,
        }


def recommend_gpus(
    model: Any,
    request: PlanRequest,
    *,
    gpus: list[Any] | None = None,
    counts: tuple[int, ...] = GPU_COUNTS,
    estimator: Estimator | None = None,
    confirm: Estimator | None = None,
) -> list[GPUAdvice]:
    """For each GPU (default: the catalog), the fewest GPUs of that model on which a plan fits,
    fastest first. Counts that do not divide the global batch are skipped."""
    from memfit.hardware import list_gpus

    out: list[GPUAdvice] = []
    for gpu in gpus or list_gpus():
        for n in counts:
            if request.global_batch is not None and request.global_batch % n:
                continue
            try:
                p = plan(
                    model, replace(request, gpus=n), gpu=gpu, estimator=estimator, confirm=confirm
                )
            except SpecError:
                continue
            if p.recommended is not None:
                out.append(GPUAdvice(gpu=gpu.name, gpus=n, best=p.recommended, plan=p))
                break
    out.sort(key=lambda a: -a.best.cost.tokens_per_s)
    return out
