"""An asked LoRA's dropout (peft lora_dropout; TRL's default 0.05) is kept in every plan: the
planner estimates each candidate with it, as `check`'s fix does for a job file that sets it."""

from __future__ import annotations

from typing import Any

from memfit.estimate.options import using_options
from memfit.plan import PlanRequest
from memfit.plan.search import Plan, plan
from memfit.spec import EstimateOptions

LORA: dict[str, Any] = {
    "seq_len": 512,
    "global_batch": 8,
    "lora_ranks": (16,),
    "lora_asked": True,
    "precision": "bf16-true",
    "confirm": "none",
}


def _plan(**fields: Any) -> Plan:
    with using_options(EstimateOptions(engine="analytic")):
        return plan("qwen3-0.6b", PlanRequest(**LORA, **fields), gpu="L4")


def test_the_asked_dropout_is_in_the_recommended_workload_and_costs_memory() -> None:
    with_dropout, without = _plan(lora_dropout=0.05), _plan()
    assert with_dropout.recommended is not None and without.recommended is not None
    assert with_dropout.recommended.workload.lora_dropout == 0.05
    assert without.recommended.workload.lora_dropout == 0.0
    asked, plain = with_dropout.baseline, without.baseline
    assert asked.workload.lora_dropout == 0.05 and plain.workload.lora_dropout == 0.0
    assert asked.estimate is not None and plain.estimate is not None
    # the dropout masks of the adapters' inputs: the same job as asked needs more with dropout
    assert asked.estimate.peak_allocated_bytes > plain.estimate.peak_allocated_bytes
