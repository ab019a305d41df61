"""Measure the memory a callable really uses: CUDA's own counters on a GPU, and on CPU memfit's
exact tensor tracker (:class:`~memfit.estimate.trace.tracker.StorageTracker`, the one the
estimator counts with) standing in for the device — optionally with a capacity, beyond which it
raises ``torch.OutOfMemoryError`` as a full GPU would.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memfit.estimate.trace.steps import label_model_state
from memfit.estimate.trace.tracker import StorageTracker


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """``peak_bytes``: peak allocated tensor memory (CUDA ``max_memory_allocated``; CPU: the
    tracker's peak, every storage rounded to 512 B as CUDA's allocator does);
    ``reserved_bytes``: CUDA ``max_memory_reserved`` (None on CPU)."""

    device: str
    peak_bytes: int
    reserved_bytes: int | None = None


class LimitedTracker(StorageTracker):
    """A tracker that raises ``torch.OutOfMemoryError`` when live tensors exceed
    ``limit_bytes`` — a CPU stand-in for a GPU of that capacity (no fragmentation)."""

    def __init__(self, limit_bytes: int | None) -> None:
        super().__init__(device_type="cpu", record_events=False)
        self.limit_bytes = limit_bytes

    def _check_peak(self) -> None:
        super()._check_peak()
        if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
            raise torch.OutOfMemoryError(
                f"memfit CPU device: tried to hold {self.current_bytes} bytes of tensors, "
                f"capacity {self.limit_bytes} bytes"
            )


def measure(
    fn: Callable[[], Any],
    *,
    model: torch.nn.Module | None,
    optimizer: Any = None,
    device: torch.device,
    limit_bytes: int | None = None,
) -> Measurement:
    """Run ``fn()`` once and measure its peak. On CPU the model's parameters, gradients and
    optimizer states count from the start (as they occupy a GPU); raises
    ``torch.OutOfMemoryError`` past ``limit_bytes``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return Measurement(
            device=str(device),
            peak_bytes=int(torch.cuda.max_memory_allocated(device)),
            reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
        )
    tracker = LimitedTracker(limit_bytes)
    with tracker:
        if model is not None:
            label_model_state(tracker, model, optimizer)
        fn()
        if model is not None:  # host-side step counters are not device memory on CUDA
            label_model_state(tracker, model, optimizer)
    return Measurement(device=str(device), peak_bytes=int(tracker.peak.total_bytes))


def free_after_oom(model: torch.nn.Module | None, optimizer: Any, device: torch.device) -> None:
    """Drop what a failed step left: gradients, garbage, CUDA's cached blocks."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    if model is not None:
        model.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
