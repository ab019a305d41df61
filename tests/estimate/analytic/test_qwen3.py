"""Qwen3 (dense): one declaration (``families.QWEN3``: Qwen2 with per-head q/k RMSNorms) against
the trace engine, with test_vs_trace.py's bounds (3 % on peak allocated bytes, 5 % without the
cuBLAS workspaces; exact parameter counts; the same phases)."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY_QWEN3
from tests.estimate.analytic.test_vs_trace import _ids, assert_matches_trace

from memfit.estimate.analytic import estimate_analytic, supports
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

CASES = [
    ("qwen3", {}),
    ("qwen3", {"precision": "amp-bf16"}),
    ("qwen3", {"checkpointing": "full"}),
    ("qwen3", {"lora_rank": 4}),
    ("qwen3", {"mode": "infer", "new_tokens": 3}),
    ("qwen3", {"mode": "infer", "new_tokens": 3, "attention": "eager"}),
]


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_qwen3_is_within_tolerance_of_the_trace(case, trace_hf) -> None:
    _, overrides = case
    assert_matches_trace(TINY_QWEN3, overrides, trace_hf, "qwen3")


def test_qwen3_adds_a_q_and_a_k_norm_per_layer_to_the_same_llama() -> None:
    """Qwen3RMSNorm(head_dim) on q and on k: 2 x head_dim weights per layer, nothing else."""
    llama = dict(TINY_QWEN3, model_type="llama", architectures=["LlamaForCausalLM"])
    wl = WorkloadSpec(batch_size=1, seq_len=16)
    extra = estimate_analytic(TINY_QWEN3, wl).n_params - estimate_analytic(llama, wl).n_params
    assert extra == TINY_QWEN3["num_hidden_layers"] * 2 * TINY_QWEN3["head_dim"]


def test_the_bundled_qwen3_counts_the_published_parameters() -> None:
    """Qwen3-0.6B: 0.6B parameters, 0.44B of them outside the (tied) embedding (model card)."""
    source = resolve_model("qwen3-0.6b")
    assert supports(source.config)
    est = estimate_analytic(source, WorkloadSpec(batch_size=1, seq_len=128))
    embedding = source.config["vocab_size"] * source.config["hidden_size"]
    assert round(est.n_params / 1e9, 1) == 0.6
    assert round((est.n_params - embedding) / 1e9, 2) == 0.44
