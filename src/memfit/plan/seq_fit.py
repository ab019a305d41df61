"""``fit --solve batch --seq-dist``: the largest batch whose reserved memory *after* a
variable-length run fits, not the fixed-shape estimate's.

Two stages. First the ordinary fixed-shape search at the longest length (:func:`memfit.plan.fit`
at ``seq_len = MAX``): every run reaches MAX-length steps, so its answer is an upper bound here
(the estimate at MAX must fit too). Then a monotone search at or below that bound, each
candidate batch replayed over the sampled run (:func:`memfit.estimate.seqrun.run.estimate_seq_run`)
without a memory cap: a batch fits when THE verdict rule (:func:`memfit.estimate.verdict.judge`)
of the reserved bytes after the run plus the CUDA context says ``fits`` (within capacity minus
headroom). That is the safe criterion: on a real card the
caching allocator would free its cache and retry before raising an OOM
(``c10/cuda/CUDACachingAllocator.cpp``), which `estimate --seq-dist --gpu` models and which may
still run, but every such retry synchronises the device and a fragmented cache is how a long run
OOMs late. A replay traces the step at a few lengths, so each candidate costs a few traces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.estimate.seqrun.run import SeqRunEstimate, estimate_seq_run
from memfit.estimate.verdict import Verdict, judge_point
from memfit.hardware import get_gpu
from memfit.plan import plan as make_plan
from memfit.plan.budget import Budget
from memfit.plan.solve import FitResult, fit, largest
from memfit.spec import WorkloadSpec
from memfit.spec.seqrun import SeqDist, StepPlan


def after_run(run: SeqRunEstimate, overhead_bytes: int, budget: Budget) -> Verdict:
    """THE verdict rule (memfit.estimate.verdict.judge) of the device bytes after the run
    (reserved after the run, torch's default allocator settings, plus ``overhead_bytes``: the
    CUDA context) on ``budget``. The replay has no measured error range: the point is the need."""
    return judge_point(
        run.run.reserved_bytes + overhead_bytes, budget.capacity_bytes, budget.headroom_bytes
    )


def judged(run: SeqRunEstimate, overhead_bytes: int, budget: Budget) -> SeqRunEstimate:
    """``run`` with its overhead and its verdict on ``budget`` (the Answer's ``verdict``)."""
    return dataclasses.replace(
        run, overhead_bytes=overhead_bytes, fits=after_run(run, overhead_bytes, budget)
    )


@dataclass(frozen=True, kw_only=True)
class SeqFitResult:
    """``max_batch``: the answer after the run (0: not even 1). ``fixed``: the fixed-shape fit at
    the longest length (the bound). ``run``: the replay at the answer (or at batch 1)."""

    max_batch: int
    fixed: FitResult
    run: SeqRunEstimate | None
    overhead_bytes: int
    n_replays: int

    @property
    def fits(self) -> bool:
        return self.max_batch > 0

    @property
    def budget(self) -> Budget:
        return self.fixed.budget

    def to_json(self) -> dict[str, Any]:
        return {
            "solve": "batch",
            "criterion": "reserved memory after the variable-length run",
            "max_batch": self.max_batch,
            "fixed_shape_max_batch": self.fixed.max_value,
            "fixed_shape_seq_len": None
            if self.fixed.estimate is None
            else self.fixed.estimate.workload.get("seq_len"),
            **self.budget.to_json(),
            "overhead_bytes": self.overhead_bytes,
            "n_replays": self.n_replays,
            "seq_dist": None if self.run is None else self.run.to_json(),
            "fixed_shape": self.fixed.to_json(),
        }


def fit_seq_dist(
    source: Any,
    workload: WorkloadSpec,
    dist: SeqDist,
    plan: StepPlan,
    *,
    gpu: Any = None,
    gpu_memory_bytes: int | None = None,
    headroom: float,
    progress: Callable[[str], None] | None = None,
) -> SeqFitResult:
    """The largest ``batch_size`` of ``workload`` (a training job) whose run of ``plan`` over
    ``dist``'s lengths fits ``gpu`` (a catalog record) or ``gpu_memory_bytes``."""
    k = plan.pad_to_multiple_of or 1
    top = -(-dist.max_len // k) * k
    fixed = fit(
        source,
        dataclasses.replace(workload, seq_len=top),
        solve="batch",
        gpu=gpu,
        gpu_memory_bytes=gpu_memory_bytes,
        headroom=headroom,
        kv_table=False,
    )
    est = fixed.estimate
    overhead = 0 if est is None else est.device_used_bytes - est.peak_reserved_bytes
    runs: dict[int, SeqRunEstimate] = {}

    def replay(batch: int) -> SeqRunEstimate:
        if batch not in runs:
            if progress is not None:
                progress(f"replaying the run at batch {batch}")
            runs[batch] = estimate_seq_run(
                source,
                dataclasses.replace(workload, batch_size=batch),
                dist,
                dataclasses.replace(plan, batch_size=batch),
                gpu=gpu,
                capacity_bytes=None,
            )
        return runs[batch]

    def run_fits(batch: int) -> bool:
        return after_run(replay(batch), overhead, fixed.budget).fits

    best = largest(run_fits, cap=fixed.max_value) if fixed.max_value else 0
    shown = replay(max(best, 1)) if fixed.max_value else None
    if shown is not None:
        shown = judged(shown, overhead, fixed.budget)
    return SeqFitResult(
        max_batch=best, fixed=fixed, run=shown, overhead_bytes=overhead, n_replays=len(runs)
    )


@dataclass(frozen=True, kw_only=True)
class SeqPlanResult:
    """``plan --seq-dist``: the plan at the longest length (``plan``) and its recommended job
    replayed over the run (``run``, None when nothing fits at the longest length).
    ``overhead_bytes``: what the device holds outside the allocator (CUDA context)."""

    plan: Any
    run: SeqRunEstimate | None
    overhead_bytes: int

    def _fits(self, reserved_bytes: int) -> bool:
        return judge_point(
            reserved_bytes + self.overhead_bytes,
            self.plan.budget.capacity_bytes,
            self.plan.budget.headroom_bytes,
        ).fits

    @property
    def fits_after_run(self) -> bool:
        """The recommended plan's reserved memory after the run, with torch's default
        allocator settings, stays within the limit."""
        return self.run is not None and self._fits(self.run.run.reserved_bytes)

    @property
    def fits_expandable(self) -> bool:
        """The same with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""
        return self.run is not None and self._fits(self.run.run.reserved_expandable_bytes)

    @property
    def fits(self) -> bool:
        """The plan runs the whole run within the limit (with expandable segments if needed)."""
        return self.fits_after_run or self.fits_expandable

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.to_json(),
            "seq_dist": None
            if self.run is None
            else {
                **self.run.to_json(),
                "overhead_bytes": self.overhead_bytes,
                "fits_after_run": self.fits_after_run,
                "fits_expandable": self.fits_expandable,
            },
        }


def plan_seq_dist(
    source: Any,
    request: Any,
    dist: SeqDist,
    plan: StepPlan,
    *,
    gpu: Any,
    gpu_memory_bytes: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> SeqPlanResult:
    """:func:`memfit.plan.plan` of ``request`` (a training :class:`~memfit.plan.PlanRequest`) at
    the run's longest length, then its recommended job replayed over ``plan``'s run of
    ``dist``'s lengths, without a memory cap (the criterion of :func:`fit_seq_dist`)."""

    k = plan.pad_to_multiple_of or 1
    top = -(-dist.max_len // k) * k
    result = make_plan(
        source,
        dataclasses.replace(request, seq_len=top),
        gpu=gpu,
        gpu_memory_bytes=gpu_memory_bytes,
    )
    rec = result.recommended
    if rec is None or rec.estimate is None:
        return SeqPlanResult(plan=result, run=None, overhead_bytes=0)
    est = rec.estimate
    overhead = est.device_used_bytes - est.peak_reserved_bytes
    workload = rec.workload
    if progress is not None:
        progress(f"replaying the recommended plan over {plan.n_steps} steps")
    run = estimate_seq_run(
        source,
        workload,
        dist,
        dataclasses.replace(plan, batch_size=workload.batch_size),
        gpu=get_gpu(gpu) if isinstance(gpu, str) else gpu,
        capacity_bytes=None,
        progress=progress,
    )
    run = judged(run, overhead, result.budget)
    return SeqPlanResult(plan=result, run=run, overhead_bytes=overhead)


__all__ = ["SeqFitResult", "SeqPlanResult", "fit_seq_dist", "plan_seq_dist"]
