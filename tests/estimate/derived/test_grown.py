"""Forms grown from traces of a few layers give the full-depth trace's bytes: every phase's peak,
its breakdown by component and module, and the reserved bytes, at batch sizes the form never
traced, on dense, MoE, MLA (dense prefix) and sliding-window models."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("transformers")

from memfit.estimate.derived.form import replay_run
from memfit.estimate.derived.record import Recorder, record
from memfit.estimate.trace.engine import RUN_OBSERVER, trace_hf
from memfit.spec import WorkloadSpec

_SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
DENSE = dict(model_type="granite", architectures=["GraniteForCausalLM"], num_hidden_layers=8,
             **_SMALL)  # fmt: skip
MOE = dict(model_type="mixtral", architectures=["MixtralForCausalLM"], num_hidden_layers=8,
           num_local_experts=4, num_experts_per_tok=2, **_SMALL)  # fmt: skip
MLA = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
           num_hidden_layers=8, first_k_dense_replace=1, n_routed_experts=4,
           num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32, n_group=1,
           topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
           qk_nope_head_dim=8, v_head_dim=16, head_dim=8, **_SMALL)  # fmt: skip
SLIDING = dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], num_hidden_layers=14,
               sliding_window=16, head_dim=16, **_SMALL)  # fmt: skip
#: Workspaces of a GPU's first matmuls (the replay takes them first, as the trace engine does).
WORKSPACES = (8 * 2**20, 4 * 2**20)


def _full_trace_run(config: dict[str, Any], w: WorkloadSpec) -> dict[str, Any]:
    rec = Recorder()
    token = RUN_OBSERVER.set(rec)
    try:
        trace_hf(config, w, name="tiny")
    finally:
        RUN_OBSERVER.reset(token)
    (run,) = rec.runs
    return {**run, "a0": run["raw"], "a1": [0] * len(run["raw"])}


def _check(config: dict[str, Any], w: WorkloadSpec, batches: tuple[int, ...]) -> None:
    form, _traced = record(config, w, name="tiny")
    assert "growth" in form, "the form was derived from full traces, not grown"
    assert form["growth"]["traced_layers"][-1] < config["num_hidden_layers"]
    for b in batches:
        runs = form.get("exact", {}).get(str(b), form["runs"])
        # the op count is the trace's length, not memory: grown, it may differ by a few ops
        mine = {**replay_run(runs[0], b, WORKSPACES), "n_ops": None}
        want = {**replay_run(_full_trace_run(config, dataclasses.replace(w, batch_size=b)), b,
                          WORKSPACES), "n_ops": None}  # fmt: skip
        assert mine == want, {k: (mine.get(k), want.get(k)) for k in set(mine) | set(want)
                              if mine.get(k) != want.get(k)}  # fmt: skip


def _train(**kw: Any) -> WorkloadSpec:
    return WorkloadSpec(mode="train", batch_size=1, seq_len=32, precision="bf16-true", **kw)


@pytest.mark.slow
def test_a_grown_dense_form_gives_the_full_traces_bytes() -> None:
    _check(DENSE, _train(), (1, 6))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "workload"),
    [
        (DENSE, _train(checkpointing="full", lora_rank=4)),
        (MOE, _train()),
        (MLA, _train(checkpointing="full")),
        (SLIDING, _train()),
        (
            DENSE,
            WorkloadSpec(mode="infer", batch_size=1, seq_len=32, new_tokens=4, precision="bf16"),
        ),  # fmt: skip
    ],
    ids=["dense-lora-checkpointing", "moe", "mla-dense-prefix", "sliding-window", "generation"],
)
def test_grown_forms_of_other_families_and_techniques_give_the_full_traces_bytes(
    config: dict[str, Any], workload: WorkloadSpec
) -> None:
    _check(config, workload, (1, 5))
