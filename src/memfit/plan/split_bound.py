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

**Another optimizer** (:func:`other_optimizer_floor_bytes`). A stack that differs from a missed
one only in its optimizer (not stepped in backward) and its split is bounded the same way:

5. No block reads the optimizer (``memfit.estimate.analytic.engine.STEP_ONLY_FIELDS``; only
   ``optimizer_in_bwd`` reaches a block, and it is kept equal), and the step's static bytes are
   the parameters, the optimizer states, the held gradients and the inputs
   (``compose.training_step``'s ``_state``): so every forward point of the other optimizer's
   step is this one's, less this one's states, plus its own (>= 0). The bound takes off the
   missed estimate's whole ``optimizer_states`` component at its forward peak (with a
   16-mixed GradScaler's state, counted there too: a smaller bound, still a bound).
6. The paged (evictable) states the verdict takes off are part of the other optimizer's own
   states, which step 5 left out of the bound: so the bound's point is the forward floor plus
   the context, nothing taken off, and the context is the GPU's (``device_overhead``), the same
   for both. Steps 2-4 then apply as above.

In the planner's searches, a stack's 8-bit AdamW or fused-AdamW twin is visited after its
AdamW one missed (they tie on speed or follow on risk): a LoRA / QLoRA stack's states are a few
hundred MiB, so where the AdamW stack missed by more, its twins miss unestimated
(``memfit.plan.search._Search._twin_miss``).
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


#: ... and the optimizer, for a stack that differs from a missed one in its optimizer alone
OPTIMIZER_FIELDS = SPLIT_FIELDS | {"optimizer"}


def other_optimizer(smaller: WorkloadSpec, larger: WorkloadSpec) -> bool:
    """Whether ``larger`` is ``smaller`` with another optimizer (neither stepped in backward) at
    the same or a larger micro-batch, nothing else changed but the split."""
    if larger.batch_size < smaller.batch_size or larger.optimizer == smaller.optimizer:
        return False
    if smaller.optimizer_in_bwd or larger.optimizer_in_bwd:
        return False
    return all(
        getattr(smaller, f.name) == getattr(larger, f.name)
        for f in dataclasses.fields(smaller)
        if f.name not in OPTIMIZER_FIELDS
    )


def other_optimizer_floor_bytes(
    smaller: WorkloadSpec, est: Any, larger: WorkloadSpec
) -> int | None:
    """A lower bound of ``larger``'s peak allocated bytes less its own optimizer states, from
    ``est``, the analytic engine's estimate of ``smaller``, where ``larger`` runs another
    optimizer (module docstring, steps 1, 2 and 5); None where the bound does not apply."""
    if est.engine != "analytic" or not (bounded(smaller) and bounded(larger)):
        return None
    if not other_optimizer(smaller, larger):
        return None
    forward = est.phases.get("forward")
    if forward is None:
        return None
    comps = forward.components
    # held gradients only in the smaller one's step: taken off (step 1); held in the larger
    # one's alone, they add to its points, and the bound stands without them
    held = not smaller.zero_grad_set_to_none and larger.zero_grad_set_to_none
    grads = int(comps.get("gradients", 0)) if held else 0
    return int(forward.peak_allocated_bytes) - int(comps.get("optimizer_states", 0)) - grads


def proven_miss_of_other_optimizer(
    smaller: WorkloadSpec, est: Any, larger: WorkloadSpec, capacity_bytes: int
) -> bool:
    """Whether ``larger`` (another optimizer than ``smaller``'s) provably does not fit on a GPU
    of ``capacity_bytes``: THE verdict rule's "does not fit" (module docstring, step 6)."""
    floor = other_optimizer_floor_bytes(smaller, est, larger)
    return floor is not None and floor + int(est.cuda_context_bytes) > capacity_bytes


__all__ = [
    "bounded",
    "larger_split_floor_bytes",
    "other_optimizer",
    "other_optimizer_floor_bytes",
    "proven_miss",
    "proven_miss_of_other_optimizer",
    "same_stack",
]
