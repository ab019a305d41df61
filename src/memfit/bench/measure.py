"""Run real steps and measure them: peak memory, step time, losses.

Memory, by device:

- **CUDA**: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` since the row's model was
  moved to the GPU (the peak counters are reset first), and NVML's process usage when available
  (memfit.monitor's device layer).
- **CPU**: the estimator's own :class:`~memfit.estimate.trace.tracker.StorageTracker` entered around
  the steps: every tensor storage born and freed, plus the parameters and buffers registered at
  entry. Sizes are rounded up to 512 B like CUDA's allocator blocks, as the estimate counts them.
  The CPU has no caching allocator, so there is no reserved figure.

The tracker is a ``TorchDispatchMode``: it adds Python work to every op, a few percent of a step
of a 100 M-parameter model on the CPU (step times say "tracked").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from memfit.monitor.device import CudaQuery


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What real steps of one configuration did. Losses are per step, before the update."""

    device: str
    peak_allocated_bytes: int
    #: Peak during forward + backward (CPU tracker phases; None on CUDA): where activation
    #: techniques (checkpointing, attention kernels) act when the optimizer step holds the peak.
    fwd_bwd_peak_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    @property
    def step_time_s(self) -> float:
        """Median step time, the first (warm-up) step left out when there are others."""
        times = sorted(self.step_times_s[1:] or self.step_times_s)
        return times[len(times) // 2] if times else float("nan")


def _on_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A fresh copy of ``batch`` on ``device``, keeping tensors that alias (labels = input_ids)
    aliased: the copy is born (and counted) inside the measurement, and dies with the step."""
    copies: dict[int, torch.Tensor] = {}
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            if id(v) not in copies:
                copies[id(v)] = v.to(device, copy=True)
            out[k] = copies[id(v)]
        else:
            out[k] = v
    return out


def measure_training(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    batches: list[dict[str, Any]],
    amp: Any,
) -> Measurement:
    """Run one training step per batch (``memfit.apply.training_step``) and measure."""
    from memfit.apply.amp import training_step

    device = _device_of(model)

    def steps(step_starts: Any) -> tuple[list[float], list[float]]:
        times, losses = [], []
        for batch in batches:
            on_device = _on_device(batch, device)
            step_starts()
            started = time.perf_counter()
            losses.append(training_step(model, on_device, optimizer, amp))
            _sync(device)
            times.append(time.perf_counter() - started)
            del on_device
        return times, losses

    return _measured(model, device, optimizer, steps)


def measure_forward(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[Measurement, Any]:
    """One no-grad forward of ``inputs``; returns the measurement and the model's output."""
    device = _device_of(model)
    result: list[Any] = []

    def steps(step_starts: Any) -> tuple[list[float], list[float]]:
        on_device = _on_device(inputs, device)
        step_starts()
        started = time.perf_counter()
        with torch.no_grad():
            result.append(model(**on_device))
        _sync(device)
        return [time.perf_counter() - started], []

    return _measured(model, device, None, steps), result[0]


def _measured(model: torch.nn.Module, device: torch.device, optimizer: Any, steps: Any) -> Any:
    if device.type == "cuda":
        return _measured_cuda(device, steps)
    from memfit.estimate.trace.steps import label_model_state
    from memfit.estimate.trace.tracker import StorageTracker

    tracker = StorageTracker(device_type="cpu", record_events=False)
    # Phases as the estimator's trace sets them: "forward" from the step's start, "backward" once
    # the model's forward (which computes the loss) returns, "optimizer" at optimizer.step().
    hooks = [model.register_forward_hook(lambda *_: tracker.set_phase("backward"))]
    if optimizer is not None:
        hooks.append(optimizer.register_step_pre_hook(lambda *_: tracker.set_phase("optimizer")))
    try:
        with tracker:
            label_model_state(tracker, model)
            times, losses = steps(lambda: tracker.set_phase("forward"))
            if optimizer is not None:
                label_model_state(tracker, model, optimizer)
    finally:
        for h in hooks:
            h.remove()
    phase = tracker.phase_peaks
    return Measurement(
        device="cpu",
        peak_allocated_bytes=tracker.peak.total_bytes,
        fwd_bwd_peak_bytes=max(
            (phase[p].total_bytes for p in ("forward", "backward") if p in phase), default=None
        ),
        step_times_s=times,
        losses=losses,
    )


def _measured_cuda(device: torch.device, steps: Any) -> Measurement:
    query = CudaQuery(device.index or 0)
    torch.cuda.synchronize(device)
    query.reset_peak()
    times, losses = steps(lambda: None)
    mem = query.tensor_memory()
    sample = query.sample()
    return Measurement(
        device=f"cuda:{query.index} ({query.name})",
        peak_allocated_bytes=mem.peak_allocated_bytes,
        peak_reserved_bytes=mem.peak_reserved_bytes,
        device_used_bytes=sample.process_used_bytes or sample.device_used_bytes,
        step_times_s=times,
        losses=losses,
    )


def _device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
