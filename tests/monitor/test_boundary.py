"""Issue 17's reproduced cases: the monitor never breaks the user's loop, and undoes every patch on
every exit path (normal exit, the user's exception, out-of-order close, two threads)."""

from __future__ import annotations

import io
import logging
import math
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
from tests.monitor.conftest import FakeCuda, read_records, tiny_training
from torch.utils._python_dispatch import _len_torch_dispatch_stack

import memfit
from memfit.estimate.trace import storage_patch

ORIGINAL_RESIZE = torch.UntypedStorage.resize_


def assert_nothing_installed() -> None:
    assert torch.UntypedStorage.resize_ is ORIGINAL_RESIZE
    assert storage_patch.n_listeners() == 0
    assert _len_torch_dispatch_stack() == 0


def test_sparse_embedding_with_sparse_adam_trains_inside_the_monitor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(1000, 16, sparse=True)
    opt = torch.optim.SparseAdam(list(emb.parameters()))
    log = tmp_path / "run.jsonl"
    with memfit.Monitor(log, device="cpu", model=emb, verbose=False) as mon:
        mon.watch(opt)
        for _ in range(3):
            emb(torch.tensor([1, 5, 7])).pow(2).sum().backward()  # a sparse COO gradient
            opt.step()
            opt.zero_grad()
    steps = [r for r in read_records(log) if r["type"] == "step"]
    assert len(steps) == 3
    # the weight (1000 x 16 fp32) and the sparse grad's indices + values are all counted
    assert steps[0]["peak_allocated_bytes"] >= 1000 * 16 * 4
    assert_nothing_installed()


def test_sparse_csr_and_mkldnn_results_are_counted_or_skipped_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "run.jsonl"
    x = torch.randn(64, 64)
    with (
        warnings.catch_warnings(),
        caplog.at_level(logging.WARNING, logger="memfit.monitor"),
        memfit.Monitor(log, device="cpu", verbose=False) as mon,
    ):
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        kept = [x.to_sparse(), x.to_sparse_csr(), x.to_sparse_csc(), x.to_mkldnn()]
        mon.step()
    assert len(kept) == 4
    records = read_records(log)
    step = next(r for r in records if r["type"] == "step")
    assert step["allocated_bytes"] >= 3 * 64 * 64 * 4  # COO, CSR and CSC values
    errors = [r for r in records if r["type"] == "error"]
    assert [e["where"] for e in errors] == ["tensor counter"]
    assert "1 tensors without a storage" in errors[0]["message"]
    assert records[-1]["type"] == "end"


@pytest.mark.parametrize("kind", ["missing folder", "directory", "read-only"])
def test_an_unwritable_log_is_a_warning_and_the_loop_runs(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind == "missing folder":
        log = tmp_path / "no" / "such" / "run.jsonl"
    elif kind == "directory":
        log = tmp_path
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        log = ro / "run.jsonl"
        if _can_write(ro):  # root writes read-only folders: a file it cannot write instead
            log = Path("/proc/version")
    model, opt = tiny_training()
    with (
        caplog.at_level(logging.WARNING, logger="memfit.monitor"),
        memfit.Monitor(log, device="cpu", verbose=False) as mon,
    ):
        mon.watch(opt)
        model(torch.randn(4, 32)).sum().backward()
        opt.step()
    assert mon.summary is not None and mon.summary["n_steps"] == 1
    assert any("memfit monitor: log failed" in r.getMessage() for r in caplog.records)
    assert_nothing_installed()


def _can_write(folder: Path) -> bool:
    try:
        (folder / "probe").write_text("x")
    except OSError:
        return False
    (folder / "probe").unlink()
    return True


def test_the_users_exception_propagates_unchanged_and_everything_is_undone(
    tmp_path: Path,
) -> None:
    class UserError(Exception):
        pass

    err = UserError("the user's own")
    with pytest.raises(UserError) as raised, memfit.Monitor(tmp_path / "r.jsonl", device="cpu"):
        torch.ones(8) * 2
        raise err
    assert raised.value is err
    assert read_records(tmp_path / "r.jsonl")[-1]["summary"]["outcome"] == "error"
    assert_nothing_installed()


def test_two_monitors_closed_out_of_order_leave_nothing_installed(tmp_path: Path) -> None:
    a = memfit.Monitor(tmp_path / "a.jsonl", device="cpu", verbose=False).__enter__()
    b = memfit.Monitor(tmp_path / "b.jsonl", device="cpu", verbose=False).__enter__()
    assert torch.UntypedStorage.resize_ is not ORIGINAL_RESIZE
    assert _len_torch_dispatch_stack() == 2
    a.__exit__(None, None, None)  # the first one closes first
    x = torch.ones(256)  # b still counts
    b.__exit__(None, None, None)
    assert b.summary is not None and b.summary["peak_allocated_bytes"] >= x.numel() * 4
    assert_nothing_installed()


def test_monitors_in_two_threads_leave_nothing_installed(tmp_path: Path) -> None:
    barrier = threading.Barrier(2)
    failures: list[BaseException] = []

    def run(name: str) -> None:
        try:
            with memfit.Monitor(tmp_path / f"{name}.jsonl", device="cpu", verbose=False) as mon:
                barrier.wait()  # both entered before either exits
                torch.randn(32, 32).sum()
                mon.step()
                barrier.wait()
        except BaseException as exc:  # noqa: BLE001 — reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not failures
    for name in ("t1", "t2"):
        assert read_records(tmp_path / f"{name}.jsonl")[-1]["type"] == "end"
    assert_nothing_installed()


def test_the_tracker_holds_only_what_is_live_over_many_steps(tmp_path: Path) -> None:
    model, opt = tiny_training()
    sizes = []
    with memfit.Monitor(tmp_path / "r.jsonl", device="cpu", model=model, verbose=False) as mon:
        counter = mon.device._counter  # type: ignore[attr-defined]
        mon.watch(opt)
        for i in range(60):
            model(torch.randn(4, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
            if i in (9, 59):
                sizes.append((len(counter.storages), len(counter.live)))
    # parameters, their Adam moments and steps: a fixed set; nothing per step survives
    assert sizes[0] == sizes[1]
    assert sizes[1][0] == sizes[1][1] < 40


@pytest.mark.parametrize("case", ["inf interval", "string estimate", "closed stderr", "no stderr"])
def test_the_end_record_is_written_whatever_the_arguments_or_stderr(
    tmp_path: Path, fake_cuda: FakeCuda, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw: dict[str, object] = {"device": fake_cuda}
    if case == "inf interval":
        kw["sample_interval_s"] = math.inf
    if case == "string estimate":
        kw["estimate"] = {"peak_allocated_bytes": "100", "peak_reserved_bytes": 2**20}
    if case == "closed stderr":
        closed = io.StringIO()
        closed.close()
        monkeypatch.setattr(sys, "stderr", closed)
    if case == "no stderr":
        monkeypatch.setattr(sys, "stderr", None)
    log = tmp_path / "r.jsonl"
    with memfit.Monitor(log, verbose=True, **kw) as mon:  # type: ignore[arg-type]
        fake_cuda.set(10, 20, 30, 40)
        mon.step()
        mon.step()
    records = read_records(log)
    end = records[-1]
    assert end["type"] == "end" and end["summary"]["n_steps"] == 2
    if case == "inf interval":  # no sampler thread: a reading at each step instead
        assert sum(r["type"] == "sample" for r in records) == 1 + 2
    if case == "string estimate":
        assert end["receipt"]["peak_allocated"]["predicted_bytes"] is None
        assert end["receipt"]["peak_reserved"]["predicted_bytes"] == 2**20
        assert any(r["type"] == "error" and r["where"] == "estimate" for r in records)


def test_a_nan_interval_is_refused_at_construction() -> None:
    with pytest.raises(memfit.SpecError, match=r"sample_interval_s \(nan\) must be positive"):
        memfit.Monitor("r.jsonl", sample_interval_s=math.nan)
