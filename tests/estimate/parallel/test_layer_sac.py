"""torchtitan's per-layer SAC (``--checkpointing selective-layer``) in the per-rank closed form:
each pipeline rank counts its own blocks (one counter per process over every model part it
holds), every N-th checkpointed whole, the others plain."""

from __future__ import annotations

import pytest

from memfit.estimate.parallel.engine import per_rank
from memfit.estimate.parallel.memory import layer_activation_bytes, layout_of
from memfit.estimate.parallel.shape import read_shape
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec


@pytest.fixture(scope="module")
def llama70():
    return read_shape(resolve_model("llama-3.1-70b").spec)


def _job(**kw):
    base = dict(gpus=64, tp=8, pp=4, grad_accum=8, shard="fsdp", batch_size=1, seq_len=8192)
    return WorkloadSpec(**{**base, "sequence_parallel": True, **kw})


def _ranks(shape, w):
    return per_rank(shape, w)[1]


def test_every_block_checkpointed_is_full_checkpointing(llama70):
    full = [r.components() for r in _ranks(llama70, _job(checkpointing="full"))]
    for every in (0, 1):
        w = _job(checkpointing="selective-layer", selective_ac_option=every)
        assert [r.components() for r in _ranks(llama70, w)] == full


def test_a_rank_keeps_every_nth_block_checkpointed_and_the_rest_whole(llama70):
    w = _job(checkpointing="selective-layer", selective_ac_option=4)
    stages, ranks = per_rank(llama70, w)
    lay = layout_of(w)
    full = layer_activation_bytes(llama70, lay, moe=False, how="full")
    none = layer_activation_bytes(llama70, lay, moe=False, how="none")
    for s, r in zip(stages, ranks, strict=True):
        if s.embedding or s.head:
            continue  # their token ids / loss ride on top
        n = s.n_layers
        mean = (n // 4 * full + (n - n // 4) * none) / n
        assert r.activations_bytes == int(s.in_flight_layers * mean)
        assert r.temporary_kind.startswith("one layer recomputed (selective-layer")


def test_interleaved_ranks_count_over_both_of_their_chunks(llama70):
    """pp 4 x 2 chunks of 70B: rank 1 holds chunks of 11 and 10 blocks. Counted over the rank
    (torchtitan's one counter per process), every 4th checkpoints 5 of its 21; counted per
    chunk it would be 2 + 2."""
    w = _job(
        checkpointing="selective-layer",
        selective_ac_option=4,
        pp_schedule="interleaved-1f1b",
        pp_virtual_stages=2,
    )
    stages, ranks = per_rank(llama70, w)
    s = stages[1]
    assert [c.n_layers for c in s.chunks] == [11, 10] and not (s.embedding or s.head)
    lay = layout_of(w)
    full = layer_activation_bytes(llama70, lay, moe=False, how="full")
    none = layer_activation_bytes(llama70, lay, moe=False, how="none")
    mean = (5 * full + 16 * none) / 21
    # an FSDP rank of several chunks answers at its worst backward (schedule.Moment), each
    # chunk with its own micro-batches in flight
    assert s.moments and ranks[1].activations_bytes in {
        int(s.at(m).in_flight_layers * mean) for m in s.moments
    }
