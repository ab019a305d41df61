"""The monitor never changes the user's computation nor another monitor's log (issue 33):
one writer per log path, torch.compile unchanged, close() from any thread removes every hook."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import pytest
import torch
from tests.monitor.conftest import read_records, tiny_training
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import memfit
from memfit.monitor import log as run_log
from memfit.monitor.counter import TensorCounter


def test_three_monitors_on_one_path_write_three_whole_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "run.jsonl"
    with caplog.at_level(logging.WARNING, logger="memfit.monitor"):
        mons = [memfit.Monitor(path, device="cpu", verbose=False) for _ in range(3)]
        for mon in mons:
            mon.__enter__()
        for step in range(4):
            for mon in mons:
                mon.step(tokens=step + 1)
        for mon in reversed(mons):
            mon.close()
    paths = [Path(m.log_path) for m in mons]
    assert paths == [path, tmp_path / "run.1.jsonl", tmp_path / "run.2.jsonl"]
    for p in paths:
        kinds = [r["type"] for r in read_records(p)]
        assert kinds == ["start", "step", "step", "step", "step", "end"]
    moved = [r.getMessage() for r in caplog.records if "another monitor" in r.getMessage()]
    assert len(moved) == 2  # said once per monitor that moved, not raised
    assert not run_log._HELD  # every claim released


def test_without_file_locks_the_process_still_keeps_one_writer_per_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_log, "_claim", lambda fd: True)  # a file system without flock
    a = run_log.RunLog(tmp_path / "run.jsonl")
    b = run_log.RunLog(tmp_path / "run.jsonl")
    try:
        assert b.path == tmp_path / "run.1.jsonl"
    finally:
        a.close()
        b.close()
    c = run_log.RunLog(tmp_path / "run.jsonl")  # released: the path is free again
    c.close()
    assert c.path == tmp_path / "run.jsonl"


def _train(compiled: bool, log: Path | None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model, opt = tiny_training()
    run = torch.compile(model, backend="aot_eager") if compiled else model
    x = torch.randn(8, 32)
    mon = memfit.Monitor(log, device="cpu", verbose=False) if log is not None else None
    if mon is not None:
        mon.__enter__()
    try:
        for _ in range(3):
            run(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        if mon is not None:
            mon.close()
    return [p.detach().clone() for p in model.parameters()]


def test_torch_compile_compiles_with_the_monitor_on(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    without = _train(True, None)
    torch._dynamo.reset()
    counters.clear()
    with_monitor = _train(True, tmp_path / "run.jsonl")
    assert counters["frames"]["ok"] > 0  # dynamo compiled inside the monitor, not skipped
    assert all(torch.equal(a, b) for a, b in zip(without, with_monitor, strict=True))
    notes = [r for r in read_records(tmp_path / "run.jsonl") if r["type"] == "error"]
    assert [r["where"] for r in notes] == ["torch.compile"]
    assert "stepped aside while it compiled" in notes[0]["message"]
    assert TensorCounter.ignore_compile_internals()


def test_close_from_another_thread_takes_the_counter_off_the_loops_thread(
    tmp_path: Path,
) -> None:
    model, opt = tiny_training()
    profile_before = sys.getprofile()
    mon = memfit.Monitor(tmp_path / "run.jsonl", device="cpu", verbose=False).__enter__()
    mon.watch(opt)
    counter = mon.device._counter  # type: ignore[attr-defined]
    assert any(m is counter for m in _get_current_dispatch_mode_stack())
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    closer = threading.Thread(target=mon.close)
    closer.start()
    closer.join(30)
    assert not opt._optimizer_step_post_hooks  # the step hook is gone at once
    model(torch.randn(4, 32)).sum().backward()  # the loop's next ops: the counter leaves
    opt.step()
    assert not any(m is counter for m in _get_current_dispatch_mode_stack())
    assert sys.getprofile() is profile_before and not counter.closed_elsewhere()
    assert [r["type"] for r in read_records(tmp_path / "run.jsonl")][-1] == "end"
