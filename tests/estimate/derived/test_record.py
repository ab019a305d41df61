"""A form derived from full traces under autocast with full checkpointing (docs/accuracy.md §14:
refused before, its traces at batch 2, 3 and 4 freed autocast's cached casts in another order)
gives the trace's bytes at a batch size it never traced."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("transformers")

from memfit.estimate.derived.form import replay_run
from memfit.estimate.derived.record import Recorder, record
from memfit.estimate.trace.engine import RUN_OBSERVER, trace_hf
from memfit.spec import WorkloadSpec

#: A model type with no analytic program, two layers: traced in full.
TINY_GRANITE = dict(
    model_type="granite", architectures=["GraniteForCausalLM"], hidden_size=64,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
    vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False,
)  # fmt: skip
WORKSPACES = (8 * 2**20, 4 * 2**20)


def _traced(config: dict[str, Any], w: WorkloadSpec) -> dict[str, Any]:
    rec = Recorder()
    token = RUN_OBSERVER.set(rec)
    try:
        trace_hf(config, w, name="tiny")
    finally:
        RUN_OBSERVER.reset(token)
    (run,) = rec.runs
    return {**run, "a0": run["raw"], "a1": [0] * len(run["raw"])}


@pytest.mark.slow
def test_an_autocast_checkpointed_form_gives_the_traces_bytes_at_an_untraced_batch() -> None:
    w = WorkloadSpec(mode="train", batch_size=1, seq_len=64, precision="bf16-mixed",
                     checkpointing="full")  # fmt: skip
    form, _traced_at = record(TINY_GRANITE, w, name="tiny")
    assert "growth" not in form  # two layers: from full traces
    mine = {**replay_run(form["runs"][0], 7, WORKSPACES), "n_ops": None}
    want = {**replay_run(_traced(TINY_GRANITE, dataclasses.replace(w, batch_size=7)), 7,
                         WORKSPACES), "n_ops": None}  # fmt: skip
    assert mine == want
