"""The layout planner: the fastest fitting dp x tp x pp x cp layout (memfit.plan.layout_plan)."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.estimate.parallel import estimate_parallel
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.plan.cost import usd_per_million_tokens
from memfit.plan.layout_plan import gpu_floor, plan_layout


@pytest.fixture(scope="module")
def plan8b():
    src = resolve_model("llama-3.1-8b")
    return src, plan_layout(src, gpus=16, global_batch=32, seq_len=4096,
                            gpu=get_gpu("H100-80GB"), usd_per_gpu_hour=2.0)  # fmt: skip


def test_the_pick_fits_by_the_one_verdict_and_is_the_fastest(plan8b):
    src, plan = plan8b
    best = plan.best
    assert best is not None and best.peak.verdict == "fits"
    w = dataclasses.replace(best.peak.choice, seq_len=4096).workload()
    assert estimate_parallel(src, w, gpu=get_gpu("H100-80GB")).verdict.verdict == "fits"
    assert all(best.cost.step_s <= a.cost.step_s for a in plan.alternatives)
    assert all(a.peak.verdict == "fits" for a in plan.alternatives)
    degrees = [(o.peak.dp, o.peak.tp, o.peak.pp, o.peak.cp) for o in [best, *plan.alternatives]]
    assert len(set(degrees)) == len(degrees)  # alternatives differ in their degrees


def test_every_layout_spans_the_gpus_and_the_batch(plan8b):
    _, plan = plan8b
    for o in [plan.best, *plan.alternatives]:
        p = o.peak
        assert p.dp * p.tp * p.pp * p.cp == 16
        assert p.dp * p.micro_batch * p.grad_accum == 32


def test_price_per_million_tokens_is_the_shared_rule(plan8b):
    _, plan = plan8b
    b = plan.best
    assert b.usd_per_million_tokens == usd_per_million_tokens(2.0 * 16, b.cost.tokens_per_s)


def test_tensor_parallelism_stays_inside_a_node():
    src = resolve_model("llama-3.1-8b")
    plan = plan_layout(src, gpus=8, global_batch=8, seq_len=2048, gpu=get_gpu("H100-80GB"),
                       gpus_per_node=2, n_alternatives=8)  # fmt: skip
    assert plan.best is not None
    assert all(o.peak.tp <= 2 for o in [plan.best, *plan.alternatives])


def test_nothing_fits_gives_the_layout_closest_to_fitting():
    src = resolve_model("llama-3.1-70b")
    plan = plan_layout(src, gpus=2, global_batch=2, seq_len=4096, gpu=get_gpu("T4"))
    assert plan.best is None and not plan.fits
    assert plan.nearest_miss is not None
    assert plan.nearest_miss.peak.verdict != "fits"
    assert plan.n_estimated == plan.n_layouts  # all were tried before giving up


def test_the_gpu_floor_holds_the_model_states():
    assert gpu_floor(405_000_000_000, get_gpu("H100-80GB").capacity_bytes) == 128
    assert gpu_floor(1_000_000, get_gpu("H100-80GB").capacity_bytes) == 1
