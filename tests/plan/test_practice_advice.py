"""Advice on two jobs of the practice benchmark (benchmarks/practice.py) where nothing fits:
axolotl's Llama-3 8-bit LoRA example with its ``lora_modules_to_save`` on a 12 GB card, and
Unsloth's Qwen3-14B notebook on a T4 (docs/accuracy.md, "Practice jobs that do not fit").

The analytic engine searches (``confirm="none"``: no trace), as ``memfit plan --engine analytic``
does; each plan takes about a second.
"""

from __future__ import annotations

from typing import Any

import pytest

from memfit.estimate.options import using_options
from memfit.hardware import get_gpu
from memfit.plan import PlanRequest
from memfit.plan.budget import Budget, fits
from memfit.plan.search import Plan, plan
from memfit.plan.space import Settings
from memfit.spec import EstimateOptions

#: axolotl-ai-cloud/axolotl@107c67ae5a23 examples/llama-3/lora-8b.yml as memfit plans it
#: (sequence_len 4096, micro_batch_size 2 x gradient_accumulation_steps 4, lora_r 32 on every
#: linear, load_in_8bit, adamw_bnb_8bit, lora_modules_to_save [embed_tokens, lm_head])
AXOLOTL_8BIT_LORA: dict[str, Any] = {
    "seq_len": 4096,
    "global_batch": 8,
    "lora_ranks": (32,),
    "lora_asked": True,
    "quant": "int8",
    "optimizer": "adamw-8bit",
    "attention": "flash",
    "lora_modules_to_save": ("embed_tokens", "lm_head"),
    "confirm": "none",
}


def _plan(model: str, gpu: str, **fields: Any) -> Plan:
    with using_options(EstimateOptions(engine="analytic")):
        return plan(model, PlanRequest(**fields), gpu=gpu)


def test_lora_on_an_8_bit_base_is_not_called_qlora() -> None:
    int8 = Settings(precision="bf16-true", lora_rank=32, quant="int8", optimizer="adamw-8bit")
    fp8 = Settings(precision="bf16-true", lora_rank=16, quant="fp8")
    nf4 = Settings(precision="bf16-true", lora_rank=16, quant="nf4-dq")
    assert int8.describe().startswith("bf16-true, LoRA r32, int8,")
    assert fp8.describe().startswith("bf16-true, LoRA r16, fp8,")
    assert nf4.describe().startswith("bf16-true, QLoRA r16, nf4-dq,")


def test_modules_trained_in_full_are_named_in_the_short_form() -> None:
    s = Settings(
        precision="bf16-true",
        lora_rank=32,
        quant="int8",
        lora_modules_to_save=("embed_tokens", "lm_head"),
        micro_batch=2,
        grad_accum=4,
    )
    assert s.describe() == "bf16-true, LoRA r32 + embed_tokens,lm_head, int8, mb 2 x 4"


def test_nothing_fits_with_the_saved_modules_names_the_plan_without_them() -> None:
    p = _plan("llama-3.1-8b", "RTX-3060", **AXOLOTL_8BIT_LORA)
    assert p.recommended is None and p.closest is not None
    # the copies of embed_tokens and lm_head (1.05 B parameters) are trained in every attempt
    assert all(
        r.settings.techniques.lora is not None
        and r.settings.techniques.lora.modules_to_save == ("embed_tokens", "lm_head")
        for r in p.rejected
    )
    dropped = [n for n in p.nearest if n["kind"] == "changes what is trained"]
    assert len(dropped) == 1
    assert dropped[0]["change"].startswith("no --lora-modules-to-save (embed_tokens,lm_head")
    assert "embed_tokens" not in dropped[0]["plan"]
    assert p.nearest[0] is dropped[0], "the same GPU comes before another GPU"


def test_the_plan_without_saved_modules_fits_by_the_verdict_rule() -> None:
    p = _plan("llama-3.1-8b", "RTX-3060", **AXOLOTL_8BIT_LORA)
    without = _plan("llama-3.1-8b", "RTX-3060", **{**AXOLOTL_8BIT_LORA, "lora_modules_to_save": ()})
    dropped = next(n for n in p.nearest if n["kind"] == "changes what is trained")
    assert without.recommended is not None
    # the nearest change is a plan the planner, asked without the copies, finds fitting
    fitting = {o.settings.describe() for o in [without.recommended, *without.alternatives]}
    assert dropped["plan"] in fitting


def test_no_saved_modules_no_such_change() -> None:
    p = _plan("llama-3.1-8b", "RTX-3060", **{**AXOLOTL_8BIT_LORA, "lora_modules_to_save": ()})
    assert all(n["kind"] != "changes what is trained" for n in p.nearest)


@pytest.mark.parametrize("end", ["tight", "over"])
def test_a_closest_attempt_that_is_only_tight_says_so(end: str) -> None:
    """Unsloth's Qwen3-14B notebook on a T4: the closest attempt's estimate is within the card,
    its upper end plus headroom is not (tight); on a 12 GB card it is over even at its estimate."""
    gpu = "T4" if end == "tight" else "RTX-3060"
    p = _plan(
        "qwen3-14b",
        gpu,
        seq_len=2048,
        global_batch=8,
        lora_ranks=(16,),
        lora_asked=True,
        lora_targets=("q", "k", "v", "o", "gate", "up", "down"),
        quant="nf4-dq",
        optimizer="adamw-8bit",
        precision="16-true",
        loss="fused",
        confirm="none",
    )
    assert p.recommended is None and p.closest is not None and p.closest.reason
    est = p.closest.estimate
    assert est is not None
    budget = Budget.of(get_gpu(gpu), headroom=PlanRequest().headroom)
    assert not fits(est, budget)
    if end == "tight":
        assert "; tight: the estimate, " in p.closest.reason
        assert est.device_used_bytes <= budget.capacity_bytes
    else:
        assert "tight" not in p.closest.reason
