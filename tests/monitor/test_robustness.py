"""A failure inside the monitor is logged once per place and never reaches the user's loop."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from tests.monitor.conftest import FakeCuda, read_records, tiny_training

import memfit


def test_a_failing_device_query_is_logged_once_and_the_loop_goes_on(
    tmp_path: Path, fake_cuda: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    fake_cuda.fail = {"tensor_memory"}
    model, opt = tiny_training()
    log = tmp_path / "run.jsonl"
    finished = 0
    with (
        caplog.at_level(logging.WARNING, logger="memfit.monitor"),
        memfit.Monitor(log, device=fake_cuda, verbose=False) as mon,
    ):
        mon.watch(opt)
        for _ in range(5):
            model(torch.randn(4, 32)).sum().backward()
            opt.step()  # the post-hook calls mon.step(), which fails inside
            mon.step()  # and so does a direct call
            finished += 1
    assert finished == 5
    records = read_records(log)
    errors = [r for r in records if r["type"] == "error"]
    assert [e["where"] for e in errors] == ["step", "tensor_memory"]  # step; then at exit
    assert errors[0]["message"] == "RuntimeError: injected failure in tensor_memory"
    assert records[-1]["type"] == "end"
    assert records[-1]["summary"]["n_errors"] == 2
    warnings = [r.getMessage() for r in caplog.records if "injected failure" in r.getMessage()]
    assert len(warnings) == 2 and "step failed" in warnings[0]


def test_a_failing_sampler_thread_is_logged_once_and_steps_continue(
    tmp_path: Path, fake_cuda: FakeCuda
) -> None:
    fake_cuda.fail = {"sample"}
    log = tmp_path / "run.jsonl"
    with memfit.Monitor(log, device=fake_cuda, sample_interval_s=0.002, verbose=False) as mon:
        for _ in range(3):
            time.sleep(0.02)  # the sampler fails several times meanwhile
            mon.step()
    records = read_records(log)
    assert [r["where"] for r in records if r["type"] == "error"] == ["sampler"]
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3]
    assert not any(r["type"] == "sample" for r in records)


def test_the_users_own_exception_passes_through_untouched(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    with (
        pytest.raises(KeyError, match="mine"),
        memfit.Monitor(log, device="cpu", verbose=False) as mon,
    ):
        mon.step()
        raise KeyError("mine")
    end = read_records(log)[-1]
    assert end["type"] == "end" and end["summary"]["outcome"] == "error"


def test_a_failing_oom_analysis_still_reraises_the_users_oom(
    tmp_path: Path, fake_cuda: FakeCuda
) -> None:
    fake_cuda.fail = {"tensor_memory"}  # the analysis needs it (no snapshot)
    log = tmp_path / "oom.jsonl"
    error = torch.OutOfMemoryError("CUDA out of memory.")
    with (
        pytest.raises(torch.OutOfMemoryError) as caught,
        memfit.oom_guard(tmp_path / "oom.html", device=fake_cuda, log=log) as guard,
    ):
        raise error
    assert caught.value is error and guard.analysis is None
    (rec,) = read_records(log)
    assert (rec["type"], rec["where"]) == ("error", "oom_guard")
    assert rec["message"] == "RuntimeError: injected failure in tensor_memory"
