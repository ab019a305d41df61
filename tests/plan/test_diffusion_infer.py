"""``plan`` of a diffusion pipeline call (memfit.plan.diffusion_infer): the diffusers memory
switches that make it fit, memory-only first, every plan judged by THE verdict rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from tests.estimate.diffusion.test_pipeline import FLUX, T5, job, tiny_flux  # noqa: E402

import memfit  # noqa: E402
from memfit.estimate.verdict import judge_point  # noqa: E402
from memfit.plan.diffusion_infer import PipelinePlans  # noqa: E402

#: a FLUX tree large enough (a few hundred MB of weights) for the offload modes to differ by more
#: than the caching allocator's 2 MiB blocks; fake tensors keep its traces as fast as the tiny one's
MID_FLUX = {**FLUX, "attention_head_dim": 128, "num_attention_heads": 8, "num_layers": 2,
            "num_single_layers": 2, "joint_attention_dim": 1024, "axes_dims_rope": [16, 56, 56],
            "pooled_projection_dim": 32}  # fmt: skip
MID_T5 = {**T5, "d_model": 1024, "d_ff": 2816, "d_kv": 64, "num_heads": 16, "num_layers": 2}


def mid_flux(root: Path) -> Path:
    tiny_flux(root)
    (root / "transformer" / "config.json").write_text(json.dumps(MID_FLUX))
    (root / "text_encoder_2" / "config.json").write_text(json.dumps(MID_T5))
    return root


@pytest.fixture(scope="module")
def flux_mid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mid_flux(tmp_path_factory.mktemp("mid-flux"))


def _need(root: Path, **kw: object) -> int:
    """The need of one call, judged on a budget it fits (the planner's own figure)."""
    result = memfit.plan(str(root), job(**kw), gpu_memory_bytes=10**12, headroom=0.0)
    return result.asked.verdict.need_bytes


def _assert_every_plan_is_judged_by_the_rule(result: PipelinePlans) -> None:
    b = result.budget
    for p in result.fitting:
        assert p.verdict == judge_point(p.verdict.need_bytes, b.capacity_bytes, b.headroom_bytes)
        assert p.verdict.need_bytes + b.headroom_bytes <= b.capacity_bytes


def test_a_call_that_fits_as_asked_comes_back_unchanged_first(flux_mid: Path) -> None:
    asked = job()
    result = memfit.plan(str(flux_mid), asked, gpu="H100")
    assert result.best is result.plans[0] and result.plans[0].job == asked
    assert result.plans[0].changes == () and len(result.plans) == 1  # nothing else is tried


def test_a_budget_only_offloading_meets_gets_a_memory_only_plan_first(flux_mid: Path) -> None:
    asked, offloaded = _need(flux_mid), _need(flux_mid, offload="sequential")
    assert offloaded < asked - 100 * 2**20  # the weights leave the device
    capacity = (asked + offloaded) // 2
    result = memfit.plan(str(flux_mid), job(), gpu_memory_bytes=capacity, headroom=0.0)
    assert not result.asked.fits and result.fits
    best = result.best
    assert best is not None and best.memory_only and best.job.offload != "none"
    assert all(c.kind == "memory-only" for c in best.changes)
    assert any("enable_" in line for line in best.code)
    _assert_every_plan_is_judged_by_the_rule(result)
    # the order: memory-only plans before result-changing ones
    kinds = [p.memory_only for p in result.fitting]
    assert kinds == sorted(kinds, reverse=True)


def test_under_every_memory_only_need_only_result_changing_plans_are_listed(
    flux_mid: Path,
) -> None:
    offloads = [{"offload": "model"}, {"offload": "sequential"}, {"offload": "group"},
                {"offload": "group", "offload_type": "leaf_level", "use_stream": True}]  # fmt: skip
    smallest = min(_need(flux_mid, **o, vae_tiling=t) for o in offloads for t in (False, True))
    result = memfit.plan(str(flux_mid), job(), gpu_memory_bytes=smallest - 1, headroom=0.0)
    assert any(p.job.quant != "none" for p in result.plans)  # the weight ladder was searched
    assert all(not p.memory_only for p in result.fitting)
    assert all(c.kind in ("memory-only", "changes the result") for p in result.plans
               for c in p.changes)  # fmt: skip
    _assert_every_plan_is_judged_by_the_rule(result)


@pytest.mark.slow
def test_flux_dev_on_a_12gb_card_fits_with_a_memory_only_plan_first() -> None:
    """The issue's case: FLUX.1-dev 1024x1024 on an RTX 3060 (12 GB) does not fit as asked."""
    from memfit.spec.diffusion import DiffusionJob

    result = memfit.plan("flux.1-dev", DiffusionJob(), gpu="RTX-3060")
    assert not result.asked.fits and result.fits
    assert result.best is not None and result.best.memory_only
    assert any(not p.memory_only and p.job.quant == "nf4" for p in result.fitting)
    _assert_every_plan_is_judged_by_the_rule(result)
