"""A fake device-query object (the only thing these tests replace) and a tiny training setup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memfit.monitor.device import DeviceSample, TensorMemory
from memfit.monitor.log import RECORD_FIELDS
from memfit.units import GiB, MiB


class FakeCuda:
    """Stands for CudaQuery: the test sets the allocator counters and what NVML answers."""

    device = "cuda:0"
    name = "Fake GPU"
    total_bytes = 80 * GiB
    can_sample = True

    def __init__(self) -> None:
        self.allocated = self.peak_allocated = 0
        self.reserved = self.peak_reserved = 0
        self.device_used = 1 * GiB
        self.process_used: int | None = 900 * MiB
        self.utilization = 50.0
        self.n_resets = 0
        self.n_samples = 0
        self.started = self.stopped = False
        self.snapshot: dict[str, Any] | None = None
        self.fail: set[str] = set()

    def set(self, allocated: int, peak_allocated: int, reserved: int, peak_reserved: int) -> None:
        self.allocated, self.peak_allocated = allocated, peak_allocated
        self.reserved, self.peak_reserved = reserved, peak_reserved

    def _maybe_fail(self, where: str) -> None:
        if where in self.fail:
            raise RuntimeError(f"injected failure in {where}")

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def tensor_memory(self) -> TensorMemory:
        self._maybe_fail("tensor_memory")
        return TensorMemory(
            allocated_bytes=self.allocated,
            peak_allocated_bytes=self.peak_allocated,
            reserved_bytes=self.reserved,
            peak_reserved_bytes=self.peak_reserved,
        )

    def reset_peak(self) -> None:
        self.n_resets += 1
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def sample(self) -> DeviceSample:
        self._maybe_fail("sample")
        self.n_samples += 1
        self.device_used += MiB  # each reading differs, so tests can tell which one a step used
        return DeviceSample(
            device_used_bytes=self.device_used,
            utilization_pct=self.utilization,
            process_used_bytes=self.process_used,
        )

    def rss_bytes(self) -> int | None:
        return 123 * MiB

    def memory_snapshot(self) -> dict[str, Any] | None:
        return self.snapshot


@pytest.fixture
def fake_cuda() -> FakeCuda:
    return FakeCuda()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every line of a run log, each checked against the schema (keys and their order)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in records:
        assert tuple(rec) == RECORD_FIELDS[rec["type"]], rec
        assert isinstance(rec["time"], float)
    return records


def tiny_training(seed: int = 0) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_estimate(**components: int) -> Any:
    """A MemoryEstimate with the given components (the rest 0), built directly: these tests check
    the monitor's arithmetic, not an engine."""
    from memfit.estimate.result import COMPONENTS, MemoryEstimate

    comp = {name: components.get(name, 0) for name in COMPONENTS}
    allocated = sum(comp.values())
    return MemoryEstimate(
        model_name="tiny",
        n_params=1000,
        n_trainable_params=1000,
        workload={"mode": "train"},
        engine="test",
        environment={},
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=allocated + 64 * MiB,
        cuda_context_bytes=500 * MiB,
        device_used_bytes=allocated + 564 * MiB,
        peak_phase="backward",
        components=comp,
        phases={},
        top_modules=[],
    )
