"""A phase outside the training step added to an answer (torch-free).

Some jobs peak outside the step memfit traces or computes: DeepSpeed's engine init moving a 4-bit
model whole onto every rank (:mod:`memfit.estimate.zero3_load`), an FSDP1 checkpoint save cloning
each rank's shards (:mod:`memfit.estimate.fsdp1_save`). Such a phase is what the framework
allocates, not a band: where it is higher than the step it sets the job's peak (allocated,
reserved and device), each end of the answer's ranges at least it, and THE verdict is judged on
it again; otherwise the answer keeps its peak and only lists the phase.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.estimate.device import fit_verdict
from memfit.estimate.pipeline import with_notes
from memfit.estimate.result import MemoryEstimate, PhasePeak


def with_outside_phase(
    est: MemoryEstimate, phase: PhasePeak, gpu: Any, note: str, *, peak_note: str = ""
) -> MemoryEstimate:
    """``est`` with ``phase`` (its allocated bytes: what the framework holds then) among its
    phases and ``note`` said; where the phase's device bytes exceed the step's it is the job's
    peak, ``note + peak_note`` said first."""
    total = phase.peak_allocated_bytes
    phases = {**est.phases, phase.phase: phase}
    device = total + est.cuda_context_bytes
    if device <= est.device_used_bytes:
        return with_notes(dataclasses.replace(est, phases=phases), [note])
    floor = {
        "peak_allocated_bytes": total,
        "peak_reserved_bytes": total,
        "device_used_bytes": device,
    }
    ranges = {
        k: (max(lo, floor.get(k, 0)), max(hi, floor.get(k, 0)))
        for k, (lo, hi) in est.ranges.items()
    }
    peak_moves = total > est.peak_allocated_bytes
    out = dataclasses.replace(
        est,
        peak_allocated_bytes=max(est.peak_allocated_bytes, total),
        peak_reserved_bytes=max(est.peak_reserved_bytes, total),
        device_used_bytes=device,
        peak_phase=phase.phase if peak_moves else est.peak_phase,
        components=dict(phase.components) if peak_moves else est.components,
        top_modules=[] if peak_moves else est.top_modules,  # the step's modules, not this phase's
        phases=phases,
        ranges=ranges,
        fits=fit_verdict(gpu, device) if est.fits is not None else None,
    )
    return with_notes(out, [note + peak_note], first=True)


__all__ = ["with_outside_phase"]
