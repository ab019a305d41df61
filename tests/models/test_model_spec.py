"""ModelSpec: one key table, the config classes' defaults, per-family readers, exact counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.errors import ModelConfigError, SpecError
from memfit.models import ModelSpec, list_bundled, resolve_model
from memfit.models.config_json import read_config_file
from memfit.models.readers import FAMILY_DEFAULTS
from memfit.plan.cost import ModelFacts

#: General fields a family default or reader can set (compared with transformers below).
GENERAL_FIELDS = (
    "hidden_size",
    "n_layers",
    "n_decoder_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_positions",
    "tie_word_embeddings",
    "hidden_act",
    "rotary_dim",
    "sliding_window",
    "layer_types",
    "n_experts",
    "n_experts_per_token",
    "is_encoder_decoder",
    "attention_dropout",
    "hidden_dropout",
    "embedding_dropout",
    "attn_logit_softcapping",
    "final_logit_softcapping",
)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 3},
            (64, 3, "num_hidden_layers"),
        ),
        ({"model_type": "gpt2", "n_embd": 96, "n_layer": 2, "n_head": 4}, (96, 2, "n_layer")),
        ({"model_type": "t5", "d_model": 128, "num_layers": 5}, (128, 5, "num_layers")),
        ({"model_type": "mpt", "d_model": 256, "n_layers": 7}, (256, 7, "n_layers")),
    ],
)
def test_the_key_table_reads_every_spelling_of_width_and_depth(config, expected) -> None:
    spec = ModelSpec.from_config(config)
    assert (spec.hidden_size, spec.n_layers, spec.n_layers_key) == expected


def test_gpt2_and_t5_spellings_of_heads_and_mlp_width() -> None:
    gpt2 = ModelSpec.from_config({"model_type": "gpt2", "n_embd": 96, "n_head": 4, "n_inner": None})
    assert (gpt2.n_heads, gpt2.head_dim, gpt2.intermediate_size) == (4, 24, 4 * 96)
    t5 = ModelSpec.from_config(
        {"model_type": "t5", "d_model": 128, "num_heads": 4, "d_kv": 16, "d_ff": 300}
    )
    assert (t5.n_heads, t5.head_dim, t5.intermediate_size, t5.n_decoder_layers) == (4, 16, 300, 6)


def test_a_bare_config_takes_its_config_class_defaults() -> None:
    llama = ModelSpec.from_config({"model_type": "llama"})  # LlamaConfig()
    assert (llama.hidden_size, llama.n_layers, llama.n_kv_heads, llama.vocab_size) == (
        4096,
        32,
        32,
        32000,
    )
    gemma2 = ModelSpec.from_config({"model_type": "gemma2", "hidden_size": 64})
    assert gemma2.head_dim == 256  # Gemma2Config.head_dim, whatever the width
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (50.0, 30.0)
    assert gemma2.layer_types[:2] == ("sliding_attention", "full_attention")
    phi = ModelSpec.from_config({"model_type": "phi", "hidden_size": 64, "num_attention_heads": 4})
    assert phi.rotary_dim == 8  # PhiConfig partial_rotary_factor 0.5 of head_dim 16
    neox = ModelSpec.from_config({"model_type": "gpt_neox"})
    assert neox.rotary_dim == 96 // 4  # GPTNeoXConfig rotary_pct 0.25


def test_an_explicit_null_is_not_replaced_by_the_family_default() -> None:
    spec = ModelSpec.from_config({"model_type": "gemma2", "final_logit_softcapping": None})
    assert spec.final_logit_softcapping is None
    assert spec.attn_logit_softcapping == 50.0


@pytest.mark.parametrize("model_type", sorted(FAMILY_DEFAULTS))
def test_family_defaults_agree_with_the_transformers_config_class(model_type) -> None:
    """A config.json naming only its model_type reads like the full dict transformers' config
    class writes for it (``XConfig().to_dict()``)."""
    auto = pytest.importorskip("transformers").AutoConfig
    ours = ModelSpec.from_config({"model_type": model_type})
    theirs = ModelSpec.from_config(auto.for_model(model_type).to_dict())
    assert {f: getattr(ours, f) for f in GENERAL_FIELDS} == {
        f: getattr(theirs, f) for f in GENERAL_FIELDS
    }


@pytest.mark.parametrize(
    ("model_type", "tied"),
    [
        ("llama", False),
        ("mistral", False),
        ("mixtral", False),
        ("qwen2", False),
        ("phi", False),
        ("phi3", False),
        ("gpt_neox", False),
        ("gpt2", True),
        ("gpt_bigcode", True),
        ("opt", True),
        ("bloom", True),
        ("falcon", True),
        ("gemma2", True),
        ("t5", True),
        ("bert", True),
        ("vit", False),
        ("clip", False),
        ("qwen3", False),
        ("deepseek_v3", None),  # no reader: unknown, not guessed
    ],
)
def test_the_tie_default_is_the_familys(model_type, tied) -> None:
    assert ModelSpec.from_config({"model_type": model_type}).tie_word_embeddings is tied
    given = ModelSpec.from_config({"model_type": model_type, "tie_word_embeddings": True})
    assert given.tie_word_embeddings is True  # config.json wins over the default


def test_t5_ties_its_embeddings_whatever_config_json_says() -> None:
    spec = ModelSpec.from_config({"model_type": "t5", "tie_word_embeddings": False})
    assert spec.tie_word_embeddings is True  # T5Config.__post_init__
    assert spec.get("tie_word_embeddings") is False  # the raw value stays readable


def test_model_facts_takes_its_tie_flag_from_the_spec() -> None:
    untied = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}
    facts = ModelFacts.from_spec(ModelSpec.from_config(untied), n_params=10_000)
    assert facts.tied_embeddings is False  # LlamaConfig: tie_word_embeddings False
    assert facts.n_matmul_params == 10_000 - 10 * 64  # the input embedding is a lookup
    tied = ModelFacts.from_config({**untied, "model_type": "gpt2"}, n_params=10_000)
    assert tied.tied_embeddings is True and tied.n_matmul_params == 10_000


def test_model_facts_reads_multi_query_kv_heads() -> None:
    spec = resolve_model("starcoderbase-1b").spec
    facts = ModelFacts.from_spec(spec, n_params=1)
    assert spec.n_kv_heads == 1  # GPTBigCode multi_query
    assert facts.kv_bytes_per_token_per_byte == 2 * 24 * 1 * (2048 // 16)


def test_a_family_without_a_reader_resolves_with_what_the_key_table_finds(tmp_path) -> None:
    config = {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "vocab_size": 129280,
        "rope_theta": 10000,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = resolve_model(tmp_path).spec
    assert spec is not None
    assert (spec.n_experts, spec.n_experts_per_token, spec.expert_intermediate_size) == (
        256,
        8,
        2048,
    )
    assert spec.rotary_dim == spec.head_dim == 56
    assert spec.quantization is not None and spec.quantization.method == "fp8"
    assert spec.dtype == "bfloat16" and spec.task == "causal-lm"
    for unknown in ("intermediate_size", "max_positions", "tie_word_embeddings", "hidden_act"):
        assert getattr(spec, unknown) is None, unknown
    assert spec.n_params is None  # no counter for this family: unknown, not estimated


def test_the_raw_config_is_a_read_only_view() -> None:
    spec = resolve_model("opt-350m").spec
    assert spec.get("word_embed_proj_dim") == 512 and spec.get("absent", 7) == 7
    with pytest.raises(TypeError):
        spec.raw["hidden_size"] = 1  # type: ignore[index]


def test_clip_towers_are_sub_specs_with_their_own_defaults() -> None:
    spec = ModelSpec.from_config(
        {"model_type": "clip", "text_config": {"hidden_size": 64}, "vision_config_dict": {}}
    )
    assert spec.text is not None and spec.vision is not None
    assert (spec.text.hidden_size, spec.text.max_positions, spec.text.n_layers) == (64, 77, 12)
    assert (spec.vision.hidden_size, spec.vision.hidden_act) == (768, "quick_gelu")
    assert spec.text_field("hidden_size") == 64 and spec.hidden_size is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"attention_dropout": 1.5},
            r"attention_dropout \(1\.5\) must be a probability between 0 and 1",
        ),
        ({"n_inner": "big"}, r"n_inner \('big'\) must be an integer"),
        ({"tie_word_embeddings": "yes"}, r"tie_word_embeddings \('yes'\) must be true or false"),
        ({"partial_rotary_factor": 2}, r"partial_rotary_factor \(2\) must be a fraction in"),
        (
            {"num_local_experts": 2, "num_experts_per_tok": 4},
            r"n_experts_per_token \(4\) must not exceed n_experts \(2\)",
        ),
    ],
)
def test_impossible_values_name_the_key_the_value_and_the_rule(config, message) -> None:
    with pytest.raises(ModelConfigError, match=message):
        ModelSpec.from_config({"model_type": "mixtral", **config})


def test_resolving_an_impossible_config_names_the_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_dropout": -0.5}))
    with pytest.raises(ModelConfigError, match=r"config\.json: hidden_dropout \(-0\.5\) must be"):
        resolve_model(path)


def test_a_spec_built_directly_is_validated_once() -> None:
    with pytest.raises(SpecError, match=r"n_kv_heads \(3\) must divide n_heads \(8\)"):
        ModelSpec(model_type="llama", hidden_size=64, n_heads=8, n_kv_heads=3, head_dim=8)
    with pytest.raises(SpecError, match=r"hidden_size \(0\) must be a positive integer"):
        ModelSpec(model_type=None, hidden_size=0)


def test_the_source_carries_its_spec_and_a_factory_has_none() -> None:
    source = resolve_model("llama-3.1-8b")
    assert source.spec is not None and source.spec.n_kv_heads == 8
    assert source.spec.n_params == 8_030_261_248
    assert resolve_model("pkg.mod:build", allow_code=True).spec is None


#: Bundled families param_count.py has no counter for yet (issue 14's vision / speech models):
#: their spec says None (unknown) and the trace engine counts the parameters it builds
#: (tests/models/test_media.py checks those against the papers). A counter added later must
#: take its family off this list.
NO_COUNTER = ("deit", "convnext", "swin", "dinov2", "siglip", "detr", "whisper")
BUNDLED_ALL = [b.name for b in list_bundled()]
BUNDLED = [b.name for b in list_bundled() if b.family not in NO_COUNTER]


def test_families_without_a_counter_say_unknown_rather_than_a_wrong_count() -> None:
    uncounted = [b.name for b in list_bundled() if b.family in NO_COUNTER]
    assert len(uncounted) == 17
    assert all(resolve_model(n).spec.n_params is None for n in uncounted)  # type: ignore[union-attr]


@pytest.mark.parametrize("name", BUNDLED)
def test_n_params_equals_the_model_transformers_builds(name) -> None:
    """As the trace engine builds it (``build_hf_model`` for the config's task, on the meta
    device), tied weights counted once."""
    pytest.importorskip("transformers")
    from memfit.estimate.trace.build import build_hf_model, resolve_task
    from memfit.spec import WorkloadSpec

    bundled = next(b for b in list_bundled() if b.name == name)
    config = read_config_file(Path(bundled.config_path))
    model = build_hf_model(config, WorkloadSpec(mode="infer"), resolve_task(config, "auto"))
    assert ModelSpec.from_config(config).n_params == sum(p.numel() for p in model.parameters())


def test_every_bundled_config_has_a_counted_layout() -> None:
    assert len(BUNDLED) == 66 and len(BUNDLED_ALL) == 83  # 63 + ViT-B/L/H; + 17 uncounted
    assert all(resolve_model(name).spec.n_params for name in BUNDLED)  # type: ignore[union-attr]


def test_per_layer_lists_are_unknown_not_errors() -> None:
    # OpenELM-style repository-code configs give one head count per layer
    spec = ModelSpec.from_config(
        {"model_type": "openelm", "num_kv_heads": [3, 3, 4], "sliding_window": False}
    )
    assert spec.n_kv_heads is None and spec.sliding_window is None


@pytest.mark.parametrize(
    ("model_type", "extra", "kv", "ffn"),
    [
        ("gpt2", {"n_inner": None}, 4, 128),
        ("gpt_bigcode", {"n_inner": None, "multi_query": True}, 1, 128),
        ("falcon", {"ffn_hidden_size": None, "multi_query": False}, 4, 128),
        ("gpt_neox", {"intermediate_size": 96}, 4, 96),
        ("opt", {"ffn_dim": 96}, 4, 96),
    ],
)
def test_keys_the_config_class_never_reads_are_skipped(model_type, extra, kv, ffn) -> None:
    # issue 32: stray num_key_value_heads / intermediate_size keys (transformers keeps them as
    # attributes, its model never reads them) made the analytic engine build GQA and a narrower
    # MLP than transformers does
    config = {
        "model_type": model_type,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        **extra,
    }
    spec = ModelSpec.from_config(config)
    assert (spec.n_kv_heads, spec.intermediate_size) == (kv, ffn)
