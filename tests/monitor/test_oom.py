"""The OOM guard: a real torch.OutOfMemoryError with a real model and optimizer live."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.monitor.conftest import FakeCuda, make_estimate, read_records, tiny_training

import memfit
from memfit.monitor.oom import ADVICE, requested_bytes_of
from memfit.units import MiB

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.19 GiB of "
    "which 1.25 MiB is free."
)


def _blocks(tensors) -> int:
    return sum(-(-t.numel() * t.element_size() // 512) * 512 for t in tensors)


def _step(model, opt) -> None:
    model(torch.randn(8, 32)).pow(2).mean().backward()
    opt.step()


def test_guard_names_the_activations_writes_the_report_and_reraises(tmp_path: Path) -> None:
    model, opt = tiny_training()
    report, log = tmp_path / "oom.html", tmp_path / "oom.jsonl"
    error = torch.OutOfMemoryError(OOM_MESSAGE)
    with (
        pytest.raises(torch.OutOfMemoryError) as caught,
        memfit.oom_guard(report, model=model, optimizer=opt, log=log) as guard,
    ):
        _step(model, opt)
        kept = model[0](torch.randn(4096, 32))  # 1 MiB of activations held for backward
        raise error
    assert caught.value is error and kept.shape == (4096, 64)
    a = guard.analysis
    assert a is not None
    params = list(model.parameters())
    assert a.live_bytes["parameters"] == _blocks(params)
    assert a.live_bytes["gradients"] == _blocks(p.grad for p in params)
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a 512 B `step` scalar each.
    assert a.live_bytes["optimizer_states"] == 2 * _blocks(params) + 512 * len(params)
    assert a.live_bytes["activations"] >= 1 * MiB
    assert a.live_bytes["cache"] == 0  # no caching allocator on the CPU
    assert a.culprit == "activations" and a.requested_bytes == 2 * MiB
    assert a.source == "CPU tensor tracker"
    html = report.read_text()
    assert "activations overflowed." in html and "gradient checkpointing" in html
    assert "<script" not in html and "http" not in html.split("</style>")[1]
    (rec,) = read_records(log)
    assert rec["type"] == "oom" and rec["report"] == str(report)
    assert rec["live_bytes"] == a.live_bytes and rec["advice"] == list(ADVICE["activations"])
    assert rec["requested_bytes"] == 2 * MiB and rec["message"] == OOM_MESSAGE
    assert any("memfit: activations overflowed" in n for n in error.__notes__)


def test_with_an_estimate_the_component_that_overshot_it_is_named(tmp_path: Path) -> None:
    model, opt = tiny_training()
    params = list(model.parameters())
    est = make_estimate(
        parameters=_blocks(params), gradients=_blocks(params), optimizer_states=0, activations=MiB
    )
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.oom_guard(tmp_path / "r.html", model=model, optimizer=opt, estimate=est) as guard,
    ):
        _step(model, opt)
        raise torch.OutOfMemoryError(OOM_MESSAGE)
    a = guard.analysis
    assert a is not None and a.culprit == "optimizer_states"
    assert (
        a.reason.startswith("optimizer_states held") and "more than the estimate's 0 B" in a.reason
    )
    assert a.advice[0].startswith("Use 8-bit AdamW")
    assert "8-bit AdamW" in (tmp_path / "r.html").read_text()


def test_snapshot_blocks_are_matched_to_parameters_by_address(tmp_path: Path) -> None:
    model, _ = tiny_training()
    params = list(model.parameters())

    class FakeCpuSnapshot(FakeCuda):
        device = "cpu"

    fake = FakeCpuSnapshot()
    param_blocks = [
        {"address": p.untyped_storage().data_ptr(), "size": 16384, "state": "active_allocated"}
        for p in params
    ]
    other = {"address": 1, "size": 3 * MiB, "state": "active_allocated", "frames": []}
    fake.snapshot = {
        "segments": [{"device": 0, "total_size": 4 * MiB, "blocks": [*param_blocks, other]}]
    }
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.oom_guard(None, model=model, device=fake) as guard,
    ):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 MiB.")
    a = guard.analysis
    assert a is not None and a.source == "CUDA allocator snapshot"
    assert a.live_bytes == {
        "parameters": 16384 * len(params),
        "gradients": 0,
        "optimizer_states": 0,
        "activations": 3 * MiB,
        "cache": 4 * MiB - 3 * MiB - 16384 * len(params),
    }
    assert a.culprit == "activations"


def test_free_cache_larger_than_the_request_is_fragmentation(tmp_path: Path) -> None:
    fake = FakeCuda()
    user_frame = {"filename": "/home/me/train.py", "line": 42, "name": "forward"}
    torch_frame = {"filename": "/x/lib/python3.11/site-packages/torch/nn/functional.py"}
    fake.snapshot = {
        "segments": [
            {
                "device": 0,
                "total_size": 10 * MiB,
                "blocks": [
                    {
                        "address": 0,
                        "size": 6 * MiB,
                        "state": "active_allocated",
                        "frames": [torch_frame, user_frame],
                    },
                    {"address": 6 * MiB, "size": 4 * MiB, "state": "inactive"},
                ],
            },
            {"device": 1, "total_size": 50 * MiB, "blocks": []},  # another GPU: not counted
        ]
    }
    report = tmp_path / "oom.html"
    with pytest.raises(torch.OutOfMemoryError), memfit.oom_guard(report, device=fake) as guard:
        raise torch.OutOfMemoryError(OOM_MESSAGE)
    a = guard.analysis
    assert a is not None
    assert a.live_bytes == {"unattributed": 6 * MiB, "cache": 4 * MiB}
    assert a.culprit == "cache" and "fragmentation" in a.reason
    assert "expandable_segments:True" in a.advice[0]
    assert a.largest_blocks == [{"bytes": 6 * MiB, "where": "/home/me/train.py:42 in forward"}]
    assert a.source == "CUDA allocator snapshot with stack frames"
    assert "/home/me/train.py:42 in forward" in report.read_text()


def test_monitor_logs_the_oom_and_ends_the_run(tmp_path: Path) -> None:
    model, opt = tiny_training()
    log, report = tmp_path / "run.jsonl", tmp_path / "oom.html"
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.Monitor(log, device="cpu", oom_report=report, verbose=False) as mon,
    ):
        mon.watch(opt)
        _step(model, opt)
        raise torch.OutOfMemoryError(OOM_MESSAGE)
    records = read_records(log)
    assert [r["type"] for r in records] == ["start", "step", "oom", "end"]
    oom = records[2]
    assert oom["step"] == 2 and oom["report"] == str(report) and report.exists()
    assert set(oom["live_bytes"]) == {
        "parameters",
        "gradients",
        "optimizer_states",
        "activations",
        "cache",
    }
    assert records[3]["summary"]["outcome"] == "oom"
    json.dumps(records)  # all plain JSON


def test_other_errors_pass_without_a_report(tmp_path: Path) -> None:
    report = tmp_path / "oom.html"
    with pytest.raises(ValueError, match="not memory"), memfit.oom_guard(report, device="cpu"):
        raise ValueError("not memory")
    assert not report.exists()


def test_the_request_size_is_read_from_pytorchs_message() -> None:
    assert requested_bytes_of("CUDA out of memory. Tried to allocate 20.00 MiB") == 20 * MiB
    assert requested_bytes_of("Tried to allocate 1.50 GiB (GPU 0)") == 1536 * MiB
    assert requested_bytes_of("out of memory") is None
