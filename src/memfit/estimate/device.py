"""From the allocator's view to the device's: library workspaces, CUDA context, and the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.estimate.result import FitVerdict
from memfit.hardware.overhead import device_overhead


@dataclass(frozen=True, kw_only=True)
class DeviceTotals:
    reserved_bytes: int
    cuda_context_bytes: int
    device_used_bytes: int
    notes: list[str] = field(default_factory=list)


def allocator_workspaces(gpu: Any, *, training: bool) -> tuple[int, ...]:
    """Request sizes of the cuBLAS/cuBLASLt workspaces that live in the caching allocator (never
    freed) on ``gpu``'s architecture; empty where the library allocates them itself."""

    overhead = device_overhead(getattr(gpu, "arch", None), training=training)
    return overhead.workspace_allocations if overhead.workspaces_in_allocator else ()


def device_totals(gpu: Any, *, reserved_bytes: int, training: bool) -> DeviceTotals:
    """Add what lives outside the caching allocator — the CUDA context, and cuBLAS workspaces where
    they are not allocator blocks — to the simulated reserved bytes (which already replay the
    workspaces that are). Only ``nvidia-smi`` sees the context."""

    overhead = device_overhead(getattr(gpu, "arch", None), training=training)
    outside = overhead.outside_allocator_bytes - overhead.cuda_context_bytes
    reserved = reserved_bytes + outside
    notes = []
    if gpu is None:
        notes.append(
            "no --gpu given: CUDA context and cuBLAS workspace sized for a generic Ampere GPU"
        )
    return DeviceTotals(
        reserved_bytes=reserved,
        cuda_context_bytes=overhead.cuda_context_bytes,
        device_used_bytes=reserved + overhead.cuda_context_bytes,
        notes=notes,
    )


def fit_verdict(gpu: Any, device_used_bytes: int) -> FitVerdict | None:
    """Fits when the process's device usage stays within what CUDA can hand out: the total the
    driver reports minus its own reservation where that was measured (616 MiB on an H200)."""
    if gpu is None:
        return None
    capacity = gpu.capacity_bytes
    free = capacity - device_used_bytes
    return FitVerdict(gpu=gpu.name, capacity_bytes=capacity, free_bytes=free, fits=free >= 0)
