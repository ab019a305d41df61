"""memfit.Monitor: the run log it writes step by step, on the CPU and via the CUDA/NVML paths."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from tests.monitor.conftest import FakeCuda, make_estimate, read_records, tiny_training

import memfit
from memfit.units import GiB, MiB


def _train(mon: memfit.Monitor, model, opt, n_steps: int) -> None:
    for _ in range(n_steps):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_cpu_run_logs_start_steps_and_end_with_exact_tensor_bytes(tmp_path: Path) -> None:
    model, opt = tiny_training()
    log = tmp_path / "run.jsonl"
    with memfit.Monitor(log, model=model, device="cpu", verbose=False) as mon:
        mon.watch(opt, tokens_per_step=8 * 32, samples_per_step=8)
        _train(mon, model, opt, 4)
    records = read_records(log)
    assert [r["type"] for r in records] == ["start", "step", "step", "step", "step", "end"]
    start, steps, end = records[0], records[1:5], records[5]
    assert start["device"] == "cpu" and start["estimate"] is None
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    # After the first step: parameters + gradients + AdamW's exp_avg / exp_avg_sq, each storage
    # rounded to 512 B, plus AdamW's per-parameter `step` scalars and the loss (still referenced
    # when the optimizer's post-hook records the step), one 512 B block each.
    n_params = sum(p.numel() for p in model.parameters())
    blocks = sum(-(-p.numel() * 4 // 512) * 512 for p in model.parameters())
    assert steps[-1]["allocated_bytes"] == 4 * blocks + 512 * (len(list(model.parameters())) + 1)
    assert n_params * 4 * 4 <= steps[-1]["allocated_bytes"]
    for s in steps:
        assert s["peak_allocated_bytes"] >= s["allocated_bytes"] > 0
        assert s["reserved_bytes"] == s["allocated_bytes"]  # the CPU has no caching allocator
        assert s["tokens"] == 256 and s["samples"] == 8
        assert s["tokens_per_s"] == pytest.approx(256 / s["step_time_s"])
        assert s["device_used_bytes"] is None and s["rss_bytes"] > 0
    summary = end["summary"]
    assert summary["outcome"] == "ok" and summary["n_steps"] == 4
    assert summary["peak_allocated_bytes"] == max(s["peak_allocated_bytes"] for s in steps)
    timed = sum(s["step_time_s"] for s in steps[1:])
    assert summary["mean_step_time_s"] == pytest.approx(timed / 3)
    assert summary["tokens_per_s"] == pytest.approx(3 * 256 / timed, rel=1e-3)
    assert end["receipt"] is None


def test_peaks_are_per_step_not_since_the_start(tmp_path: Path) -> None:
    model, opt = tiny_training()
    log = tmp_path / "run.jsonl"
    with memfit.Monitor(log, model=model, device="cpu", verbose=False) as mon:
        big = torch.ones(256, 1024)  # 1 MiB, freed before the second step
        del big
        mon.step()
        mon.step()
    steps = [r for r in read_records(log) if r["type"] == "step"]
    assert steps[0]["peak_allocated_bytes"] >= MiB
    assert steps[1]["peak_allocated_bytes"] < MiB


def test_cuda_path_reads_the_allocator_resets_peaks_and_folds_in_nvml(
    tmp_path: Path, fake_cuda: FakeCuda
) -> None:
    log = tmp_path / "run.jsonl"
    with memfit.Monitor(log, device=fake_cuda, sample_interval_s=0.005, verbose=False) as mon:
        for i in range(1, 4):
            fake_cuda.set(i * GiB, i * GiB + 100, 2 * i * GiB, 2 * i * GiB + 200)
            time.sleep(0.03)
            mon.step(tokens=1000)
    records = read_records(log)
    assert fake_cuda.started and fake_cuda.stopped
    assert fake_cuda.n_resets == 1 + 3  # at the start, then after every step
    steps = [r for r in records if r["type"] == "step"]
    assert [s["allocated_bytes"] for s in steps] == [GiB, 2 * GiB, 3 * GiB]
    assert [s["peak_reserved_bytes"] for s in steps] == [2 * i * GiB + 200 for i in (1, 2, 3)]
    assert all(s["rss_bytes"] == 123 * MiB and s["utilization_pct"] == 50.0 for s in steps)
    # A step carries the highest device reading among the samples taken since the previous step.
    since: list[int] = []
    last = None
    for r in records:
        if r["type"] == "sample":
            assert r["process_used_bytes"] == 900 * MiB
            since.append(r["device_used_bytes"])
            last = r["device_used_bytes"]
        elif r["type"] == "step":
            assert r["device_used_bytes"] == (max(since) if since else last)
            since = []
    summary = records[-1]["summary"]
    assert summary["peak_process_used_bytes"] == 900 * MiB
    assert summary["device_used_source"] == "process"
    assert summary["peak_device_used_bytes"] == max(
        r["device_used_bytes"] for r in records if r["type"] == "sample"
    )


def test_receipt_compares_predicted_and_measured_peaks(tmp_path: Path, fake_cuda: FakeCuda) -> None:
    est = make_estimate(parameters=2 * GiB, activations=3 * GiB)
    measured_alloc = est.peak_allocated_bytes // 2
    log = tmp_path / "run.jsonl"
    with memfit.Monitor(log, estimate=est, device=fake_cuda, verbose=False) as mon:
        fake_cuda.set(100, measured_alloc, 4 * GiB, 4 * GiB)
        mon.step()
    records = read_records(log)
    assert records[0]["estimate"] == est.to_json()
    receipt = records[-1]["receipt"]
    assert mon.receipt == receipt
    assert receipt["peak_allocated"] == {
        "predicted_bytes": est.peak_allocated_bytes,
        "measured_bytes": measured_alloc,
        "error_pct": round((est.peak_allocated_bytes - measured_alloc) / measured_alloc * 100, 2),
    }
    assert receipt["peak_reserved"]["measured_bytes"] == 4 * GiB
    assert receipt["device_used"]["measured_bytes"] == 900 * MiB  # this process, not the device
    assert receipt["device_used"]["predicted_bytes"] == est.device_used_bytes


def test_receipt_and_summary_are_printed_at_exit(
    tmp_path: Path, fake_cuda: FakeCuda, capsys: pytest.CaptureFixture[str]
) -> None:
    est = json.loads(json.dumps(make_estimate(parameters=GiB).to_json()))
    with memfit.Monitor(tmp_path / "r.jsonl", estimate=est, device=fake_cuda) as mon:
        fake_cuda.set(GiB, GiB, GiB, GiB)
        mon.step()
    err = capsys.readouterr().err
    assert "memfit monitor: 1 steps" in err
    assert "peak_allocated" in err and "1.00 GiB" in err and " %" in err


def test_cpu_receipt_measures_only_allocated(tmp_path: Path) -> None:
    est = make_estimate(parameters=GiB)
    with memfit.Monitor(tmp_path / "r.jsonl", estimate=est, device="cpu", verbose=False) as mon:
        mon.step()
    assert mon.receipt is not None
    assert mon.receipt["peak_allocated"]["measured_bytes"] is not None
    assert mon.receipt["peak_reserved"] == {
        "predicted_bytes": est.peak_reserved_bytes,
        "measured_bytes": None,
        "error_pct": None,
    }


def test_every_record_is_on_disk_before_the_block_ends(tmp_path: Path, fake_cuda: FakeCuda) -> None:
    log = tmp_path / "run.jsonl"
    with memfit.Monitor(log, device=fake_cuda, fsync=True, verbose=False) as mon:
        mon.step()
        on_disk = read_records(log)  # what a crash right now would leave
        assert [r["type"] for r in on_disk if r["type"] != "sample"] == ["start", "step"]


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(memfit.SpecError, match=r"sample_interval_s \(0\) must be positive"):
        memfit.Monitor(sample_interval_s=0)
    with pytest.raises(memfit.SpecError, match="estimate must be a MemoryEstimate.*got int"):
        memfit.Monitor(estimate=3)
    with pytest.raises(memfit.SpecError, match="plan has no .estimate"):
        memfit.Monitor(plan=object())
