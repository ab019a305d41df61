"""The loss's peak bytes per logit (memory.LOSS_BYTES_PER_LOGIT) against torch's own
cross_entropy, counted at the dispatcher on CPU: every tensor an op returns is live until
its Python object dies (torchtitan's loss: bf16 logits, ``.float()``, cross_entropy, the logits
freed before backward)."""

from __future__ import annotations

import weakref

import pytest
from tests.estimate.parallel.loss_steps import measure_loss_steps

from memfit.estimate.parallel.memory import LOSS_BYTES_PER_LOGIT

torch = pytest.importorskip("torch")
F = torch.nn.functional


class LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, n = storage.data_ptr(), storage.nbytes()
            if key in self.storages or n == 0:
                continue
            self.storages.add(key)
            self.live += n
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._free, key, n)
        return out

    def _free(self, key: int, n: int) -> None:
        self.live -= n
        self.storages.discard(key)


def test_the_loss_peaks_at_12_bytes_per_logit_as_the_closed_form_counts():
    tokens, hidden, vocab = 1024, 64, 16384
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    with LiveBytes() as mode:
        pred = x @ w.t()
        loss = F.cross_entropy(pred.float(), labels)
        del pred
        loss.backward()
    per_logit = mode.peak / (tokens * vocab)
    # the head's own gradients (w, x: hidden / tokens of a logit's bytes) ride on top
    assert per_logit == pytest.approx(LOSS_BYTES_PER_LOGIT, rel=0.05)


def _timeline_peak_per_logit(step, n_logits: int) -> float:
    """Peak live CPU bytes per logit of ``step()``, from torch's own memory timeline (the
    profiler's allocation records: tensors freed inside DTensor's handlers are seen, which a
    dispatch mode above DTensor is not)."""
    np = pytest.importorskip("numpy")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    total = np.array(sizes).sum(axis=1)
    return float(total.max() - total[0]) / n_logits


def test_loss_parallel_peaks_at_16_bytes_per_logit_as_the_closed_form_counts():
    """torchtitan's loss under tensor parallelism: the head's output sharded over the vocabulary
    (``Shard(-1)`` DTensor), ``cross_entropy`` under torch's ``loss_parallel()``, run here by
    torch's own handlers on a one-rank gloo mesh. The plain loss through the same timeline: 12."""
    from memfit.estimate.parallel.memory import LOSS_PARALLEL_BYTES_PER_LOGIT

    tokens, hidden, vocab = 1024, 64, 16384
    peaks = measure_loss_steps(
        lambda step: _timeline_peak_per_logit(step, tokens * vocab), tokens, hidden, vocab
    )
    assert peaks["plain"] == pytest.approx(12, rel=0.05)
    assert peaks["parallel"] == pytest.approx(LOSS_PARALLEL_BYTES_PER_LOGIT, rel=0.05)
