"""The serving command a plan prints names the quantization method vLLM expects."""

from __future__ import annotations

import pytest

from memfit.plan.export import _vllm
from memfit.plan.request import PlanRequest
from memfit.plan.space import Settings


@pytest.mark.parametrize(
    ("quant", "method"), [("fp8", "fp8"), ("int4-awq", "awq"), ("int4-gptq", "gptq")]
)
def test_vllm_line_names_the_quantization_method(quant: str, method: str) -> None:
    s = Settings(precision="bf16", quant=quant, gpus=4, tp=4, micro_batch=32)
    request = PlanRequest(mode="infer", seq_len=7680, new_tokens=512, batch_size=32, gpus=4)
    line = _vllm(s, request, "meta-llama/Llama-3.1-70B")
    assert f"--quantization {method}" in line
    assert "--tensor-parallel-size 4" in line and "--max-model-len 8192" in line


def test_a_plan_stepping_its_optimizer_in_backward_says_how_to_run_it() -> None:
    from memfit.plan.export import export_settings

    s = Settings(precision="bf16-true", optimizer="paged-adamw-8bit", optimizer_in_bwd=True)
    out = export_settings(s, PlanRequest(seq_len=2048), "llama-3.1-8b")
    assert "--optimizer-in-bwd" in out["memfit"]
    assert "register_post_accumulate_grad_hook" in out["optimizer_in_bwd"]
    plain = export_settings(Settings(precision="bf16-true", optimizer="adamw"), PlanRequest(), "m")
    assert "optimizer_in_bwd" not in plain
