"""Linear layers a quantized checkpoint leaves unquantized stay in the model dtype under vLLM."""

from __future__ import annotations

import pytest

from memfit.hardware.catalog import get_gpu
from memfit.models import ModelSpec, resolve_model
from memfit.serving import simulate_startup
from memfit.serving.ignored import unquantized_linear_params
from memfit.spec.serving import VllmConfig

H, LAYERS, Q, KV_DIM = 8192, 80, 64 * 128, 8 * 128  # Llama-3.1-70B
ATTN_PER_LAYER = H * Q + 2 * H * KV_DIM + Q * H  # q, k, v, o projections


def _spec(quantization_config: dict[str, object]) -> ModelSpec:
    config = dict(resolve_model("llama-3.1-70b").config or {})
    config["quantization_config"] = quantization_config
    return ModelSpec.from_config(config)


def _weights(spec: ModelSpec) -> int:
    config = VllmConfig(tensor_parallel_size=8, max_model_len=8192)
    return simulate_startup(spec, get_gpu("H100"), config).weights_bytes


def test_fbgemm_fp8_with_attention_left_in_bf16_costs_attention_at_two_bytes() -> None:
    # Meta's Llama-3.1-405B-Instruct-FP8 style: fbgemm_fp8, attention in modules_to_not_convert
    plain = _spec({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0})
    skipped = _spec(
        {
            "quant_method": "fbgemm_fp8",
            "activation_scale_ub": 1200.0,
            "modules_to_not_convert": [f"model.layers.{i}.self_attn" for i in range(LAYERS)],
        }
    )
    assert unquantized_linear_params(skipped) == LAYERS * ATTN_PER_LAYER
    # one more byte per attention weight, split over 8 ranks
    assert _weights(skipped) - _weights(plain) == pytest.approx(
        LAYERS * ATTN_PER_LAYER / 8, abs=LAYERS
    )


def test_compressed_tensors_regex_ignore_and_fp8_ignored_layers_match_by_prefix() -> None:
    regex = _spec(
        {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8}}},
            "ignore": ["lm_head", r"re:.*layers\.(0|79)\.mlp\..*"],
        }
    )
    assert unquantized_linear_params(regex) == 2 * 3 * H * 28672  # two layers' gate/up/down
    prefix = _spec({"quant_method": "fp8", "ignored_layers": ["model.layers.0"]})
    assert unquantized_linear_params(prefix) == ATTN_PER_LAYER + 3 * H * 28672


def test_lm_head_only_ignore_lists_change_nothing() -> None:
    spec = _spec({"quant_method": "fp8", "modules_to_not_convert": ["lm_head"]})
    assert unquantized_linear_params(spec) == 0
