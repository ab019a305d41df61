"""The trace engine's layer plan reads the layer counts and their keys from the ModelSpec."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from memfit.estimate.trace.build import layer_plan, with_layer_counts  # noqa: E402
from memfit.models import resolve_model  # noqa: E402


def test_the_layer_count_is_rewritten_under_the_key_it_was_read_from() -> None:
    config = resolve_model("gpt2").config
    assert config is not None
    (var,) = layer_plan(config)
    assert (var.key, var.count, var.period) == ("n_layer", 12, 1)
    assert with_layer_counts(config, [var], {"layers": 2}, False)["n_layer"] == 2


def test_gemma2_alternating_layers_have_period_two() -> None:
    config = resolve_model("gemma-2-2b").config
    assert config is not None
    (var,) = layer_plan(config)
    assert (var.key, var.count, var.period) == ("num_hidden_layers", 26, 2)


def test_t5_and_clip_have_two_stacks_each() -> None:
    t5 = layer_plan(resolve_model("flan-t5-large").config or {})
    assert [(v.name, v.key, v.count) for v in t5] == [
        ("encoder", "num_layers", 24),
        ("decoder", "num_decoder_layers", 24),
    ]
    clip = layer_plan(resolve_model("clip-vit-large-patch14").config or {})
    assert [(v.name, v.path, v.count) for v in clip] == [
        ("text_config", ("text_config",), 12),
        ("vision_config", ("vision_config",), 24),
    ]


def test_a_count_only_a_default_gives_is_not_resized() -> None:
    assert layer_plan({"model_type": "llama", "hidden_size": 64}) == []


def test_a_config_that_transformers_modules_reject_is_a_trace_error_not_a_traceback() -> None:
    """A pad_token_id outside the vocabulary makes nn.Embedding assert while the model is built
    (found by benchmarks/fastpath_grid.py): one line naming the task and transformers' reason."""
    from tests.conftest import TINY_LLAMA

    from memfit.errors import TraceError
    from memfit.estimate.trace.build import build_hf_model
    from memfit.spec import WorkloadSpec

    config = dict(TINY_LLAMA, pad_token_id=10_000)
    w = WorkloadSpec(batch_size=1, seq_len=16, precision="bf16-true")
    with pytest.raises(TraceError, match="cannot build this model for task 'causal-lm': "
                       "AssertionError: Padding_idx must be within num_embeddings"):  # fmt: skip
        build_hf_model(config, w, "causal-lm")


def test_a_layer_types_property_computed_from_periods_is_not_written_back() -> None:
    """Jamba's layer_types is a read-only property of its attention period: resizing the stack
    rewrites the layer count only, and transformers builds the config (found by the grid)."""
    from benchmarks.tiny_models import tiny_config
    from transformers import AutoConfig

    config = tiny_config("jamba")
    (var,) = layer_plan(config)
    resized = with_layer_counts(config, [var], {var.name: 2}, False)
    assert "layer_types" not in resized and resized["num_hidden_layers"] == 2
    d = {k: v for k, v in resized.items() if k != "model_type"}
    assert len(AutoConfig.for_model("jamba", **d).layer_types) == 2


def test_all_linear_lora_over_a_router_that_returns_a_tuple_is_refused_with_the_way_out() -> None:
    """peft's ``all-linear`` wraps Llama 4's router (an nn.Linear subclass returning scores and
    logits), and peft's LoRA layer then fails at the first forward ('tuple' object has no
    attribute 'dtype', found by benchmarks/fastpath_grid.py): memfit says so before tracing."""
    from benchmarks.tiny_models import tiny_config

    from memfit.errors import SpecError
    from memfit.estimate.trace.engine import trace_hf
    from memfit.spec import WorkloadSpec

    w = WorkloadSpec(batch_size=1, seq_len=8, lora_rank=4, precision="bf16-true")
    with pytest.raises(SpecError, match=r"wrap 'model\.layers\.0\.feed_forward\.router' "
                       r"\(Llama4Router.*--lora-targets attention,mlp"):  # fmt: skip
        trace_hf(tiny_config("llama4_text"), w, name="t")


@pytest.mark.slow  # one tiny Llama 4 training trace (10-30 s on the shared machine)
def test_lora_on_llama4_by_role_leaves_the_router_alone_and_traces() -> None:
    from benchmarks.tiny_models import tiny_config

    from memfit.estimate.trace.engine import trace_hf
    from memfit.spec import WorkloadSpec

    w = WorkloadSpec(batch_size=1, seq_len=8, lora_rank=4, lora_targets=("attention", "mlp"),
                     precision="bf16-true")  # fmt: skip
    est = trace_hf(tiny_config("llama4_text"), w, name="t")
    assert 0 < est.n_trainable_params < est.n_params


def test_a_layer_types_alias_of_a_computed_property_is_not_written_back() -> None:
    """Bamba maps layer_types onto layers_block_type (attribute_map), a property computed from
    attn_layer_indices: writing it back was an AttributeError (found by the grid)."""
    from benchmarks.tiny_models import tiny_config
    from transformers import AutoConfig

    config = tiny_config("bamba")
    (var,) = layer_plan(config)
    resized = with_layer_counts(config, [var], {var.name: 2}, False)
    assert "layer_types" not in resized
    d = {k: v for k, v in resized.items() if k != "model_type"}
    assert AutoConfig.for_model("bamba", **d).layers_block_type == [
        "linear_attention", "full_attention",
    ]  # fmt: skip


def test_building_a_config_leaves_the_callers_dict_as_it_was() -> None:
    """transformers adds ``rope_theta`` to the ``rope_scaling`` dict it is given; the caller's
    config (a ModelSource's, part of the trace cache's key) must not change, or a repeated
    plan's confirmation is a new key (issue 32)."""
    import copy

    from memfit.estimate.trace.build import _hf_config
    from memfit.estimate.trace_cache import trace_key
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    source = resolve_model("llama-3.1-8b")
    before = copy.deepcopy(source.config)
    key = trace_key(source, WorkloadSpec(), None, extrapolate=None)
    _hf_config(source.config, False)
    assert source.config == before
    assert trace_key(source, WorkloadSpec(), None, extrapolate=None) == key
