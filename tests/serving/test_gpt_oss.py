"""gpt-oss under vLLM: MXFP4 experts as vLLM stores them, the sliding/full hybrid KV cache, and the
refusals (old vLLM, GPUs below compute capability 8.0), against published start-up logs."""

from __future__ import annotations

import pytest

from memfit.hardware.catalog import get_gpu
from memfit.models import resolve_model
from memfit.serving import simulate_startup
from memfit.serving.mxfp4 import backend_for, mxfp4_experts, triton_layout
from memfit.spec.serving import VllmConfig
from memfit.units import GiB

LLMD_TOTAL = int(79.18 * GiB)  # "Free memory on device (78.57/79.18 GiB)", llm-d-benchmark H100


def _spec(name: str):  # type: ignore[no-untyped-def]
    spec = resolve_model(name).spec
    assert spec is not None
    return spec


def _run(name: str, gpu: str = "H100", **kw: object):  # type: ignore[no-untyped-def]
    config = VllmConfig(**kw)  # type: ignore[arg-type]
    return simulate_startup(_spec(name), get_gpu(gpu), config, total_bytes=LLMD_TOTAL)


@pytest.mark.parametrize(("name", "logged_gib"), [("gpt-oss-20b", 13.47), ("gpt-oss-120b", 64.38)])
def test_mxfp4_weights_match_vllms_model_loading_line_within_one_percent(
    name: str, logged_gib: float
) -> None:
    # llm-d-benchmark config_explorer/empirical-vllm-memory-results.md (H100, triton backend);
    # 64.38 GiB also in vllm-project/vllm#33155 (v0.14.1). Within 1 % because the loaded
    # scales are counted next to their swizzled copy (memfit.serving.mxfp4).
    s = _run(name, max_model_len=16000, vllm_version="0.11")
    assert s.weights_bytes / GiB == pytest.approx(logged_gib, rel=0.01)
    assert s.weight_format == "mxfp4"


def test_gpt_oss_20b_available_kv_matches_the_llmd_log() -> None:
    s = _run("gpt-oss-20b", max_model_len=16000, vllm_version="0.11")
    assert s.activation_peak_bytes / GiB == pytest.approx(7.38, abs=0.05)  # sampler, 201k vocab
    assert s.available_kv_bytes / GiB == pytest.approx(50.28, rel=0.01)
    assert s.starts


def test_sliding_and_full_layers_make_two_kv_groups_and_sliding_ones_hold_only_the_window() -> None:
    s = _run("gpt-oss-20b", max_model_len=16000)
    assert set(s.kv.kinds) == {"sliding", "full"}
    # one 16000-token request: 12 full layers hold 16000 tokens, 12 sliding ones 128 - 1 +
    # max_num_batched_tokens (8192) at most
    per_token_layer = 2 * 8 * 64 * 2  # K and V, 8 heads of 64, bf16
    full = 12 * -(-16000 // 16) * 16 * per_token_layer
    assert full < s.kv.needed_bytes < 2 * full * 0.8


def test_experts_stay_mxfp4_and_everything_else_bf16() -> None:
    e = mxfp4_experts(_spec("gpt-oss-20b"), tp=1, cc=(9, 0))
    logical_bytes_bf16 = e.logical_params * 2 / 24  # per layer
    # 4.25 bits a weight (+ Hopper padding, fp32 biases): about a quarter of bf16
    assert 0.25 < e.bytes_per_layer / logical_bytes_bf16 < 0.30


def test_backend_follows_the_gpu() -> None:
    assert backend_for((9, 0)) == "triton"
    assert backend_for((10, 0)) == "flashinfer-sm100"
    assert backend_for((8, 0)) == backend_for((8, 9)) == "marlin"


def test_tensor_parallel_splits_the_expert_intermediate_size() -> None:
    one = mxfp4_experts(_spec("gpt-oss-120b"), tp=1, cc=(9, 0)).bytes_per_layer
    two = mxfp4_experts(_spec("gpt-oss-120b"), tp=2, cc=(9, 0)).bytes_per_layer
    assert two == pytest.approx(one / 2, rel=0.05)


def test_gpu_below_compute_capability_8_is_refused_as_vllm_refuses_mxfp4() -> None:
    s = simulate_startup(_spec("gpt-oss-20b"), get_gpu("T4"), VllmConfig())
    assert not s.starts and s.refused_layout
    assert s.error is not None and "Minimum capability: 80. Current capability: 75" in s.error


def test_vllm_before_0_10_does_not_know_the_architecture() -> None:
    s = _run("gpt-oss-20b", vllm_version="0.9")
    assert not s.starts and s.error is not None
    assert "GptOssForCausalLM" in s.error and any("0.10" in n for n in s.notes)


def test_120b_on_one_h100_at_full_context_fails_and_names_the_largest_length() -> None:
    # vLLM 0.19 at its 0.9 default (0.34's extensible KV cache starts it: test_extensible.py)
    cfg = VllmConfig(vllm_version="0.19")
    s = simulate_startup(_spec("gpt-oss-120b"), get_gpu("H100"), cfg)
    assert not s.starts and s.error is not None and "max seq len (131072)" in s.error
    assert s.largest_max_model_len is not None and 50_000 < s.largest_max_model_len < 131072


def test_awq_on_a_bundled_model_sizes_its_usual_4bit_checkpoint_offline() -> None:
    # llm-d-planner v0.19.0: RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 (GPTQ 4-bit,
    # group 128) logged 5.38 GiB; the AWQ variant of the same model packs the same bytes.
    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    for method in ("awq", "gptq_marlin"):
        config = VllmConfig(quantization=method, max_model_len=8192, gpu_memory_utilization=0.95)
        s = simulate_startup(spec, get_gpu("H100"), config, total_bytes=int(79.19 * GiB))
        assert s.weights_bytes / GiB == pytest.approx(5.38, rel=0.01)
        assert s.weight_format.endswith("g128") and any("group 128" in n for n in s.notes)


# llm-d-planner accuracy/results/v0.19.0/logs/ (commit 56dc5b76), vLLM 0.19.0 on an H100:
# "Model loading took 13.64 GiB" (TP 1, --gpu-memory-utilization 0.95) and 7.01 GiB (TP 2, 0.9).
@pytest.mark.parametrize(("tp", "util", "logged_gib"), [(1, 0.95, 13.64), (2, 0.9, 7.01)])
def test_vllm_0_19_weights_match_its_logs_within_one_percent(
    tp: int, util: float, logged_gib: float
) -> None:
    config = VllmConfig(
        vllm_version="0.19.0",
        max_model_len=8192,
        gpu_memory_utilization=util,
        tensor_parallel_size=tp,
    )
    s = simulate_startup(
        _spec("gpt-oss-20b"), get_gpu("H100"), config, total_bytes=int(79.19 * GiB)
    )
    assert s.weights_bytes / GiB == pytest.approx(logged_gib, rel=0.01)
    assert any("triton_kernels v3.6.0, its loaded scales kept" in n for n in s.notes)


def test_the_vendored_triton_kernels_and_the_kept_scales_follow_the_release() -> None:
    # cmake/external_projects/triton_kernels.cmake: v3.5.0 (0.12-0.16), v3.6.0 (0.17-0.21),
    # v3.5.1 (0.22-); fused_moe/oracle/mxfp4.py deletes the loaded scales from 0.27.
    assert triton_layout(14).tag == "v3.5.0" and triton_layout(14).scales_kept
    assert triton_layout(17).tag == triton_layout(21).tag == "v3.6.0"
    assert triton_layout(22).tag == "v3.5.1" and triton_layout(26).scales_kept
    assert not triton_layout(27).scales_kept and not triton_layout(34).scales_kept
    assert triton_layout(None).tag == "main" and not triton_layout(None).scales_kept


def test_v3_6_pads_gpt_oss_values_to_64_bytes_and_0_27_frees_the_loaded_scales() -> None:
    spec = _spec("gpt-oss-20b")
    e = {m: mxfp4_experts(spec, tp=1, cc=(9, 0), vllm_minor=m).bytes_per_layer for m in (16, 19)}
    # w13 (5760 rows x 1440 bytes) and w2 (2880 x 1440): 1440 -> 1472 bytes a row, 32 experts
    assert e[19] - e[16] == 32 * (5760 + 2880) * (1472 - 1440)
    kept = mxfp4_experts(spec, tp=1, cc=(9, 0), vllm_minor=26).bytes_per_layer
    freed = mxfp4_experts(spec, tp=1, cc=(9, 0), vllm_minor=27).bytes_per_layer
    assert kept - freed == 32 * (5760 * 2880 // 32 + 2880 * 2880 // 32)  # one uint8 per 32
