"""Each technique changes the estimate the way the real code path does (on emulated CUDA)."""

from __future__ import annotations

import pytest
from tests.conftest import TINY_BERT, TINY_LLAMA

from memfit.errors import SpecError
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec


def est(config: dict = TINY_LLAMA, **workload):
    workload = {"batch_size": 2, "seq_len": 256, "precision": "bf16-true", **workload}
    return trace_hf(config, WorkloadSpec(**workload), name="t")


def test_flash_attention_removes_the_quadratic_term() -> None:
    """Doubling the sequence doubles flash activations; eager adds a B·H·S² term on top."""
    flash = [est(seq_len=s).components["activations"] for s in (256, 512)]
    eager = [est(seq_len=s, attention="eager").components["activations"] for s in (256, 512)]
    assert abs(flash[1] - 2 * flash[0]) < 0.05 * flash[0]
    assert eager[1] - 2 * eager[0] > 0.3 * eager[0]
    assert est(attention="eager").attention_backends == {}
    assert est().attention_backends == {"flash": 6}  # 3 layers × 2 traced steps


def test_sdpa_picks_the_kernel_a_cuda_gpu_would_pick() -> None:
    assert set(est().attention_backends) == {"flash"}  # bf16, no mask
    # fp32 with grouped-query heads: no flash (fp32), no memory-efficient (no GQA) -> math
    assert set(est(precision="fp32").attention_backends) == {"math"}
    mha = {**TINY_LLAMA, "num_key_value_heads": 4}
    assert set(est(mha, precision="fp32").attention_backends) == {"efficient"}
    assert set(est(TINY_BERT, precision="fp32").attention_backends) == {"efficient"}


def test_optimizer_states_follow_the_optimizer() -> None:
    params = est(optimizer="none").n_params
    adamw = est().phases["optimizer"].components["optimizer_states"]
    sgd_m = est(optimizer="sgd-momentum").phases["optimizer"].components["optimizer_states"]
    sgd = est(optimizer="sgd").phases["optimizer"].components["optimizer_states"]
    assert adamw >= 2 * params * 2  # two bf16 moments per parameter
    assert sgd_m >= params * 2 and sgd_m < adamw
    assert sgd == 0


def test_amp_keeps_fp32_master_weights_and_gradients() -> None:
    pure, amp = est(), est(precision="amp-bf16")
    assert amp.components["parameters"] == pytest.approx(
        2 * pure.components["parameters"], rel=0.01
    )
    assert amp.phases["optimizer"].components["optimizer_states"] == pytest.approx(
        2 * pure.phases["optimizer"].components["optimizer_states"], rel=0.01
    )


def test_checkpointing_trades_activations_for_recomputation() -> None:
    none, sel, full = (
        est(checkpointing=c).phases["forward"] for c in ("none", "selective", "full")
    )
    acts = [p.components["activations"] for p in (none, sel, full)]
    assert acts[0] > acts[1] > acts[2]


def test_lora_trains_only_the_adapters() -> None:
    full, lora = est(), est(lora_rank=4)
    assert lora.n_trainable_params < 0.1 * full.n_trainable_params
    assert lora.phases["optimizer"].components["optimizer_states"] < (
        0.1 * full.phases["optimizer"].components["optimizer_states"]
    )


def test_freezing_layers_removes_their_gradients_and_states() -> None:
    full, frozen = est(), est(freeze_layers=2)
    assert frozen.n_trainable_params < full.n_trainable_params
    assert frozen.components["activations"] < full.components["activations"]


def test_inference_separates_the_kv_cache_and_grows_it_with_new_tokens() -> None:
    long = est(mode="infer", new_tokens=64)
    # after the last decode step: 3 layers × (K, V) of (batch 2, 2 KV heads, 256 + 63 tokens, 32)
    per_tensor = -(-(2 * 2 * 319 * 32 * 2) // 512) * 512  # bf16, in 512-byte blocks
    kv = long.phases["decode"].components["kv_cache"]
    # at most one layer's old K and V are still alive while torch.cat builds the new ones
    assert 6 * per_tensor <= kv <= 8 * per_tensor
    assert long.phases["prefill"].components["gradients"] == 0
    assert long.phases["prefill"].components["kv_cache"] < kv


def test_foreach_adamw_allocates_a_parameter_sized_temporary() -> None:
    foreach, fused = est(), est(optimizer="adamw-fused")
    params = foreach.components["parameters"]
    extra = (
        foreach.phases["optimizer"].peak_allocated_bytes
        - fused.phases["optimizer"].peak_allocated_bytes
    )
    assert extra >= 0.9 * params


def test_lora_targets_that_match_nothing_list_the_models_linear_modules() -> None:
    with pytest.raises(SpecError, match=r"its linear modules are down_proj, gate_proj, k_proj, "):
        est(lora_rank=8, lora_targets=("query",))
