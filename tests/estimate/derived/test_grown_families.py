"""Grown forms of MoE, MLA, alternating-attention and hybrid stacks give the full-depth trace's
bytes: every phase's peak, its breakdown by component and module, and the reserved bytes, at a
batch size the form never traced. Tiny configs built with transformers' own config classes
(offline), deep enough in layer units for the growth to apply (``grown.MIN_UNITS``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("transformers")

from memfit.estimate.derived.form import replay_run
from memfit.estimate.derived.grown import layer_unit
from memfit.estimate.derived.record import Recorder, record
from memfit.estimate.trace.engine import RUN_OBSERVER, trace_hf
from memfit.spec import WorkloadSpec

_SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
#: Workspaces of a GPU's first matmuls (the replay takes them first, as the trace engine does).
WORKSPACES = (8 * 2**20, 4 * 2**20)


def _config(cls: str, arch: str, **kw: Any) -> dict[str, Any]:
    import transformers

    made = getattr(transformers, cls)(architectures=[arch], **{**_SMALL, **kw})
    return dict(made.to_dict())


def qwen3_moe(**kw: Any) -> dict[str, Any]:
    return _config("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=32, head_dim=16, **kw)  # fmt: skip


def deepseek_v3(**kw: Any) -> dict[str, Any]:
    return _config("DeepseekV3Config", "DeepseekV3ForCausalLM", n_routed_experts=4,
                   num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32, n_group=1,
                   topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                   qk_nope_head_dim=8, v_head_dim=16, head_dim=8, **kw)  # fmt: skip


CONFIGS: dict[str, Any] = {
    "mixtral": lambda: _config("MixtralConfig", "MixtralForCausalLM", num_hidden_layers=8,
                               num_local_experts=4, num_experts_per_tok=2),
    "olmoe": lambda: _config("OlmoeConfig", "OlmoeForCausalLM", num_hidden_layers=8,
                             num_experts=4, num_experts_per_tok=2),
    "qwen3_moe": lambda: qwen3_moe(num_hidden_layers=8),
    # a dense first layer, then dense and sparse layers in turn: prefix 1, period 2
    "qwen3_moe-sparse-step": lambda: qwen3_moe(num_hidden_layers=15, decoder_sparse_step=2,
                                               mlp_only_layers=[0]),
    "deepseek_v3": lambda: deepseek_v3(num_hidden_layers=12, first_k_dense_replace=3),
    "deepseek_v2": lambda: _config("DeepseekV2Config", "DeepseekV2ForCausalLM",
                                   num_hidden_layers=8, first_k_dense_replace=1,
                                   n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                   moe_intermediate_size=32, q_lora_rank=None, kv_lora_rank=16,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                   head_dim=8),
    "gemma2": lambda: _config("Gemma2Config", "Gemma2ForCausalLM", num_hidden_layers=14,
                              sliding_window=16, head_dim=16),
    # 5 sliding : 1 full, and a last period cut short (7 periods + 2 layers)
    "gemma3": lambda: _config("Gemma3TextConfig", "Gemma3ForCausalLM", num_hidden_layers=44,
                              sliding_window=16, head_dim=16),
    "gpt_oss": lambda: _config("GptOssConfig", "GptOssForCausalLM", num_hidden_layers=14,
                               num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                               head_dim=16),
    # MoE every second layer, NoPE chunked attention every fourth: period 4
    "llama4": lambda: _config("Llama4TextConfig", "Llama4ForCausalLM", num_hidden_layers=28,
                              num_local_experts=4, num_experts_per_tok=1,
                              intermediate_size_mlp=128, interleave_moe_layer_step=2,
                              attention_chunk_size=16, head_dim=16),
    # three linear-attention (gated delta net) layers to one full: period 4
    "qwen3_next": lambda: _config("Qwen3NextConfig", "Qwen3NextForCausalLM",
                                  num_hidden_layers=28, num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                  head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                                  linear_num_key_heads=2, linear_num_value_heads=4),
}  # fmt: skip

UNITS = {"mixtral": (0, 1), "olmoe": (0, 1), "qwen3_moe": (0, 1),
         "qwen3_moe-sparse-step": (1, 2), "deepseek_v3": (3, 1), "deepseek_v2": (1, 1),
         "gemma2": (0, 2), "gemma3": (0, 6), "gpt_oss": (0, 2), "llama4": (0, 4),
         "qwen3_next": (0, 4)}  # fmt: skip


def _full_trace_run(config: dict[str, Any], w: WorkloadSpec) -> dict[str, Any]:
    rec = Recorder()
    token = RUN_OBSERVER.set(rec)
    try:
        trace_hf(config, w, name="tiny")
    finally:
        RUN_OBSERVER.reset(token)
    (run,) = rec.runs
    return {**run, "a0": run["raw"], "a1": [0] * len(run["raw"])}


def check_grown(config: dict[str, Any], w: WorkloadSpec, batches: tuple[int, ...]) -> None:
    """The form is grown (not derived from full traces) and its replay at each batch size is
    the full-depth trace's, phase by phase (op count aside: the trace's length, not memory)."""
    form, _traced = record(config, w, name="tiny")
    assert "growth" in form, "the form was derived from full traces, not grown"
    assert form["growth"]["traced_layers"][-1] < config["num_hidden_layers"]
    for b in batches:
        runs = form.get("exact", {}).get(str(b), form["runs"])
        mine = {**replay_run(runs[0], b, WORKSPACES), "n_ops": None}
        want = {**replay_run(_full_trace_run(config, dataclasses.replace(w, batch_size=b)), b,
                             WORKSPACES), "n_ops": None}  # fmt: skip
        assert mine == want, {k: (mine.get(k), want.get(k)) for k in set(mine) | set(want)
                              if mine.get(k) != want.get(k)}  # fmt: skip


def _train(**kw: Any) -> WorkloadSpec:
    return WorkloadSpec(mode="train", batch_size=1, seq_len=32, precision="bf16-true", **kw)


@pytest.mark.parametrize("family", sorted(UNITS))
def test_the_growth_unit_is_the_layer_patterns_period_after_its_prefix(family: str) -> None:
    config = CONFIGS[family]()
    assert layer_unit(config, config["num_hidden_layers"]) == UNITS[family]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_grown_form_of_each_family_gives_the_full_traces_bytes(family: str) -> None:
    check_grown(CONFIGS[family](), _train(), (5,))


GRANITE = dict(model_type="granite", architectures=["GraniteForCausalLM"], num_hidden_layers=8,
               tie_word_embeddings=False, **_SMALL)  # fmt: skip


@pytest.mark.slow
def test_a_grown_form_under_autocast_with_full_checkpointing_gives_the_full_traces_bytes() -> None:
    # bf16-mixed: autocast's weight cache is cleared at once, in hash order (docs/accuracy.md §14)
    w = WorkloadSpec(mode="train", batch_size=1, seq_len=32, precision="bf16-mixed",
                     checkpointing="full")  # fmt: skip
    check_grown(GRANITE, w, (1, 5))
