"""The trace's CUDA emulation of kernel workspaces (``cuda_emulation.cuda_kernel_workspaces``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memfit.estimate.cuda_reduce import device_for, reduce_staging_bytes  # noqa: E402
from memfit.estimate.trace.cuda_emulation import cuda_kernel_workspaces  # noqa: E402
from memfit.estimate.trace.tracker import StorageTracker  # noqa: E402
from memfit.hardware.catalog import get_gpu  # noqa: E402

MiB = 2**20


def _sum_over_tokens(emulate: bool, fake: bool) -> StorageTracker:
    from contextlib import ExitStack

    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = StorageTracker(device_type="cpu")
    with ExitStack() as stack:
        if fake:
            stack.enter_context(FakeTensorMode())
        if emulate:
            stack.enter_context(cuda_kernel_workspaces(get_gpu("H200")))
        grad = torch.empty(16384, 768, dtype=torch.bfloat16)
        with tracker:
            tracker.set_phase("backward")
            bias_grad = grad.sum(0)
        del bias_grad
    return tracker


@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_a_sum_over_the_tokens_holds_cuda_staging_blocks_for_the_op(fake: bool) -> None:
    buf, sem = reduce_staging_bytes((16384, 768), (0,), device=device_for(get_gpu("H200")))
    assert (buf, sem) == (96 * MiB, 24)  # 512 B once rounded
    emulated = _sum_over_tokens(True, fake)
    sizes = [n for action, _, n in (emulated.events or []) if action == "a"]
    assert sizes == [1536, buf, 512]  # the bias gradient, then the buffer and the semaphores
    assert emulated.peak.total_bytes == 1536 + buf + 512
    assert emulated.phase_peaks["backward"].total_bytes == 1536 + buf + 512
    assert emulated.current_bytes == 0  # all freed: the gradient by its last reference
    plain = _sum_over_tokens(False, fake)
    assert plain.peak.total_bytes == 1536


def test_the_staging_is_temporary_in_the_breakdown() -> None:
    tracker = _sum_over_tokens(True, True)
    assert tracker.breakdown(tracker.peak)["temporary"] == 1536 + 96 * MiB + 512
