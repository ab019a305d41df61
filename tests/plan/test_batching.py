"""The planner's fast path: a stack's micro-batch splits estimated in one batch call, pruning by
dominance that never hides a faster plan, confirmation capped to the plans shown, and GPUs
without rates skipped by name."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import TINY_LLAMA
from tests.plan.conftest import closed_form_estimate, closed_form_plan

from memfit.errors import SpecError
from memfit.estimate.result import MemoryEstimate
from memfit.hardware import get_gpu
from memfit.plan import Plan, PlanRequest, plan, recommend_gpus
from memfit.plan.budget import fits
from memfit.plan.engines import CachedEstimator
from memfit.plan.space import Settings, dominates
from memfit.spec import WorkloadSpec
from memfit.units import MiB


def _summary(p: Plan) -> list[tuple[str, int | None, str | None]]:
    shown = [p.recommended, *p.alternatives, *p.rejected]
    return [(o.settings.describe(), o.need_bytes, o.reason) for o in shown if o is not None]


# -- the smallest split, then the others in one batch call ---------------------------------------
def test_a_stacks_smallest_split_comes_first_then_the_others_in_one_batch_call(
    tiny_llama_dir: Path,
) -> None:
    """The smallest split alone first (where it does not fit it prunes the others: issue 32),
    then, where it fits, the stack's other splits in one call; the plans are those of one at a
    time."""
    batches: list[int] = []

    def batch(ws: Sequence[WorkloadSpec]) -> list[MemoryEstimate]:
        batches.append(len(ws))
        # one stack per call: the splits differ in batch size and micro-batch count (and, with
        # accumulation, in the gradients held from the previous micro-batches)
        stacks = {
            repr(dataclasses.replace(w, batch_size=1, grad_accum=1, zero_grad_set_to_none=True))
            for w in ws
        }
        assert len(stacks) == 1
        return [closed_form_estimate(w) for w in ws]

    request = PlanRequest(seq_len=512, global_batch=8)
    batched = CachedEstimator(closed_form_estimate, "closed-form", batch=batch)
    one_by_one = CachedEstimator(closed_form_estimate, "closed-form")
    kw: dict[str, Any] = {"gpu": "A100-80GB", "gpu_memory_bytes": 6 * MiB}
    p = plan(str(tiny_llama_dir), request, estimator=batched, **kw)
    q = plan(str(tiny_llama_dir), request, estimator=one_by_one, **kw)
    assert p.recommended is not None and _summary(p) == _summary(q)
    assert batched.n_batches == len(batches) > 0
    # splits of 8: 1 alone, then (where it fits) 2, 4 and 8 in one call
    assert max(batches) == 3 and batches.count(1) > batches.count(3)
    assert batched.n_calls >= sum(batches)


def test_a_stack_whose_smallest_split_does_not_fit_is_estimated_once(
    tiny_llama_dir: Path,
) -> None:
    """Its larger splits keep more: they cannot fit either, and are not estimated; where the
    smallest fits, the others follow in one call."""
    asked: dict[str, list[list[MemoryEstimate]]] = {}

    def batch(ws: Sequence[WorkloadSpec]) -> list[MemoryEstimate]:
        stack = repr(dataclasses.replace(ws[0], batch_size=1, grad_accum=1))
        found = [closed_form_estimate(w) for w in ws]
        asked.setdefault(stack, []).append(found)
        return found

    request = PlanRequest(seq_len=512, global_batch=8)
    engine = CachedEstimator(closed_form_estimate, "closed-form", batch=batch)
    kw: dict[str, Any] = {"gpu": "A100-80GB", "gpu_memory_bytes": 6 * MiB}
    p = plan(str(tiny_llama_dir), request, estimator=engine, **kw)
    assert p.recommended is not None
    once = twice = 0
    for calls in asked.values():
        assert len(calls[0]) == 1 and len(calls) <= 2  # the smallest split alone first
        if fits(calls[0][0], p.budget):
            twice += len(calls) == 2  # (none left where the others were pruned already)
        else:
            assert len(calls) == 1  # a miss: the larger splits are never estimated
            once += 1
    assert once > 0 and twice > 0


def test_the_analytic_engine_in_batches_gives_the_plans_of_one_at_a_time(
    tiny_llama_dir: Path,
) -> None:
    from memfit.estimate import analytic

    calls: list[int] = []
    real_many = analytic.estimate_many

    def spy(model: Any, ws: Sequence[WorkloadSpec], **kw: Any) -> list[MemoryEstimate]:
        calls.append(len(ws))
        return real_many(model, ws, **kw)

    l4 = get_gpu("L4")
    # confirm="none": the trace engine is not asked; 740-800 MiB: the CUDA context takes ~600
    # MiB, so some splits and stacks of the tiny Llama fit and others do not
    request = PlanRequest(seq_len=512, global_batch=8, confirm="none")
    for capacity_mib in (740, 760, 800):
        kw: dict[str, Any] = {"gpu": "L4", "gpu_memory_bytes": capacity_mib * MiB}
        with mock.patch.object(analytic, "estimate_many", spy):
            p = plan(str(tiny_llama_dir), request, **kw)
        one = CachedEstimator(
            lambda w: analytic.estimate_analytic(dict(TINY_LLAMA), w, gpu=l4), "analytic"
        )
        q = plan(str(tiny_llama_dir), request, estimator=one, **kw)
        assert p.search_engine == "analytic" and p.recommended is not None
        assert _summary(p) == _summary(q)
    assert calls and max(calls) > 1


def test_estimate_many_matches_estimate_analytic_on_every_split() -> None:
    from memfit.estimate.analytic import estimate_analytic, estimate_many

    l4 = get_gpu("L4")
    base = WorkloadSpec(seq_len=256, precision="bf16", lora_rank=8, checkpointing="selective")
    ws = [dataclasses.replace(base, batch_size=b) for b in (1, 2, 3, 4, 8, 16)]
    for many, w in zip(estimate_many(dict(TINY_LLAMA), ws, gpu=l4), ws, strict=True):
        one = estimate_analytic(dict(TINY_LLAMA), w, gpu=l4)
        assert many.components == one.components, w.batch_size
        assert many.device_used_bytes == one.device_used_bytes


def test_a_failing_batch_call_falls_back_to_one_at_a_time() -> None:
    def batch(ws: Sequence[WorkloadSpec]) -> list[MemoryEstimate]:
        raise SpecError("the batch engine does not model this")

    def one(w: WorkloadSpec) -> MemoryEstimate:
        if w.batch_size == 3:
            raise SpecError("batch 3 is not modelled")
        return closed_form_estimate(w)

    engine = CachedEstimator(one, "stand-in", batch=batch)
    ws = [WorkloadSpec(batch_size=b) for b in (1, 2, 3)]
    engine.prefetch(ws)
    assert engine.n_calls == 3 and engine.n_batches == 0
    assert engine(ws[0]).components == closed_form_estimate(ws[0]).components
    with pytest.raises(SpecError, match="batch 3 is not modelled"):
        engine(ws[2])
    assert engine.n_calls == 3  # the error was cached, not asked again


# -- dominance ------------------------------------------------------------------------------------
def _s(**kw: Any) -> Settings:
    return Settings(**{"precision": "amp-bf16", "optimizer": "adamw-fused", **kw})


def test_dominance_orders_precision_lora_rank_and_freezing() -> None:
    assert dominates(_s(), _s(precision="bf16-true"))  # mixed keeps fp32 weights, grads, states
    assert not dominates(_s(precision="bf16-true"), _s())
    assert not dominates(_s(precision="bf16-mixed"), _s(precision="16-true"))  # other width
    assert dominates(_s(lora_rank=64), _s(lora_rank=16))
    assert not dominates(_s(lora_rank=16), _s(lora_rank=64))
    assert dominates(_s(), _s(freeze_layers=2))  # none frozen keeps more than two
    assert not dominates(_s(freeze_layers=2), _s())
    # full fine-tuning and LoRA are not compared: LoRA's dropout copies can outgrow the saving
    assert not dominates(_s(), _s(lora_rank=16)) and not dominates(_s(lora_rank=16), _s())
    assert dominates(
        _s(micro_batch=4, checkpointing="none"), _s(micro_batch=2, checkpointing="full")
    )
    assert not dominates(_s(micro_batch=1), _s(micro_batch=2))


def _closed_form_plan(tiny_llama_dir: Path, capacity: int, **kw: Any) -> Plan:
    return closed_form_plan(tiny_llama_dir, capacity, n_alternatives=2, **kw)


@settings(max_examples=5, deadline=None)
@given(capacity=st.integers(min_value=3 * MiB, max_value=30 * MiB), memory=st.booleans())
def test_pruning_never_hides_a_faster_plan_that_fits(
    tiny_llama_dir: Path, capacity: int, memory: bool
) -> None:
    goal = "memory" if memory else "throughput"
    pruned = _closed_form_plan(tiny_llama_dir, capacity, goal=goal)
    with mock.patch("memfit.plan.search.dominates", return_value=False):
        exhaustive = _closed_form_plan(tiny_llama_dir, capacity, goal=goal)
    assert pruned.n_estimated <= exhaustive.n_estimated
    got = [
        (o.settings.describe(), o.need_bytes)
        for o in (pruned.recommended, *pruned.alternatives)
        if o
    ]
    want = [
        (o.settings.describe(), o.need_bytes)
        for o in (exhaustive.recommended, *exhaustive.alternatives)
        if o
    ]
    assert got == want


def test_pruning_skips_most_combinations_of_a_real_model() -> None:
    p = plan(
        "llama-3.1-8b",
        PlanRequest(seq_len=4096, global_batch=16, confirm="none"),
        gpu="L4",
    )
    assert p.recommended is not None and p.search_engine == "analytic"
    assert p.n_estimated < p.n_candidates / 4
    assert p.n_confirmed == 0


# -- confirmation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "n_confirmed"), [("shown", 3), ("recommended", 1), ("none", 0)])
def test_confirmation_is_capped_to_the_plans_shown(
    tiny_llama_dir: Path, mode: str, n_confirmed: int
) -> None:
    confirm = CachedEstimator(closed_form_estimate, "stand-in-trace")
    p = plan(
        str(tiny_llama_dir),
        PlanRequest(seq_len=512, global_batch=8, n_alternatives=2, confirm=mode),
        gpu="A100-80GB",
        gpu_memory_bytes=8 * MiB,
        estimator=closed_form_estimate,
        confirm=confirm,
    )
    assert p.recommended is not None and len(p.alternatives) == 2
    assert confirm.n_calls == p.n_confirmed == n_confirmed
    shown = [p.recommended, *p.alternatives]
    assert [o.confirmed_by for o in shown].count("stand-in-trace") == n_confirmed
    if mode != "shown":
        assert any(f"confirm={mode}" in n for n in p.notes)


def test_an_unknown_confirm_mode_is_refused() -> None:
    with pytest.raises(
        SpecError, match=r"confirm \('all'\) must be one of auto, shown, recommended, none"
    ):
        PlanRequest(confirm="all")


# -- GPUs without rates ---------------------------------------------------------------------------
def test_recommend_gpus_skips_gpus_without_rates_and_names_them(tmp_path: Path) -> None:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    no_rates = dataclasses.replace(
        get_gpu("L4"),
        name="NoRates-24GB",
        memory_bandwidth_gbps=None,
        bf16_dense_tflops=None,
        fp16_dense_tflops=None,
        fp32_tflops=None,
    )
    advice = recommend_gpus(
        str(d),
        PlanRequest(seq_len=256, global_batch=4, confirm="none"),
        gpus=[no_rates, get_gpu("L4")],
        estimator=closed_form_estimate,
    )
    assert [a.gpu for a in advice] == ["L4"]
    assert len(advice.notes) == 1
    assert "skipped 1 GPU(s) without a published compute rate" in advice.notes[0]
    assert "NoRates-24GB" in advice.notes[0]
