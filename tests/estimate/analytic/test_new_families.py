"""The families added for issue 11 (architectures in use now) against the trace engine, with
test_vs_trace.py's bounds (3 % on peak allocated bytes, 5 % without the fixed bytes; exact
parameter counts; the same phases). Precision is given explicitly (bf16: transformers 5.23's
default MoE experts run torch's grouped_mm, which takes bf16 weights only)."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY
from tests.estimate.analytic.test_vs_trace import _ids, assert_matches_trace

from memfit.errors import NotModelledError
from memfit.estimate.analytic import estimate_analytic
from memfit.spec import WorkloadSpec

BF16 = {"precision": "bf16-true"}
CASES = [
    ("qwen3_moe", BF16),
    ("qwen3_moe", {**BF16, "checkpointing": "full"}),
    ("qwen3_moe", {**BF16, "mode": "infer", "new_tokens": 3}),
    ("qwen3_moe", {**BF16, "mode": "infer", "new_tokens": 3, "attention": "eager"}),
    ("qwen3_moe-unnormalised", BF16),
    # experts stored as the checkpoint stores them (memfit.estimate.quant_experts)
    ("qwen3_moe", {**BF16, "mode": "infer", "new_tokens": 3, "quant": "fp8"}),
    ("qwen3_moe", {**BF16, "mode": "infer", "new_tokens": 3, "quant": "int4-gptq"}),
    ("qwen3_moe", {**BF16, "mode": "infer", "quant": "int4-awq", "quant_group_size": 32}),
    ("qwen3_moe", {**BF16, "mode": "infer", "new_tokens": 3, "quant": "nf4"}),
    ("mixtral", {**BF16, "mode": "infer", "new_tokens": 3, "quant": "fp8"}),
    ("olmo2", BF16),
    ("olmo2", {"precision": "amp-bf16"}),
    ("olmo2", {**BF16, "lora_rank": 4}),
    ("olmo2", {**BF16, "checkpointing": "full"}),
    ("olmo2", {**BF16, "mode": "infer", "new_tokens": 3}),
    ("gemma3", BF16),
    ("gemma3", {"precision": "amp-bf16"}),
    ("gemma3", {**BF16, "attention": "eager"}),
    ("gemma3", {**BF16, "mode": "infer", "new_tokens": 3}),
    ("gemma3", {**BF16, "mode": "infer", "new_tokens": 3, "seq_len": 16}),  # inside the window
]


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_new_family_is_within_tolerance_of_the_trace(case, trace_hf) -> None:
    family, overrides = case
    assert_matches_trace(TINY[family], overrides, trace_hf, family)


def test_qwen3_moe_with_dense_layers_is_refused_rather_than_answered() -> None:
    config = dict(TINY["qwen3_moe"], mlp_only_layers=[0])
    with pytest.raises(NotModelledError, match="mlp_only_layers"):
        estimate_analytic(config, WorkloadSpec(batch_size=1, seq_len=16, precision="bf16-true"))


def test_olmo2_norms_q_and_k_over_the_whole_projection_and_each_sub_block_output() -> None:
    """Olmo2Attention's q_norm(num_heads * head_dim) and k_norm(num_kv * head_dim), and two
    post-norms per layer instead of Llama's two pre-norms: q_dim + kv_dim more weights a layer."""
    olmo = TINY["olmo2"]
    llama = dict(olmo, model_type="llama", architectures=["LlamaForCausalLM"])
    wl = WorkloadSpec(batch_size=1, seq_len=16, precision="bf16-true")
    extra = estimate_analytic(olmo, wl).n_params - estimate_analytic(llama, wl).n_params
    head_dim = olmo["hidden_size"] // olmo["num_attention_heads"]
    per_layer = (olmo["num_attention_heads"] + olmo["num_key_value_heads"]) * head_dim
    assert extra == olmo["num_hidden_layers"] * per_layer


def test_gemma3_counts_two_rotary_tables_and_a_q_and_k_norm_per_head() -> None:
    """Gemma3RMSNorm(head_dim) on q and on k: 2 x head_dim weights per layer more than Gemma 2
    (whose soft-caps Gemma 3 drops); the weights are tied by default (Gemma3TextConfig)."""
    g3 = TINY["gemma3"]
    g2 = dict(g3, model_type="gemma2", architectures=["Gemma2ForCausalLM"])
    wl = WorkloadSpec(batch_size=1, seq_len=16, precision="bf16-true")
    extra = estimate_analytic(g3, wl).n_params - estimate_analytic(g2, wl).n_params
    assert extra == g3["num_hidden_layers"] * 2 * g3["head_dim"]


def test_qwen3_moe_fp8_experts_cost_a_byte_a_weight_not_two() -> None:
    """Issue 19: an FP8 checkpoint of Qwen3-MoE was costed with bf16 experts (about 2x). The
    experts' stored bytes now sit within 1 % of one byte per expert weight (scales: 1/16384)."""
    cfg = TINY["qwen3_moe"]
    wl = dict(batch_size=1, seq_len=16, precision="bf16-true", mode="infer")
    bf16 = estimate_analytic(cfg, WorkloadSpec(**wl)).components["parameters"]
    fp8 = estimate_analytic(cfg, WorkloadSpec(**wl, quant="fp8")).components["parameters"]
    e, h, i, n = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"], 3
    expert_weights = n * e * 3 * h * i
    assert bf16 - fp8 >= expert_weights * 0.99  # at least one byte saved per expert weight
