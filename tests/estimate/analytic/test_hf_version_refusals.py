"""The analytic engine and the per-rank closed form refuse what only the trace engine runs:
an old transformers' fp32 logits and an old peft's adapter dtype (memfit.spec.hf_versions); a
job they refuse goes to the next engine (estimate/policy.py), never answered as another job.
peft's LoRA dropout is modelled (tests/estimate/analytic/test_lora_dropout.py)."""

from __future__ import annotations

import pytest

from memfit.errors import NotModelledError
from memfit.estimate.analytic import estimate_analytic
from memfit.estimate.parallel import estimate_parallel
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec


def test_old_fp32_logits_and_old_peft_are_refused_by_the_analytic_engine() -> None:
    source = resolve_model("llama-3.2-1b")
    with pytest.raises(NotModelledError, match="fp32 logits"):
        estimate_analytic(source, WorkloadSpec(transformers_version="4.40"))
    with pytest.raises(NotModelledError, match="peft_version"):
        estimate_analytic(source, WorkloadSpec(lora_rank=8, peft_version="0.10"))
    # a release from 4.46 on runs the installed rules: answered
    assert estimate_analytic(source, WorkloadSpec(transformers_version="4.50")).peak_allocated_bytes


def test_the_per_rank_closed_form_refuses_old_fp32_logits() -> None:
    source = resolve_model("llama-3.2-1b")
    w = WorkloadSpec(gpus=2, pp=2, grad_accum=4, transformers_version="4.39")
    with pytest.raises(NotModelledError, match="fp32 logits"):
        estimate_parallel(source, w)
