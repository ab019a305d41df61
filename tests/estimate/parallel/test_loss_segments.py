"""The loss's own segments on the head rank (memory.loss_segment_bytes): torch's own loss, its
allocations recorded on CPU and replayed through memfit's model of the CUDA caching allocator
(memfit.estimate.allocator.caching, checked against a real H200 in its docstring), reserves what
the closed form says — the fp32 tensors live at the loss's peak, each in a segment of its own, and
the bf16 logits' segment beside them — and nothing a block's forward frees can serve them."""

from __future__ import annotations

import dataclasses

import pytest
from tests.estimate.parallel.loss_steps import measure_loss_steps

from memfit.estimate.allocator.caching import simulate
from memfit.estimate.parallel.engine import rank_reserved_bytes
from memfit.estimate.parallel.memory import (
    forward_transient_bytes,
    layout_of,
    loss_segment_bytes,
    rank_bytes,
)
from memfit.estimate.parallel.schedule import pipeline_ranks
from memfit.estimate.parallel.shape import read_shape
from memfit.hardware.cuda_allocator import SMALL_BUFFER_BYTES
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

torch = pytest.importorskip("torch")

TOKENS, HIDDEN, VOCAB = 1024, 64, 16384


def _record(step) -> list[tuple[str, int, int]]:
    """Every storage ``step()`` creates and destroys, in order, as ``("a", key, bytes)`` /
    ``("f", key, 0)``: torch's profiler memory timeline, which sees the tensors DTensor's loss
    handlers make and free inside themselves."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfileTimeline

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        step()
    events: list[tuple[str, int, int]] = []
    live: dict[object, int] = {}
    for _, action, (key, _version), size in MemoryProfileTimeline(prof._memory_profile()).timeline:
        if action == Action.CREATE:
            if key in live:
                events.append(("f", live.pop(key), 0))
            live[key] = len(events) + 1
            events.append(("a", live[key], size))
        elif action == Action.DESTROY and key in live:
            events.append(("f", live.pop(key), 0))
    return events + [("f", k, 0) for k in live.values()]


@pytest.fixture(scope="module")
def loss_events() -> dict[str, list[tuple[str, int, int]]]:
    """torchtitan's loss step (``cross_entropy(pred.float(), labels)``, ``del pred``,
    ``backward``: train.py at 9dec370), plain and vocabulary-parallel (torch's
    ``loss_parallel()`` on a one-rank gloo mesh, as tests/estimate/parallel/test_loss_peak.py)."""
    return measure_loss_steps(_record, TOKENS, HIDDEN, VOCAB)


def _layout(kind: str):
    """A torch-native (FSDP) layout whose head sees ``TOKENS x VOCAB`` logits: tp 2 over a
    vocabulary twice as large for the loss-parallel case (its shard is ``VOCAB``)."""
    tp = 2 if kind == "parallel" else 1
    shape = dataclasses.replace(
        read_shape(resolve_model("llama-3.2-1b").spec), vocab=VOCAB * tp, hidden=HIDDEN
    )
    w = WorkloadSpec(gpus=2, tp=tp, shard="fsdp", batch_size=1, seq_len=TOKENS)
    return shape, dataclasses.replace(layout_of(w), sequence_parallel=tp > 1)


#: The head's own weight gradient (``VOCAB x HIDDEN`` bf16) rides in the replay's segments; the
#: closed form counts it with the rest of the step.
WEIGHT_GRAD_BYTES = VOCAB * HIDDEN * 2


@pytest.mark.parametrize("kind", ["plain", "parallel"])
def test_the_replayed_loss_reserves_its_fp32_tensors_and_the_freed_logits_segment(
    loss_events, kind
):
    """Plain: 12 bytes per logit allocated at the peak, 14 reserved; loss parallel: 16 and 18.
    The bf16 logits' segment (2 bytes per logit), freed before backward, serves none of the
    fp32 tensors that follow."""
    shape, lay = _layout(kind)
    replay = simulate(loss_events[kind])
    assert replay.peak_reserved_bytes - WEIGHT_GRAD_BYTES == pytest.approx(
        loss_segment_bytes(shape, lay), rel=0.01
    )
    # the logits' block, cached, not allocated (and the small pool's one 2 MiB segment)
    cached = replay.peak_reserved_bytes - replay.peak_allocated_bytes - SMALL_BUFFER_BYTES
    assert cached / (TOKENS * VOCAB) == pytest.approx(2, abs=0.01)


def test_a_forward_s_freed_blocks_serve_none_of_the_loss_tensors(loss_events):
    """A forward pass whose blocks (each layer's two full-width transients, as
    :func:`forward_transient_bytes` counts them, and the small input it keeps) are freed before
    the loss: the replay of both reserves the forward's segments plus the loss's own."""
    shape, lay = _layout("parallel")
    wide = dataclasses.replace(shape, hidden=8192)  # transients of 16 MiB: the large pool
    half = forward_transient_bytes(wide, lay) // 2
    forward: list[tuple[str, int, int]] = []
    for layer in range(8):
        key = 10**6 + 10 * layer
        forward += [("a", key, half), ("a", key + 1, half), ("a", key + 2, half // lay.tp)]
        forward += [("f", key, 0), ("f", key + 1, 0)]
    both = simulate(forward + loss_events["parallel"]).peak_reserved_bytes
    loss_alone = simulate(loss_events["parallel"]).peak_reserved_bytes
    alone = simulate(forward).peak_reserved_bytes + loss_alone
    assert both == alone


def _llama70_head(**kw):
    shape = read_shape(resolve_model("llama-3.1-70b").spec)
    base = dict(gpus=256, tp=8, shard="fsdp", batch_size=16, seq_len=8192, checkpointing="full")
    lay = dataclasses.replace(layout_of(WorkloadSpec(**{**base, **kw})), sequence_parallel=True)
    (stages,) = pipeline_ranks(80, pp=1, schedule="1f1b", virtual_stages=1, micro_batches=1)
    return shape, lay, stages


def test_the_head_rank_reserves_the_rest_at_the_ratio_and_the_loss_segments_as_they_are():
    """torchtitan's Llama-3.1-70B 2D job (Table 4): 131,072 tokens x 16,032 logits a rank, 18
    bytes each of segments (35.2 GiB) above the rest of the step; the single ratio on the peak
    leaves them out."""
    shape, lay, stages = _llama70_head()
    r = rank_bytes(shape, stages, lay)
    assert r.loss_reserve is not None
    rest, segments = r.loss_reserve
    assert segments == 131072 * 16032 * 18
    ratio_only = rank_reserved_bytes(dataclasses.replace(r, loss_reserve=None), 0)
    assert rank_reserved_bytes(r, 0) > ratio_only + 5 * 2**30


def test_megatron_layouts_and_mixture_of_experts_keep_the_single_ratio():
    shape, lay, stages = _llama70_head(shard="zero1")
    assert rank_bytes(shape, stages, lay).loss_reserve is None
    moe = read_shape(resolve_model("mixtral-8x7b").spec)
    assert loss_segment_bytes(moe, dataclasses.replace(lay, shard="fsdp")) is None
