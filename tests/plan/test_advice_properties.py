"""Properties of the planner's advice on bundled models with the analytic engine (issue 29):
a LoRA job stays a LoRA job, no plan proposes bf16 on a GPU without it, CPU offload on one GPU
comes only when nothing else fits, and a "nothing fits" names the nearest change that fits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.hardware import get_gpu
from memfit.plan.request import PlanRequest
from memfit.plan.search import plan

MODELS = ("llama-3.1-8b", "mistral-7b-v0.1", "qwen3-8b", "llama-3.2-1b")
GPUS = ("T4", "V100-16GB", "L4", "RTX-4090", "A100-40GB")


def _plan(model: str, gpu: str, **fields: object):  # type: ignore[no-untyped-def]
    request = PlanRequest(confirm="none", **fields)  # type: ignore[arg-type]
    return plan(model, request, gpu=gpu, estimator=None)


def _shown(p):  # type: ignore[no-untyped-def]
    opts = [p.recommended, *p.alternatives, *(o for _, o in p.compare)]
    return [o for o in opts if o is not None]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(GPUS),
    seq=st.sampled_from((1024, 2048, 4096)),
    rank=st.sampled_from((8, 16, 64)),
    allow=st.sampled_from((frozenset(), frozenset({"quant"}), frozenset({"quant", "8bit-optim"}))),
)
def test_a_lora_job_stays_lora_and_no_bf16_without_bf16(
    model: str, gpu: str, seq: int, rank: int, allow: frozenset[str]
) -> None:
    p = _plan(model, gpu, seq_len=seq, lora_ranks=(rank,), lora_asked=True, allow=allow)
    bf16 = get_gpu(gpu).supports_bf16
    for o in _shown(p):
        assert o.settings.lora_rank is not None, o.settings.describe()
        if not bf16:
            assert not o.settings.precision.startswith("bf16"), o.settings.describe()
    # the job as asked is the ecosystem's: LoRA on the checkpoint's 16-bit base
    assert p.baseline.settings.precision == ("bf16-true" if bf16 else "16-true")


@pytest.mark.parametrize(("gpu", "seq"), [("T4", 2048), ("L4", 4096)])
def test_offload_on_one_gpu_only_when_nothing_else_fits(gpu: str, seq: int) -> None:
    """README's example and the issue's: on one small GPU a LoRA job that fits as QLoRA is not
    sent through ZeRO-3 parameter offload (the offload plan is shown beside it instead)."""
    p = _plan("llama-3.1-8b", gpu, seq_len=seq, global_batch=16, lora_ranks=(16,), lora_asked=True)
    assert p.recommended is not None
    assert p.recommended.settings.offload == "none", p.recommended.settings.describe()
    assert p.recommended.settings.quant != "none"
    assert any("offload" in n for n in p.notes), p.notes


def test_a_full_finetune_on_one_gpu_weighs_offload_against_lora_by_step_time() -> None:
    """A full fine-tune whose only ways to fit are ZeRO-Offload (memory-only) or LoRA / freezing
    (changes the result) gets the offload unless it is 3x slower; either way the other is shown
    beside the recommendation and a note says why."""
    p = _plan("llama-3.2-1b", "T4", seq_len=2048, keep_full_finetune=False)
    rec = p.recommended
    assert rec is not None
    shown = [*p.alternatives, *(o for _, o in p.compare)]
    offload = [o for o in [rec, *shown] if o.settings.offload != "none"]
    adapters = [o for o in [rec, *shown] if o.settings.lora_rank or o.settings.freeze_layers]
    assert offload and adapters, [o.settings.describe() for o in shown]
    ratio = offload[0].cost.step_s / adapters[0].cost.step_s
    assert (rec.settings.offload != "none") == (ratio < 3.0)
    assert any(n.startswith("offload:") for n in p.notes), p.notes


def test_nothing_fits_names_the_nearest_change() -> None:
    p = _plan("llama-3.1-70b", "T4", seq_len=32768, lora_ranks=(16,), lora_asked=True)
    assert p.recommended is None
    kinds = {n["kind"] for n in p.nearest}
    assert "changes the job" in kinds  # a shorter sequence
    assert "another GPU" in kinds
    for n in p.nearest:
        if n["kind"] == "another GPU":
            name = n["change"].split()[1]
            assert get_gpu(name).memory_bytes > get_gpu("T4").memory_bytes


def test_side_by_side_shows_the_memory_only_plan_beside_a_result_changing_one() -> None:
    p = _plan(
        "llama-3.1-8b",
        "L4",
        seq_len=4096,
        global_batch=16,
        lora_ranks=(16,),
        lora_asked=True,
        allow=frozenset({"quant"}),
    )
    assert p.recommended is not None and p.recommended.changes_result
    labels = dict(p.compare)
    assert "fastest memory-only" in labels
    assert not labels["fastest memory-only"].changes_result
    assert labels["fastest memory-only"].fits
