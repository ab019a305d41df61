"""``fit --solve batch --seq-dist``: the largest batch whose reserved memory *after* a
variable-length run fits, not the fixed-shape estimate's.

Two stages. First the ordinary fixed-shape search at the longest length (:func:`memfit.plan.fit`
at ``seq_len = MAX``): every run reaches MAX-length steps, so its answer is an upper bound here
(the estimate at MAX must fit too). Then a monotone search at or below that bound, each
candidate batch replayed over the sampled run (:func:`memfit.estimate.seq_run.estimate_seq_run`)
without a memory cap: a batch fits when the reserved bytes after the run, plus the CUDA context,
stay within the limit (capacity minus headroom). That is the safe criterion: on a real card the
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

from memfit.estimate.seq_run import SeqRunEstimate, estimate_seq_run
from memfit.estimate.seqdist import SeqDist, StepPlan
from memfit.plan.budget import Budget
from memfit.plan.solve import FitResult, fit, largest
from memfit.spec import WorkloadSpec


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
    limit = fixed.budget.limit_bytes - overhead
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
        return replay(batch).run.reserved_bytes <= limit

    best = largest(run_fits, cap=fixed.max_value) if fixed.max_value else 0
    shown = replay(max(best, 1)) if fixed.max_value else None
    return SeqFitResult(
        max_batch=best, fixed=fixed, run=shown, overhead_bytes=overhead, n_replays=len(runs)
    )


__all__ = ["SeqFitResult", "fit_seq_dist"]
