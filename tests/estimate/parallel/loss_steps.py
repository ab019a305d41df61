"""torchtitan's loss step, plain and vocabulary-parallel, for the loss tests to measure
(test_loss_peak.py: the timeline's peak; test_loss_segments.py: the allocations replayed).

``cross_entropy(pred.float(), labels)``, ``del pred``, ``backward`` (torchtitan's train.py at
9dec370); the parallel one under torch's ``loss_parallel()`` with the head sharded over the
vocabulary on a one-rank gloo mesh, run by torch's own DTensor handlers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def measure_loss_steps(
    measure: Callable[[Callable[[], None]], T], tokens: int, hidden: int, vocab: int
) -> dict[str, T]:
    """``measure`` of the parallel loss step, then of the plain one (``"parallel"`` / ``"plain"``),
    on ``tokens x hidden`` bf16 activations and a ``vocab x hidden`` head."""
    torch: Any = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    F = torch.nn.functional
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))

    # One CPU thread: with more, torch's CPU kernels allocate per-thread buffers of their own
    # (run alone on a 2-core machine, at torch's default 2 threads, the plain step recorded one
    # more 20 MiB segment and test_loss_segments failed), which a CUDA kernel does not make.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(measure, torch, dist, F, x, w, labels)
    finally:
        torch.set_num_threads(threads)


def _measure(measure: Callable[[Callable[[], None]], T], torch: Any, dist: Any, F: Any,
             x: Any, w: Any, labels: Any) -> dict[str, T]:  # fmt: skip
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    def plain() -> None:
        pred = x @ w.t()
        loss = F.cross_entropy(pred.float(), labels)
        del pred
        loss.backward()

    if dist.is_initialized():  # memfit's FSDP trace keeps its fake group (re-made when needed)
        assert dist.get_backend() == "fake"
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        w_shard = distribute_tensor(w.detach(), mesh, [Shard(0)]).requires_grad_()

        def sharded() -> None:
            with loss_parallel():
                pred = DTensor.from_local(x, mesh, [Replicate()]) @ w_shard.t()
                loss = F.cross_entropy(pred.float(), labels)
                del pred
                loss.backward()

        parallel = measure(sharded)
    finally:
        dist.destroy_process_group()
    return {"parallel": parallel, "plain": measure(plain)}
