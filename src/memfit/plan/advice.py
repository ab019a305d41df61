"""``recommend_gpus()``: on which GPUs (and how many of them) some plan fits, ranked by the best
plan's predicted throughput — not by memory alone (a bigger GPU is not always the faster one).

Catalog rows without a published compute rate or memory bandwidth cannot be ranked by the cost
model (:meth:`memfit.plan.cost.Rates.of` refuses them); they are skipped and named in the
result's ``notes``. Each GPU's plan is searched with the request's ``confirm`` setting; the CLI
scans with ``confirm="none"`` (one trace of a 7B-class model costs seconds, times ~30 GPUs) and
says so: confirm the GPU you pick with ``memfit plan MODEL --gpu NAME --gpus N``.
"""

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
            "confirmed_by": self.best.confirmed_by,
        }


class GPUAdviceList(list[GPUAdvice]):
    """The advice, fastest first (a list), with ``notes``: the GPUs skipped and why."""

    def __init__(self, items: list[GPUAdvice], notes: list[str]) -> None:
        super().__init__(items)
        self.notes = notes


def recommend_gpus(
    model: Any,
    request: PlanRequest,
    *,
    gpus: list[Any] | None = None,
    counts: tuple[int, ...] = GPU_COUNTS,
    estimator: Estimator | None = None,
    confirm: Estimator | None = None,
) -> GPUAdviceList:
    """For each GPU (default: the catalog), the fewest GPUs of that model on which a plan fits,
    fastest first. Counts that do not divide the global batch are skipped; so are GPUs without
    published rates and any GPU the planner refuses (both listed in ``notes``)."""
    from memfit.hardware import list_gpus
    from memfit.models import ModelSource, resolve_model
    from memfit.plan.cost import Rates

    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    out: list[GPUAdvice] = []
    no_rates: list[str] = []
    refused: list[str] = []
    for gpu in gpus or list_gpus():
        try:
            Rates.of(gpu)
        except SpecError:
            no_rates.append(gpu.name)
            continue
        for n in counts:
            if request.global_batch is not None and request.global_batch % n:
                continue
            try:
                p = plan(
                    source, replace(request, gpus=n), gpu=gpu, estimator=estimator, confirm=confirm
                )
            except SpecError as exc:
                refused.append(f"{gpu.name} x{n} ({exc})")
                continue
            if p.recommended is not None:
                out.append(GPUAdvice(gpu=gpu.name, gpus=n, best=p.recommended, plan=p))
                break
    out.sort(key=lambda a: -a.best.cost.tokens_per_s)
    notes = []
    if no_rates:
        notes.append(
            f"skipped {len(no_rates)} GPU(s) without a published compute rate or memory "
            f"bandwidth in the catalog (no step time to rank them by): {', '.join(no_rates)}; "
            "`memfit fit MODEL --gpu NAME` still sizes memory on them"
        )
    if refused:
        notes.append(
            f"skipped {len(refused)} GPU/count(s) the planner refused: " + "; ".join(refused)
        )
    return GPUAdviceList(out, notes)
