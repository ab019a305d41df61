"""A proven miss: a larger micro-batch split that cannot fit, from a smaller split's estimate.

The planner estimates a stack's smallest split first (:meth:`memfit.plan.search._Search._check`).
When it misses, a larger split of the same stack usually misses too, but not always: a split
with gradient accumulation (``grad_accum > 1``) holds the gradients through the next
micro-batch (``zero_grad_set_to_none=False``, :meth:`memfit.plan.space.Settings.workload`),
one without does not, so the analytic engine can put micro-batch 1 x 2 above micro-batch 2 x 1
(in 139 of 1 576 such pairs over the web mix's first 200 jobs and the nearest-change jobs: a
one-off count, none of those larger splits fit). So the larger split is estimated, unless this
bound proves it misses; only the analytic engine's one-GPU step is bounded, whose
composition the argument reads (``memfit.estimate.analytic.compose.training_step``):

1. Every forward point of a step that holds the gradients is the same point of the step that
   does not, plus the held gradients (the step's static bytes differ by them alone; the blocks'
   forward is the same op graph: ``existing_grads`` changes only how backward sums gradients),
   so the free step's forward peak at the smaller batch is the held one's less its
   ``gradients`` component.
2. A forward point's bytes do not shrink as the micro-batch grows (activations, saved tensors
   and a fused loss's chunk grow with the tokens; weights, states and capped workspaces stay),
   so the larger split's forward peak is at least that, and its peak allocated bytes too.
3. Its device-used bytes are at least its peak allocated bytes plus the CUDA context: the
   reserved rule's point ratio is >= 1 with a fixed part >= 0 (``RESERVED_RATIO["train"]``,
   the job-class bands; ``tests/plan/test_split_bound.py`` holds both), and the bytes outside
   the allocator are >= 0. The context and the paged (evictable) optimizer states do not depend
   on the micro-batch: the smaller split's are the larger one's.
4. THE verdict rule (:func:`memfit.estimate.verdict.judge`) says "does not fit" (not "tight":
   no settling, no tight plan left) when the point less the paged states exceeds the capacity;
   the need (the range's upper end) is never below the point, so it misses the limit too.

So where (peak allocated lower bound + context - paged) > capacity, the larger split's estimate
would say "does not fit" outright, and the search skips it. Exact for a caller that reads only
the recommendation (the estimate of a skipped split is never shown): ``plan(...,
analytic_floors=True)``, as :mod:`memfit.plan.nearest` runs it (issue 32).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.estimate.verdict import evictable_bytes
from memfit.spec import WorkloadSpec

#: the workload fields a larger split of one stack may differ in: the split itself, and whether
#: the gradients are held through accumulation (set from the split)
SPLIT_FIELDS = frozenset({"batch_size", "grad_accum", "zero_grad_set_to_none"})


def bounded(w: WorkloadSpec) -> bool:
    """Whether the bound covers ``w``: one GPU's training step, no sharding, offload, tensor
    parallelism or optimizer in backward (no rank view rewrites its points)."""
    return (
        w.is_train
        and w.gpus == 1
        and w.tp == 1
        and w.shard == "none"
        and w.offload == "none"
        and not w.optimizer_in_bwd
    )


def same_stack(smaller: WorkloadSpec, larger: WorkloadSpec) -> bool:
    """Whether ``larger`` is ``smaller`` at a larger micro-batch, nothing else changed but the
    split (:data:`SPLIT_FIELDS`)."""
    if larger.batch_size <= smaller.batch_size:
        return False
    return all(
        getattr(smaller, f.name) == getattr(larger, f.name)
        for f in dataclasses.fields(smaller)
        if f.name not in SPLIT_FIELDS
    )


def larger_split_floor_bytes(smaller: WorkloadSpec, est: Any, larger: WorkloadSpec) -> int | None:
    """A lower bound of ``larger``'s peak allocated bytes from ``est``, the analytic engine's
    estimate of ``smaller`` (module docstring, steps 1-2); None where the bound does not apply."""
    if est.engine != "analytic" or not (bounded(smaller) and same_stack(smaller, larger)):
        return None
    forward = est.phases.get("forward")
    if forward is None:
        return None
    held_smaller = not smaller.zero_grad_set_to_none
    held_larger = not larger.zero_grad_set_to_none
    if held_larger and not held_smaller:
        return None  # not a split the search makes (accumulation at the larger micro-batch only)
    held = int(forward.components.get("gradients", 0)) if held_smaller and not held_larger else 0
    return int(forward.peak_allocated_bytes) - held


def proven_miss(smaller: WorkloadSpec, est: Any, larger: WorkloadSpec, capacity_bytes: int) -> bool:
    """Whether ``larger`` provably does not fit (THE verdict rule's "does not fit", not "tight")
    on a GPU of ``capacity_bytes`` (module docstring, steps 3-4)."""
    floor = larger_split_floor_bytes(smaller, est, larger)
    if floor is None:
        return False
    point = floor + int(est.cuda_context_bytes) - evictable_bytes(est)
    return point > capacity_bytes


__all__ = ["bounded", "larger_split_floor_bytes", "proven_miss", "same_stack"]
