"""A pre-quantized checkpoint's quantization_config sets the weight format both engines cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import TINY_LLAMA

import memfit
from memfit.errors import SpecError
from memfit.models.checkpoint_quant import checkpoint_format
from memfit.models.model_spec import QuantizationConfig

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
NF4_DQ = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}
HQQ = {"quant_method": "hqq", "nbits": 4}


def _model(tmp_path: Path, quantization_config: dict) -> str:
    config = dict(TINY_LLAMA, torch_dtype="bfloat16", quantization_config=quantization_config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("config", "quant", "group"),
    [(GPTQ, "int4-gptq", 64), (AWQ, "int4-awq", 128), (FP8, "fp8", None), (NF4_DQ, "nf4-dq", None)],
)
def test_each_format_maps_to_its_quant_value(config: dict, quant: str, group: int | None) -> None:
    found = checkpoint_format(QuantizationConfig.from_config(config))
    assert found is not None and (found.quant, found.group_size) == (quant, group)


@pytest.mark.parametrize("engine", ["analytic", "trace"])
def test_a_gptq_checkpoint_is_costed_as_gptq_weights(tmp_path: Path, engine: str) -> None:
    model = _model(tmp_path, GPTQ)
    infer = memfit.WorkloadSpec(mode="infer")
    by_config = memfit.estimate(model, infer, engine=engine)
    explicit = memfit.estimate(
        model,
        memfit.WorkloadSpec(mode="infer", quant="int4-gptq", quant_group_size=64),
        engine=engine,
    )
    assert by_config.components["parameters"] == explicit.components["parameters"]
    assert by_config.workload["quant"] == "int4-gptq"
    assert any(
        "quantization_config (gptq, 4-bit) sets --quant int4-gptq" in n for n in by_config.notes
    )
    assert any("--quant int4-gptq overrides" in n for n in explicit.notes)


def test_a_flag_overrides_the_checkpoint_and_says_so(tmp_path: Path) -> None:
    model = _model(tmp_path, GPTQ)
    est = memfit.estimate(model, memfit.WorkloadSpec(mode="infer", quant="int8"), engine="analytic")
    assert est.workload["quant"] == "int8"
    assert "--quant int8 overrides the checkpoint's quantization_config (gptq, 4-bit)" in est.notes


def test_full_fine_tuning_a_quantized_checkpoint_asks_for_adapters(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"the checkpoint is quantized .*needs LoRA adapters"):
        memfit.estimate(_model(tmp_path, GPTQ), memfit.WorkloadSpec(), engine="analytic")


def test_a_format_memfit_does_not_model_is_said_not_guessed(tmp_path: Path) -> None:
    est = memfit.estimate(
        _model(tmp_path, HQQ), memfit.WorkloadSpec(mode="infer"), engine="analytic"
    )
    assert est.workload["quant"] == "none"
    assert any("quantization_config (hqq) is not a format memfit models" in n for n in est.notes)


def test_an_mxfp4_checkpoint_sets_mxfp4_experts() -> None:
    found = checkpoint_format(QuantizationConfig.from_config(MXFP4))
    assert found is not None and found.quant == "mxfp4"


def test_an_mxfp4_config_on_a_model_transformers_does_not_convert_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(
        SpecError, match=r"quant 'mxfp4' on model_type 'llama'.*gpt-oss experts only"
    ):
        memfit.estimate(
            _model(tmp_path, MXFP4), memfit.WorkloadSpec(mode="infer"), engine="analytic"
        )


CT_FP8 = {
    "quant_method": "compressed-tensors",
    "config_groups": {"group_0": {"weights": {"type": "float", "num_bits": 8}}},
}


def test_compressed_tensors_fp8_moe_keeps_its_experts_in_the_model_dtype(tmp_path: Path) -> None:
    """transformers 5.23 dequantizes a compressed-tensors checkpoint's experts at load (the
    fused 3-D experts hold no scales): FP8 Linear layers, bf16 experts."""
    from tests.estimate.analytic.configs import TINY

    config = dict(TINY["qwen3_moe"], torch_dtype="bfloat16", quantization_config=CT_FP8)
    (tmp_path / "config.json").write_text(json.dumps(config))
    infer = dict(mode="infer", precision="bf16-true", seq_len=16)
    ct = memfit.estimate(str(tmp_path), memfit.WorkloadSpec(**infer), engine="analytic")
    fp8 = memfit.estimate(
        str(tmp_path), memfit.WorkloadSpec(**infer, quant="fp8"), engine="analytic"
    )
    none = memfit.estimate(
        _unquantized_copy(tmp_path, config), memfit.WorkloadSpec(**infer), engine="analytic"
    )
    assert ct.workload["quant"] == "fp8" and ct.workload["quant_experts"] is False
    assert (
        fp8.components["parameters"] < ct.components["parameters"] < none.components["parameters"]
    )
    assert any("dequantized to the model's dtype at load" in n for n in ct.notes)


def _unquantized_copy(tmp_path: Path, config: dict) -> str:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "quantization_config"})
    )
    return str(plain)
