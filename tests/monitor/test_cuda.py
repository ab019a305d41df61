"""On a CUDA machine: the monitor's numbers are torch.cuda's own, and a real OOM is analysed.

Skipped without CUDA. Run on a GPU box with ``pytest -m gpu tests/monitor``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tests.monitor.conftest import read_records

import memfit

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _model() -> tuple:
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 8)
    )
    model = model.cuda()
    return model, torch.optim.AdamW(model.parameters())


def test_steps_carry_the_allocators_counters(tmp_path: Path) -> None:
    model, opt = _model()
    log = tmp_path / "run.jsonl"
    expected = []
    with memfit.Monitor(log, model=model, sample_interval_s=0.02, verbose=False) as mon:
        for _ in range(4):
            model(torch.randn(512, 1024, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            expected.append((torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()))
            mon.step()
    records = read_records(log)
    assert records[0]["device"] == f"cuda:{torch.cuda.current_device()}"
    assert records[0]["device_total_bytes"] == torch.cuda.get_device_properties(0).total_memory
    steps = [r for r in records if r["type"] == "step"]
    assert [(s["allocated_bytes"], s["peak_allocated_bytes"]) for s in steps] == expected
    assert all(s["reserved_bytes"] >= s["allocated_bytes"] for s in steps)
    # Peaks are per step: the first step's peak includes creating AdamW's states.
    assert steps[1]["peak_allocated_bytes"] <= steps[0]["peak_allocated_bytes"]
    if importlib.util.find_spec("pynvml") is not None:
        samples = [r for r in records if r["type"] == "sample"]
        assert samples and all(s["device_used_bytes"] > 0 for s in samples)
        assert max(s["device_used_bytes"] for s in samples) >= steps[-1]["reserved_bytes"]


def test_a_real_cuda_oom_is_analysed_and_reraised(tmp_path: Path) -> None:
    model, opt = _model()
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    opt.step()
    total = torch.cuda.get_device_properties(0).total_memory
    report = tmp_path / "oom.html"
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.oom_guard(report, model=model, optimizer=opt) as guard,
    ):
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    a = guard.analysis
    assert a is not None and a.source.startswith("CUDA allocator snapshot")
    assert a.requested_bytes == pytest.approx(2 * total, rel=0.01)
    params = sum(-(-p.numel() * 4 // 512) * 512 for p in model.parameters())
    assert a.live_bytes["parameters"] == pytest.approx(params, rel=0.01)
    assert a.live_bytes["optimizer_states"] >= 2 * params
    assert a.allocated_bytes == pytest.approx(torch.cuda.memory_allocated(), rel=0.01)
    assert report.exists()
