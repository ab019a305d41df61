"""The step-time model of a parallel layout (memfit.plan.layout_cost)."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.estimate.parallel.layouts import LayoutChoice, bubble_fraction
from memfit.estimate.parallel.shape import read_shape
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.plan.cost import Rates
from memfit.plan.layout_cost import (
    LAYOUT_FIT,
    Topology,
    active_matmul_params,
    layout_step_cost,
    stage_layers,
)

SEQ = 4096


@pytest.fixture(scope="module")
def llama8b():
    return read_shape(resolve_model("llama-3.1-8b").spec)


def _lay(**kw):
    base = dict(dp=2, tp=1, pp=1, cp=1, micro_batch=1, grad_accum=8, seq_len=SEQ,
                checkpointing="none")  # fmt: skip
    return LayoutChoice(**{**base, **kw})


def _cost(shape, gpu="H100-80GB", per_node=None, **kw):
    g = get_gpu(gpu)
    return layout_step_cost(shape, _lay(**kw), Rates.of(g), Topology.of(g, per_node))


def test_bubble_follows_each_schedules_formula():
    assert bubble_fraction("1f1b", pp=4, micro_batches=8) == pytest.approx(3 / 8)
    assert bubble_fraction("gpipe", pp=4, micro_batches=8) == pytest.approx(3 / 8)
    assert bubble_fraction("interleaved-1f1b", pp=4, micro_batches=8, virtual=2) == 3 / 16
    assert bubble_fraction("zbv", pp=4, micro_batches=8) == 0.0  # m >= 2 pp: zero bubble
    assert bubble_fraction("zbv", pp=4, micro_batches=4) == pytest.approx(3 / 8)  # v = 2
    assert bubble_fraction("1f1b", pp=1, micro_batches=1) == 0.0


def test_compute_is_six_n_tokens_over_the_calibrated_rate_plus_the_layer_overhead(llama8b):
    c = _cost(llama8b, dp=1, grad_accum=2)
    rates = Rates.of(get_gpu("H100-80GB"))
    tokens = SEQ
    flops = 3 * (2 * active_matmul_params(llama8b) * tokens
                 + 2 * llama8b.n_layers * SEQ * llama8b.hidden * tokens)  # fmt: skip
    rate = rates.flops["bf16"] * LAYOUT_FIT.mfu("hopper")
    overhead = 3 * llama8b.n_layers * LAYOUT_FIT.layer_overhead_s  # forward + backward (2)
    assert c.parts_s["compute"] == pytest.approx(2 * (flops / rate + overhead))
    assert c.parts_s["tp"] == c.parts_s["cp"] == c.parts_s["fsdp_dp"] == 0.0


def test_the_last_pipeline_stage_carries_the_output_head_and_the_rounded_up_layers(llama8b):
    """32 layers on 3 stages: 11 on the busiest, plus the head; not 32 / 3 of everything."""
    even = _cost(llama8b, dp=1, pp=4, grad_accum=8, pp_schedule="zbv")
    uneven = _cost(llama8b, dp=1, pp=3, grad_accum=8, pp_schedule="zbv")
    assert stage_layers(llama8b, _lay(pp=3)) == 11
    per_layer = (active_matmul_params(llama8b) - llama8b.embedding_params) / llama8b.n_layers
    head_share = llama8b.embedding_params / (per_layer * 8)  # the head next to 8 layers
    # the 4-stage pipeline's busiest rank does 8 layers + the head, the 3-stage one 11 + head
    ratio = uneven.parts_s["compute"] / even.parts_s["compute"]
    assert ratio == pytest.approx((11 + head_share * 8) / (8 + head_share * 8), rel=0.05)
    # slower than a third of the unpipelined step: the stages are not balanced
    whole = _cost(llama8b, dp=1, pp=1, grad_accum=8)
    assert uneven.parts_s["compute"] > 1.1 * whole.parts_s["compute"] / 3


def test_context_parallelism_at_a_short_sequence_pays_its_ring_latency(llama8b):
    """cp 8 at 4k tokens: blocks of 512 tokens, the ring's steps are not hidden; dp 8 does the
    same work without them."""
    cp = _cost(llama8b, dp=1, cp=8, grad_accum=8)
    dp = _cost(llama8b, dp=8, cp=1, grad_accum=1)
    assert cp.parts_s["cp"] > 0 and cp.step_s > dp.step_s


def test_async_tensor_parallelism_hides_the_exposed_share(llama8b):
    g = get_gpu("H100-80GB")
    lay = _lay(dp=1, tp=8, grad_accum=8)
    plain = layout_step_cost(llama8b, lay, Rates.of(g), Topology.of(g))
    overlapped = layout_step_cost(llama8b, lay, Rates.of(g), Topology.of(g), tp_overlap=True)
    assert overlapped.parts_s["tp"] < plain.parts_s["tp"]
    assert overlapped.step_s < plain.step_s


def test_recomputation_costs_time_in_order(llama8b):
    none, sel, full = (_cost(llama8b, checkpointing=k).step_s
                       for k in ("none", "selective", "full"))  # fmt: skip
    assert none < sel < full


def test_a_pipeline_runs_faster_with_more_micro_batches_and_zero_bubble_schedules(llama8b):
    few = _cost(llama8b, dp=1, pp=4, grad_accum=4, micro_batch=4)
    many = _cost(llama8b, dp=1, pp=4, grad_accum=16, micro_batch=1)
    assert many.bubble < few.bubble and many.step_s < few.step_s
    zbv = _cost(llama8b, dp=1, pp=4, grad_accum=16, micro_batch=1, pp_schedule="zbv")
    assert zbv.bubble == 0.0 and zbv.step_s < many.step_s


def test_tensor_parallel_traffic_grows_with_the_degree(llama8b):
    t2 = _cost(llama8b, dp=4, tp=2, grad_accum=2)
    t8 = _cost(llama8b, dp=1, tp=8, grad_accum=8)
    assert 0 < t2.parts_s["tp"] < t8.parts_s["tp"]


def test_sharding_across_nodes_is_slower_than_inside_one(llama8b):
    kw = dict(dp=16, tp=1, grad_accum=1, micro_batch=1)
    inside = _cost(llama8b, per_node=16, **kw)
    across = _cost(llama8b, per_node=8, **kw)
    assert across.parts_s["fsdp_dp"] > inside.parts_s["fsdp_dp"]


def test_topology_reads_the_catalogs_links_and_node_size():
    h100 = Topology.of(get_gpu("H100-80GB"))
    assert (h100.gpus_per_node, h100.intra_bps, h100.inter_bps) == (8, 450e9, 50e9)
    assert Topology.of(get_gpu("GB200")).gpus_per_node == 72  # NVL72
    assert Topology.of(get_gpu("H100-80GB"), 4).gpus_per_node == 4


def test_moe_pays_all_to_all_and_only_its_active_experts():
    shape = read_shape(resolve_model("mixtral-8x7b").spec)
    assert active_matmul_params(shape) < 0.4 * (shape.n_experts * shape.expert_params
                                                * shape.n_layers)  # fmt: skip
    one = _cost(shape, dp=8, tp=1, ep=1, grad_accum=1)
    eight = _cost(shape, dp=8, tp=1, ep=8, grad_accum=1)
    assert one.parts_s["ep"] == 0.0 < eight.parts_s["ep"]
    assert dataclasses.asdict(eight)["tokens_per_s"] > 0
