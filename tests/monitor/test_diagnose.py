"""Leak or cache: real CPU training loops through the Monitor, and logs with known shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.monitor.conftest import tiny_training

import memfit
from memfit.monitor.diagnose import fit_line
from memfit.monitor.log import record
from memfit.units import GiB, MiB
from memfit.userfiles import UserFileError

N_STEPS = 16


def _run(log: Path, keep) -> None:
    """A real training loop; ``keep(loss)`` is what the loop holds on to after each step."""
    model, opt = tiny_training()
    history = []
    with memfit.Monitor(log, model=model, device="cpu", verbose=False) as mon:
        mon.watch(opt)
        for _ in range(N_STEPS):
            loss = model(torch.randn(8, 32)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            history.append(keep(loss))  # before opt.step(): the step's reading includes it
            opt.step()


def test_keeping_the_loss_tensor_is_a_leak_of_its_storage_per_step(tmp_path: Path) -> None:
    _run(tmp_path / "run.jsonl", keep=lambda loss: loss)
    d = memfit.diagnose(tmp_path / "run.jsonl")
    assert d.verdict == "leak", d.summary
    assert d.allocated is not None and d.allocated.r2 == pytest.approx(1.0)
    # One 4-byte float per step, in a 512 B allocator block (the CPU tracker rounds like CUDA).
    assert d.allocated.slope_bytes_per_step == pytest.approx(512)
    assert d.n_steps == N_STEPS and d.steady_from_step == 3
    assert "leak: allocated grows 512 B/step over 14 steps" in d.summary


def test_keeping_an_eval_loss_keeps_its_whole_graph(tmp_path: Path) -> None:
    """No backward frees the saved activations: each kept loss holds its forward's tensors."""
    model, _ = tiny_training()
    log = tmp_path / "eval.jsonl"
    kept = []
    with memfit.Monitor(log, model=model, device="cpu", verbose=False) as mon:
        for _ in range(N_STEPS):
            kept.append(model(torch.randn(64, 32)).pow(2).mean())  # eval without no_grad()
            mon.step()
    d = memfit.diagnose(log)
    assert d.verdict == "leak" and d.allocated is not None
    # Kept per step: the input (saved by the first Linear), ReLU's 64x64 output (saved by ReLU and
    # the second Linear), the second Linear's 64x1 output (saved by pow) and the loss itself.
    assert d.allocated.slope_bytes_per_step == 64 * 32 * 4 + 64 * 64 * 4 + 512 + 512


def test_logging_loss_item_is_not_a_leak(tmp_path: Path) -> None:
    _run(tmp_path / "run.jsonl", keep=lambda loss: loss.item())
    d = memfit.diagnose(tmp_path / "run.jsonl")
    assert d.verdict == "stable", d.summary
    assert d.allocated is not None and d.allocated.slope_bytes_per_step == 0
    assert d.allocated.growth_bytes == 0


def _write_log(path: Path, steps: list[tuple[int, int]], device_used: int | None = None) -> Path:
    lines = [
        record(
            "start",
            memfit_version="0",
            device="cuda:0",
            device_name="x",
            device_total_bytes=80 * GiB,
            pid=1,
            argv=[],
            estimate=None,
        )
    ]
    for i, (alloc, res) in enumerate(steps, 1):
        lines.append(
            record(
                "step",
                step=i,
                step_time_s=0.1,
                tokens=None,
                samples=None,
                tokens_per_s=None,
                samples_per_s=None,
                allocated_bytes=alloc,
                peak_allocated_bytes=alloc,
                reserved_bytes=res,
                peak_reserved_bytes=res,
                device_used_bytes=device_used,
                utilization_pct=None,
                rss_bytes=None,
            )
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_reserved_plateau_above_flat_allocated_is_the_cache(tmp_path: Path) -> None:
    steps = [(10 * GiB, 12 * GiB)] * 2 + [(10 * GiB + (i % 2) * 512, 14 * GiB) for i in range(20)]
    d = memfit.diagnose(_write_log(tmp_path / "r.jsonl", steps, device_used=14 * GiB + 600 * MiB))
    assert d.verdict == "cache", d.summary
    assert d.cache_bytes == 4 * GiB - 512  # the last step is odd
    assert "caching allocator keeps 4.00 GiB" in d.summary
    assert d.outside_allocator_bytes == 600 * MiB
    assert "600.00 MiB more than the allocator's peak reserved" in d.findings[1]


def test_reserved_growing_under_flat_allocated_is_fragmentation(tmp_path: Path) -> None:
    steps = [(10 * GiB, 12 * GiB + i * 20 * MiB) for i in range(20)]
    d = memfit.diagnose(_write_log(tmp_path / "r.jsonl", steps))
    assert d.verdict == "fragmentation", d.summary
    assert d.reserved is not None and d.reserved.slope_bytes_per_step == pytest.approx(20 * MiB)
    assert "expandable_segments" in d.summary


def test_a_few_steps_are_not_enough_to_judge(tmp_path: Path) -> None:
    d = memfit.diagnose(_write_log(tmp_path / "r.jsonl", [(GiB, GiB)] * 6))
    assert d.verdict == "too_few_steps"
    assert d.summary == "6 steps logged; need 7 (2 of warm-up)"


def test_steps_with_unknown_allocator_counters_are_left_out(tmp_path: Path) -> None:
    steps: list[tuple[int | None, int | None]] = [(GiB + i * 4 * MiB, 2 * GiB) for i in range(12)]
    steps[3] = steps[7] = (None, None)  # null is "unknown" in the schema: no point on the line
    d = memfit.diagnose(_write_log(tmp_path / "r.jsonl", steps))  # type: ignore[arg-type]
    assert d.verdict == "leak" and d.n_steps == 10, d.summary


def test_a_noisy_flat_run_is_not_a_leak(tmp_path: Path) -> None:
    noise = [0, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    steps = [(GiB + n * MiB, 2 * GiB) for n in noise]
    d = memfit.diagnose(_write_log(tmp_path / "r.jsonl", steps))
    assert d.verdict != "leak" and d.allocated is not None and d.allocated.r2 < 0.8


def test_fit_line_recovers_slope_and_r2() -> None:
    t = fit_line([100, 300, 500, 700])
    assert t.slope_bytes_per_step == 200 and t.r2 == 1.0 and t.growth_bytes == 600
    assert fit_line([5, 5, 5]).r2 is None


def test_unreadable_logs_name_the_file_and_line(tmp_path: Path) -> None:
    good = _write_log(tmp_path / "r.jsonl", [(GiB, GiB)] * 10)
    good.write_text(good.read_text() + '{"type": "step", "ti')  # a crash mid-write: tolerated
    assert memfit.diagnose(good).n_steps == 10
    bad = tmp_path / "bad.jsonl"
    start = good.read_text().splitlines()[0]
    bad.write_text(f'{start}\nnot json\n{{"type":"end"}}\n')
    with pytest.raises(memfit.SpecError, match=r"bad.jsonl:2 is not a JSON record"):
        memfit.diagnose(bad)
    with pytest.raises(UserFileError, match=r"run log '.*missing.jsonl' does not exist"):
        memfit.diagnose(tmp_path / "missing.jsonl")
