"""Layers per pipeline rank and micro-batches in flight, per schedule."""

import math

import pytest

from memfit.estimate.parallel.schedule import in_flight, pipeline_ranks, split_layers


def test_torchtitans_split_counts_embeddings_and_head_as_a_layer_each():
    # 126 layers + 2 over 8 stages: 16 weighted layers each; the ends give one to emb / head
    assert split_layers(126, 8) == [15] + [16] * 6 + [15]
    # 32 + 2 = 34 over 4: 9, 9, 8, 8 weighted -> 8, 9, 8, 7 layers
    assert split_layers(32, 4) == [8, 9, 8, 7]
    assert sum(split_layers(80, 16)) == 80


def test_1f1b_keeps_pp_minus_rank_micro_batches():
    assert [in_flight("1f1b", rank=r, pp=4, micro_batches=16, virtual=1) for r in range(4)] == [
        4,
        3,
        2,
        1,
    ]
    # fewer micro-batches than stages: never more than exist
    assert in_flight("1f1b", rank=0, pp=8, micro_batches=2, virtual=1) == 2


def test_gpipe_keeps_every_micro_batch_on_every_rank():
    assert {in_flight("gpipe", rank=r, pp=4, micro_batches=12, virtual=1) for r in range(4)} == {12}


@pytest.mark.parametrize(("pp", "v"), [(4, 2), (8, 3), (16, 4)])
def test_interleaved_rank_0_matches_megatrons_memory_penalty(pp, v):
    """Megatron's theoretical_memory_usage: activations x (1 + (pp - 1) / (pp v)) relative to
    1F1B's pp micro-batches of L / pp layers."""
    n_layers = pp * v * 4
    chunks = in_flight("interleaved-1f1b", rank=0, pp=pp, micro_batches=10 * pp, virtual=v)
    layers_in_flight = chunks * n_layers / (pp * v)
    megatron = n_layers * (1 + (pp - 1) / (pp * v))
    assert math.isclose(layers_in_flight, megatron)


def test_v_schedules_put_embeddings_and_head_on_rank_0():
    for schedule in ("zbv", "dualpipev"):
        ranks = pipeline_ranks(62, pp=4, schedule=schedule, virtual_stages=1, micro_batches=16)
        assert ranks[0].embedding and ranks[0].head
        assert [c.index for c in ranks[1].chunks] == [1, 6]
        assert not any(r.embedding or r.head for r in ranks[1:])


def test_zbv_holds_as_many_layers_in_flight_as_1f1b_rank_0_on_every_rank():
    """Qi et al. 2024 (ZB-V): the same peak activation memory as 1F1B, balanced over ranks."""
    zbv = pipeline_ranks(64, pp=4, schedule="zbv", virtual_stages=1, micro_batches=16)
    assert {r.in_flight for r in zbv} == {8}  # 2 pp chunk-micro-batches of L / (2 pp) layers
    dual = pipeline_ranks(64, pp=4, schedule="dualpipev", virtual_stages=1, micro_batches=16)
    assert {r.in_flight for r in dual} == {9}  # one more: a forward overlapped with a backward


def test_every_layer_is_on_exactly_one_rank():
    for schedule, v in (("1f1b", 1), ("interleaved-1f1b", 3), ("zbv", 1), ("gpipe", 1)):
        ranks = pipeline_ranks(80, pp=4, schedule=schedule, virtual_stages=v, micro_batches=8)
        layers = sorted(i for r in ranks for i in r.layers)
        assert layers == list(range(80))


def test_too_many_stages_for_the_layers_is_refused():
    with pytest.raises(ValueError, match="cannot fill 16 pipeline chunks"):
        pipeline_ranks(4, pp=8, schedule="zbv", virtual_stages=1, micro_batches=16)


def _torch_interleaved_order(rank, pp, m, v):
    """torch's own ScheduleInterleaved1F1B op list for ``rank`` (its method run on the fields
    it reads), as ``(is_forward, local chunk)``; None where torch is not installed."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    rounds = max(1, m // pp)
    fields = dict(n_local_stages=v, pp_group_size=pp, _n_microbatches=m,
                  microbatches_per_round=m // rounds)  # fmt: skip
    me = type("Fields", (), fields)()
    ops = schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(me, rank)
    forward = schedules._ComputationType.FORWARD
    return [(a.computation_type == forward, a.stage_index // pp) for a in ops if a is not None]


@pytest.mark.parametrize(("pp", "m", "v"), [(4, 4, 2), (4, 8, 2), (8, 8, 2), (4, 2, 3), (4, 12, 3)])
def test_interleaved_order_is_torchs(pp, m, v):
    from memfit.estimate.parallel.schedule import rank_actions

    for r in range(pp):
        ours = rank_actions("interleaved-1f1b", rank=r, pp=pp, micro_batches=m, virtual=v)
        assert ours == _torch_interleaved_order(r, pp, m, v)


def test_one_round_interleaved_finishes_a_chunks_backwards_before_the_next():
    """torch's REDUCE_GRAD after a stage's last backward frees its unsharded gradients: with
    m <= pp (one round) a rank never has two chunks mid-backward; with two rounds it does."""
    from memfit.estimate.parallel.schedule import backward_moments, rank_actions

    def most_chunks_with_grads(m):
        worst = 0
        for r in range(4):
            acts = rank_actions("interleaved-1f1b", rank=r, pp=4, micro_batches=m, virtual=2)
            worst = max(worst, *(sum(x.grads) for x in backward_moments(acts, 2)))
        return worst

    assert most_chunks_with_grads(4) == 1
    assert most_chunks_with_grads(8) == 2


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_simulated_order_holds_the_formulas_in_flight_when_pp_divides_m(schedule):
    from memfit.estimate.parallel.schedule import backward_moments, rank_actions

    v = 2 if schedule == "interleaved-1f1b" else 1
    for pp, m in ((4, 4), (4, 8), (8, 16)):
        for r in range(pp):
            acts = rank_actions(schedule, rank=r, pp=pp, micro_batches=m, virtual=v)
            assert acts is not None
            peak = max(sum(x.in_flight) for x in backward_moments(acts, v))
            assert peak == in_flight(schedule, rank=r, pp=pp, micro_batches=m, virtual=v)
