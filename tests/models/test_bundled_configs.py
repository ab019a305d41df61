"""The shipped configs: listed with their sources, valid, and buildable by transformers on meta.

Parameter counts are checked against the totals the Hugging Face hub reports for the published
checkpoints (the "Model size" its safetensors metadata gives, or the model card). Building on the
meta device allocates nothing, so even the 70B models take a few hundredths of a second each.
"""

from __future__ import annotations

import json

import pytest

from memfit.models import list_bundled, resolve_model
from memfit.models.bundled import CONFIGS_DIR, find_bundled
from memfit.models.config_json import config_problems
from memfit.models.media import buildable

TASKS = {"causal-lm", "seq-cls", "seq2seq", "vision", "speech"}

#: Parameters of the model transformers builds from each config, as published for the checkpoint.
#: Tied embeddings count once. Encoders are built as the bare model with its pooler (BertModel),
#: which is what the ~109.5M usually quoted for bert-base-uncased counts.
PUBLISHED_N_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "tinyllama-1.1b": 1_100_048_384,
    "mistral-7b-v0.1": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-72b": 72_706_203_648,
    "gemma-2-2b": 2_614_341_888,
    "phi-2": 2_779_683_840,
    "phi-3-mini-4k": 3_821_079_552,
    "falcon-7b": 6_921_720_704,
    "gpt-neox-20b": 20_554_567_680,
    "opt-125m": 125_239_296,
    "bloom-560m": 559_214_592,
    "pythia-160m": 162_322_944,
    "pythia-410m-deduped": 405_334_016,
    "opt-350m": 331_196_416,
    "bert-base-uncased": 109_482_240,
    "roberta-base": 124_645_632,
    "t5-small": 60_506_624,
    "vit-base-patch16-224-in21k": 86_389_248,
    "clip-vit-large-patch14": 427_616_513,
}

NAMES = [m.name for m in list_bundled()]


def _build_on_meta(name: str):  # -> torch.nn.Module
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    raw = json.loads((CONFIGS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    raw = buildable(raw)  # DETR: transformers' own ResNet-50 backbone where timm is missing
    config = transformers.AutoConfig.for_model(
        raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"}
    )
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
    }.get(find_bundled(name).task, transformers.AutoModel)
    with torch.device("meta"):
        return auto.from_config(config)


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_at_least_thirty_models_are_bundled_each_with_a_hub_source_url():
    models = list_bundled()
    assert len(models) >= 30
    for m in models:
        assert m.source_url == f"https://huggingface.co/{m.hf_id}/blob/main/config.json"
        assert m.task in TASKS, m
        assert m.name == m.name.lower() and " " not in m.name and "_" not in m.name


def test_every_index_entry_has_a_config_file_and_every_config_file_is_indexed():
    files = {p.stem for p in CONFIGS_DIR.glob("*.json")} - {"index"}
    assert files == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_bundled_config_passes_memfit_validation(name):
    raw = json.loads((CONFIGS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    assert config_problems(raw) == []
    assert resolve_model(name).config == raw


@pytest.mark.parametrize("name", NAMES)
def test_every_bundled_config_builds_with_transformers_on_meta(name):
    model = _build_on_meta(name)
    n = _n_params(model)
    assert n > 0
    if name in PUBLISHED_N_PARAMS:
        assert n == PUBLISHED_N_PARAMS[name]


def test_transformers_5_ties_the_flan_t5_head_that_the_checkpoint_stores_separately():
    # flan-t5-large's config says tie_word_embeddings=false and its checkpoint stores lm_head
    # (783,150,080 parameters published), but T5Config in transformers 5 forces the tie. An
    # estimate built from the instantiated module therefore misses vocab * d_model parameters.
    raw = json.loads((CONFIGS_DIR / "flan-t5-large.json").read_text(encoding="utf-8"))
    assert raw["tie_word_embeddings"] is False
    untied_head = raw["vocab_size"] * raw["d_model"]
    assert _n_params(_build_on_meta("flan-t5-large")) == 783_150_080 - untied_head


def test_clip_config_also_builds_a_clip_vision_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = resolve_model("clip-vit-large-patch14").config
    config = transformers.AutoConfig.for_model(
        raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"}
    )
    with torch.device("meta"):
        vision = transformers.CLIPVisionModel(config.vision_config)
    assert _n_params(vision) == 303_179_776  # ViT-L/14 image tower, no projection


def test_a_bundled_models_hub_id_resolves_to_the_bundled_file_without_network():
    source = resolve_model("meta-llama/Llama-2-7b-hf")
    assert (source.origin, source.name, source.model_type) == ("bundled", "llama-2-7b", "llama")
    assert source.config_path == str(CONFIGS_DIR / "llama-2-7b.json")


def test_bundled_lookup_ignores_case_and_accepts_aliases():
    assert resolve_model("  LLaMA-3.1-8B ").name == "llama-3.1-8b"
    assert resolve_model("meta-llama/Meta-Llama-3.1-8B").name == "llama-3.1-8b"


def test_configs_with_auto_map_but_a_builtin_model_type_need_no_trust():
    pytest.importorskip("transformers")
    for name in ("falcon-7b", "phi-3-mini-4k"):
        source = resolve_model(name)
        assert "auto_map" in source.config and source.trust_remote_code is False


#: The models added for issue 11 (architectures in use now): the parameter count each model card
#: states, in billions, to the precision the card gives. Multimodal checkpoints are bundled as
#: their text tower, so the card's total is not comparable there and those are left out.
CARD_BILLIONS = {
    "qwen3-1.7b": (1.7, 1),  # huggingface.co/Qwen/Qwen3-1.7B: "Number of Parameters: 1.7B"
    "qwen3-4b": (4.0, 1),  # Qwen/Qwen3-4B: "4.0B"
    "qwen3-8b": (8.2, 1),  # Qwen/Qwen3-8B: "8.2B"
    "qwen3-14b": (14.8, 1),  # Qwen/Qwen3-14B: "14.8B"
    "qwen3-32b": (32.8, 1),  # Qwen/Qwen3-32B: "32.8B"
    "qwen3-30b-a3b": (30.5, 1),  # Qwen/Qwen3-30B-A3B: "30.5B in total and 3.3B activated"
    "qwen3-235b-a22b": (235, 0),  # Qwen/Qwen3-235B-A22B: "235B in total and 22B activated"
    "llama-3.3-70b": (70.6, 1),  # hub safetensors metadata: 70.6B
    "deepseek-v3": (671, 0),  # DeepSeek-V3 card: 671B main model + 14B MTP module (not built)
    "deepseek-r1": (671, 0),  # same architecture
    "deepseek-v2-lite": (15.7, 1),  # DeepSeek-V2-Lite card: "15.7B"
    "gemma-3-1b": (1.0, 1),  # text-only checkpoint: 1B
    "gpt-oss-20b": (21, 0),  # openai/gpt-oss-20b card: "21B parameters with 3.6B active"
    "gpt-oss-120b": (117, 0),  # openai/gpt-oss-120b card: "117B parameters with 5.1B active"
    "mistral-nemo-12b": (12, 0),  # Mistral NeMo: 12B
    "phi-4": (14.7, 1),  # hub safetensors metadata: 14.7B
    "olmo-2-7b": (7.3, 1),  # hub safetensors metadata: 7.3B
    "olmo-2-13b": (13.7, 1),  # hub safetensors metadata: 13.7B
}


@pytest.mark.parametrize("name", sorted(CARD_BILLIONS))
def test_the_new_architectures_build_to_the_parameter_count_their_model_cards_state(name):
    billions, digits = CARD_BILLIONS[name]
    assert round(_n_params(_build_on_meta(name)) / 1e9, digits) == billions


def test_every_bundled_config_not_copied_from_the_hub_file_says_where_it_came_from():
    """Configs added for issue 11 came from copies in public repositories (no network here):
    each says which, and what in it is not sourced."""
    for name in CARD_BILLIONS:
        assert find_bundled(name).content_from, name
    for name in ("gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "llama-4-scout-text"):
        assert "text_config" in find_bundled(name).content_from
