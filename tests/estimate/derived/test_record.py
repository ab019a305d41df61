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
from memfit.estimate.derived.staging import constant_stage
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
    stage = constant_stage(run.get("stage", []))  # the reductions' arguments, as traced
    return {**run, "a0": run["raw"], "a1": [0] * len(run["raw"]), "stage": stage}


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


#: ResNet at 32 px: the last stage is 1 x 1, so at batch 1 each BatchNorm there sees one value per
#: channel, and PyTorch refuses to train it ("Expected more than 1 value per channel when
#: training") — the trace's answer at batch 1, on a GPU too (``F.batch_norm`` checks in Python).
TINY_RESNET = dict(
    model_type="resnet", architectures=["ResNetForImageClassification"], num_channels=3,
    embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], layer_type="bottleneck",
    hidden_act="relu", image_size=32,
)  # fmt: skip


@pytest.mark.slow  # five traces: 33 s on this loaded 2-core machine
def test_a_job_that_cannot_run_at_batch_one_is_derived_from_batches_two_to_four(
    tmp_path: Any,
) -> None:
    import json

    from memfit.errors import TraceError
    from memfit.estimate.derived import estimate_derived
    from memfit.estimate.policy import run_engine
    from memfit.models import resolve_model

    (tmp_path / "config.json").write_text(json.dumps(TINY_RESNET))
    source = resolve_model(str(tmp_path))
    w = WorkloadSpec(mode="train", batch_size=5, seq_len=32, precision="bf16-true")
    mine = estimate_derived(source, w)  # builds the form: batch 1 fails, 2, 3 and 4 are solved
    trace = run_engine("trace", source, w, None)
    assert mine.engine == "derived" and mine.trace["derived"]["batch_points"] == [2, 3, 4]
    assert (mine.peak_allocated_bytes, mine.peak_reserved_bytes) == (
        trace.peak_allocated_bytes,
        trace.peak_reserved_bytes,
    )
    assert mine.components == trace.components
    with pytest.raises(TraceError, match="Expected more than 1 value per channel when training"):
        run_engine("trace", source, dataclasses.replace(w, batch_size=1), None)
    with pytest.raises(TraceError, match="Expected more than 1 value per channel when training"):
        estimate_derived(source, dataclasses.replace(w, batch_size=1))


def _recorded(sizes: list[int]) -> Recorder:
    """A recorder holding one run of two births (an activation, then a kernel workspace)."""
    rec = Recorder()
    rec.runs = [{
        "counts": {"layers": 2}, "ev": [0, 2, 3, 1], "raw": sizes, "marks": [[0, "backward"]],
        "comps": ["activations", "temporary"], "mods": ["fc", "(backward) AddmmBackward0"],
        "comp": [0, 1], "mod": [0, 1], "ignored": [], "const": {}, "stage": [],
    }]  # fmt: skip
    return rec


def test_sizes_not_linear_in_the_batch_are_refused_naming_the_first_module() -> None:
    from memfit.errors import NotModelledError
    from memfit.estimate.derived.record import solve

    # (CUDA reduction staging is not among such sizes: tests/estimate/derived/test_staging.py)
    runs = [_recorded([100 * b + b * b, 8]) for b in (1, 2, 3)]
    with pytest.raises(NotModelledError, match=r"1 allocation sizes .* first in fc\)$"):
        solve(runs, points=(1, 2, 3))
