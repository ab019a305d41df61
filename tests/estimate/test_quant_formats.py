"""Quantized-weight byte formulas (torch-free) against hand formulas written out here.

The hand formulas count bits per weight the way the libraries' papers and docs state them (QLoRA
§3 for NF4 and double quantization, LLM.int8 for row-wise int8, GPTQ/AWQ's packed int4 with
per-group fp16 scales and packed zeros); they share no code with ``memfit.estimate.quant``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from memfit.errors import SpecError
from memfit.estimate import quant
from memfit.hardware.catalog import get_gpu
from memfit.models import resolve_model

FP32, FP16 = 4, 2


def _llama_linears(name: str) -> list[tuple[int, int]]:
    """(out, in) of every Linear inside the decoder layers of a bundled Llama config."""
    cfg = resolve_model(name).config
    assert cfg is not None
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim
    per_layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    return per_layer * n


def _hand_bytes(fmt: str, n: int, k: int, g: int = 128) -> int:
    w = n * k
    if fmt == "nf4":  # 4 bits + one fp32 absmax per 64 weights, + the 16-entry fp32 code table
        return w * 4 // 8 + (w // 64) * FP32 + 16 * FP32
    if fmt == "nf4-dq":  # absmax as 8 bits per 64 weights + fp32 per 256 absmax + 256-entry code
        return w // 2 + w // 64 + -(-(w // 64) // 256) * FP32 + 256 * FP32 + FP32 + 16 * FP32
    if fmt == "int8":  # one byte per weight + one fp32 scale per output row
        return w + n * FP32
    if fmt == "int4-gptq":  # 4-bit weights, per-(group, column) fp16 scale + 4-bit zero, g_idx
        return w // 2 + (k // g) * n * FP16 + (k // g) * n // 2 + k * 4
    if fmt == "int4-awq":
        return w // 2 + (k // g) * n * FP16 + (k // g) * n // 2
    if fmt == "fp8":  # one byte per weight + one fp32 scale per tensor
        return w + FP32
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["nf4", "nf4-dq", "int8", "int4-gptq", "int4-awq", "fp8"])
def test_llama_2_7b_quantized_layer_bytes_match_the_hand_formula(fmt: str) -> None:
    linears = _llama_linears("llama-2-7b")
    assert len(linears) == 32 * 7
    ours = sum(sum(quant.quantized_linear_bytes(fmt, n, k).values()) for n, k in linears)
    assert ours == sum(_hand_bytes(fmt, n, k) for n, k in linears)


def test_nf4_llama_2_7b_decoder_weights_total() -> None:
    """6.48 B quantized weights × 4.5 bits (4 + 32/64) = 3.64 GB, plus 224 code tables."""
    linears = _llama_linears("llama-2-7b")
    n_weights = sum(n * k for n, k in linears)
    assert n_weights == 6_476_005_376
    total = sum(sum(quant.quantized_linear_bytes("nf4", n, k).values()) for n, k in linears)
    assert total == n_weights * 9 // 16 + 224 * 64


def test_double_quantization_saves_0_373_bits_per_weight_as_in_qlora() -> None:
    """QLoRA §3: double quantization cuts the scale overhead from 32/64 = 0.5 bits per weight to
    8/64 + 32/(64·256) = 0.127 bits, 0.373 bits saved (the per-layer code tables aside)."""
    n, k = 11008, 4096
    single = quant.quantized_linear_bytes("nf4", n, k)
    double = quant.quantized_linear_bytes("nf4-dq", n, k)
    scale_bits_single = single["absmax"] * 8 / (n * k)
    scale_bits_double = (double["absmax"] + double["nested_absmax"]) * 8 / (n * k)
    assert scale_bits_single == 0.5
    assert scale_bits_double == pytest.approx(8 / 64 + 32 / (64 * 256), abs=1e-6)
    assert scale_bits_single - scale_bits_double == pytest.approx(0.373, abs=1e-3)


def test_bitsandbytes_4bit_pads_an_odd_weight_count_to_whole_bytes_and_blocks() -> None:
    parts = quant.quantized_linear_bytes("fp4", 3, 43)  # 129 weights
    assert parts["weight"] == 65 and parts["absmax"] == 3 * FP32


def test_group_size_changes_gptq_scales_and_zeros_only() -> None:
    g128 = quant.quantized_linear_bytes("int4-gptq", 4096, 4096, 128)
    g64 = quant.quantized_linear_bytes("int4-gptq", 4096, 4096, 64)
    assert g64["qweight"] == g128["qweight"] == 4096 * 4096 // 2
    assert g64["scales"] == 2 * g128["scales"] and g64["qzeros"] == 2 * g128["qzeros"]


def test_bias_stays_unquantized_in_its_library_dtype() -> None:
    assert quant.quantized_linear_bytes("nf4", 8, 64, bias=True, dtype="float32")["bias"] == 32
    assert (
        quant.quantized_linear_bytes("int4-awq", 8, 128, bias=True, dtype="float32")["bias"] == 16
    )


def test_rounding_to_allocator_blocks() -> None:
    parts = quant.quantized_linear_bytes("nf4-dq", 4096, 4096, round_to=512)
    assert (
        parts["offset"] == 512 and parts["quant_map"] == 512 and parts["nested_quant_map"] == 1024
    )


def test_kept_out_rules_follow_the_libraries() -> None:
    assert quant.KEPT_OUT["nf4"].skip_output_embeddings
    assert not quant.KEPT_OUT["nf4"].only_repeated_blocks
    assert quant.KEPT_OUT["int4-gptq"].only_repeated_blocks
    assert set(quant.KEPT_OUT) == set(quant.FORMATS)


def test_dequantized_weight_temporaries_follow_the_kernel_path() -> None:
    n, k = 11008, 4096
    # bitsandbytes: fused gemm_4bit for ≤ 4 rows, dequant + F.linear for long prompts
    assert quant.dequant_temporary_bytes("nf4", n, k, n_tokens=1) == 0
    assert quant.dequant_temporary_bytes("nf4", n, k, n_tokens=4096) == n * k * 2
    # AWQ dequantizes to fp16 from 1024 tokens, whatever the compute dtype
    assert quant.dequant_temporary_bytes("int4-awq", n, k, n_tokens=1023, compute_bytes=4) == 0
    assert quant.dequant_temporary_bytes("int4-awq", n, k, n_tokens=1024, compute_bytes=4) == (
        n * k * 2
    )
    # int8 / fp8 never dequantize in forward; every format does for grad-input in backward
    assert quant.dequant_temporary_bytes("int8", n, k, n_tokens=8192) == 0
    assert quant.dequant_temporary_bytes("int8", n, k, n_tokens=1, backward=True) == n * k * 2


def test_awq_group_size_must_divide_in_features() -> None:
    with pytest.raises(SpecError, match=r"quant_group_size \(96\) to divide in_features \(4096\)"):
        quant.quantized_linear_bytes("int4-awq", 4096, 4096, 96)


def test_int4_packing_needs_multiples_of_8() -> None:
    with pytest.raises(SpecError, match=r"in_features \(100\) and out_features \(64\) must be"):
        quant.quantized_linear_bytes("int4-gptq", 64, 100)


def test_unknown_format_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"quant \('int3'\) must be one of"):
        quant.quantized_linear_bytes("int3", 64, 64)


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_reported() -> None:
    problems = quant.gpu_problems("fp8", get_gpu("T4"))
    assert len(problems) == 1 and "compute capability 7.5" in problems[0]
    assert quant.gpu_problems("fp8", get_gpu("H100-80GB")) == []
    assert quant.gpu_problems("nf4", get_gpu("T4")) == []


def test_quant_module_does_not_import_torch() -> None:
    code = "import sys, memfit.estimate.quant; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
