"""How much of a GPU a plan may use: capacity minus headroom, checked against an estimate's top.

The planner never plans to 100 %. A plan fits when THE verdict rule (memfit.estimate.verdict,
the one every command uses) says ``fits``: the **upper end** of the estimate's range for
device memory (``ranges["device_used_bytes"][1]``: what ``nvidia-smi`` would show, including the
estimator's calibrated error, see memfit.estimate.uncertainty) stays within ``capacity -
headroom``. The default headroom (:data:`DEFAULT_HEADROOM`) covers what one step's estimate
does not see: allocator fragmentation that grows over thousands of steps with varying shapes,
communication buffers (NCCL), and other processes on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.result import COMPONENTS, MemoryEstimate
from memfit.estimate.verdict import DEFAULT_HEADROOM as DEFAULT_HEADROOM
from memfit.estimate.verdict import (
    TIGHT,
    Verdict,
    evictable_bytes,
    judge,
    resident_need_bytes,
    upper_device_bytes,
)
from memfit.units import format_bytes


@dataclass(frozen=True, kw_only=True)
class Budget:
    """``capacity_bytes``: what CUDA can hand out (catalog: ``GPU.capacity_bytes``, the
    torch-visible total where observed, else estimated; or the ``--gpu-memory`` the user gave).
    ``headroom_bytes`` stays free."""

    gpu_name: str
    capacity_bytes: int
    headroom_bytes: int

    @classmethod
    def of(cls, gpu: Any = None, *, memory_bytes: int | None = None, headroom: float) -> Budget:
        problems = []
        if not 0 <= headroom < 1:
            problems.append(f"headroom ({headroom}) must be a fraction in [0, 1), e.g. 0.05")
        if memory_bytes is None and gpu is None:
            problems.append("give a GPU (--gpu NAME) or its memory (--gpu-memory 24GB)")
        if memory_bytes is not None and memory_bytes <= 0:
            problems.append(f"gpu memory ({memory_bytes} bytes) must be > 0")
        if problems:
            raise SpecError.from_problems(problems)
        if memory_bytes is not None:
            capacity = memory_bytes
            name = f"{format_bytes(memory_bytes)} GPU" if gpu is None else gpu.name
        else:
            capacity = gpu.capacity_bytes
            name = gpu.name
        return cls(
            gpu_name=name, capacity_bytes=capacity, headroom_bytes=round(capacity * headroom)
        )

    @property
    def limit_bytes(self) -> int:
        return self.capacity_bytes - self.headroom_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu_name,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "limit_bytes": self.limit_bytes,
        }


def need_bytes(est: MemoryEstimate) -> int:
    """Device memory a plan is charged: the upper end of the device-used range. An estimate that
    carries no device-used range (the analytic engine gives only its reserved-bytes range) is
    charged the calibrated range of :mod:`memfit.estimate.uncertainty` (the one trace estimates
    carry, with the analytic engine's own band), so every engine is held to the same end of its
    error and the confirming engine does not overrule the search engine for its range alone.
    The paged (evictable) optimizer states are left out (``resident_need_bytes``: the driver
    moves them to host RAM when the rest needs the room; memfit.estimate.verdict)."""
    return resident_need_bytes(est)


def verdict(est: MemoryEstimate, budget: Budget) -> Verdict:
    """THE verdict rule (memfit.estimate.verdict) of ``est`` on the budget's GPU."""
    return judge(
        point_bytes=est.device_used_bytes,
        need_bytes=upper_device_bytes(est),
        capacity_bytes=budget.capacity_bytes,
        headroom_bytes=budget.headroom_bytes,
        evictable_bytes=evictable_bytes(est),
    )


def fits(est: MemoryEstimate, budget: Budget) -> bool:
    return verdict(est, budget).fits


def overflow_reason(
    est: MemoryEstimate, budget: Budget, reference: MemoryEstimate | None, *, verb: str = "needs"
) -> str:
    """Why ``est`` does not fit: by how much, its largest component, and what grew most against
    ``reference`` (the recommended plan) when given. ``verb``: "needs" for the job's own figure
    (one "needs" figure per job), "takes" for a plan memfit considered. A plan that is only
    tight (THE verdict rule: its estimate is within the capacity, its upper end plus headroom
    is not) says so with its estimate: it may run, with no margin for the range."""
    over = need_bytes(est) - budget.limit_bytes
    comps = {c: est.components.get(c, 0) for c in COMPONENTS}
    top = max(comps, key=lambda c: comps[c])
    text = (
        f"{verb} {format_bytes(need_bytes(est))} (upper end) > limit "
        f"{format_bytes(budget.limit_bytes)}: over by {format_bytes(over)}; largest component "
        f"{top} {format_bytes(comps[top])}"
    )
    v = verdict(est, budget)
    if v.verdict == TIGHT:
        text += (
            f"; tight: the estimate, {format_bytes(v.point_bytes)}, is within the "
            f"{format_bytes(budget.capacity_bytes)}"
        )
    if reference is not None:
        grew = {c: comps[c] - reference.components.get(c, 0) for c in COMPONENTS}
        worst = max(grew, key=lambda c: grew[c])
        if grew[worst] > 0:
            text += f" (+{format_bytes(grew[worst])} {worst} vs the recommended plan)"
    return text
