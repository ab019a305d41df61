"""Every serving question about a model memfit knows gets an answer: a start-up, or "not
modelled" with the nearest answer (exit 1), never "bad input" (exit 2)."""

from __future__ import annotations

import json

import pytest

from memfit.cli.entry import main
from memfit.errors import NotModelledError
from memfit.hardware.catalog import get_gpu
from memfit.models import ModelSpec
from memfit.models.bundled import list_bundled
from memfit.models.pipelines import list_pipelines
from memfit.serving import simulate_startup
from memfit.serving.params import decoder_params
from memfit.spec.serving import VllmConfig
from memfit.units import GiB

#: Qwen/Qwen1.5-MoE-A2.7B config.json (https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/
#: config.json): the shape fields vLLM reads.
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "decoder_sparse_step": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _names() -> list[str]:
    return [b.name for b in list_bundled()] + [p.name for p in list_pipelines()]


@pytest.mark.parametrize("name", _names())
def test_no_bundled_model_is_bad_input_for_memfit_vllm(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["vllm", name, "--gpu", "H100", "--json"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    record = json.loads(out.out)
    if record.get("modelled") is False:
        assert "not modelled" in record["not_modelled"]
        assert record["nearest_command"].startswith(f"memfit estimate {name} ")
    else:
        assert record["weights_bytes"] > 0 and record["starts"] in (True, False)


def test_qwen15_moe_resolves_with_its_experts_and_shared_expert() -> None:
    spec = ModelSpec.from_config(QWEN15_MOE)
    # 14.3 B parameters (model card: "14.3B in total"): 24 x (attention + 60 experts + shared)
    assert decoder_params(spec) == pytest.approx(14.3e9, rel=0.01)
    s = simulate_startup(spec, get_gpu("H100"), VllmConfig(max_model_len=8192))
    assert s.starts and s.weights_bytes / GiB == pytest.approx(14.3e9 * 2 / GiB, rel=0.01)


def test_every_causal_lm_config_transformers_knows_starts_or_says_not_modelled() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    answered, not_modelled = 0, []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = transformers.AutoConfig.for_model(model_type).to_dict()
            spec = ModelSpec.from_config(config)
        except Exception:  # noqa: BLE001 - configs transformers or memfit's reader cannot build
            continue
        try:
            simulate_startup(spec, get_gpu("H100"), VllmConfig(max_model_len=2048))
            answered += 1
        except NotModelledError as exc:
            assert "not modelled" in str(exc), (model_type, str(exc))
            not_modelled.append(model_type)
    assert answered >= 150, (answered, not_modelled)


def test_a_config_without_a_length_key_gets_vllms_2048_with_a_note() -> None:
    from memfit.models import resolve_model

    spec = resolve_model("falcon-7b").spec
    assert spec is not None
    s = simulate_startup(spec, get_gpu("L4"), VllmConfig())
    assert s.max_model_len == 2048 and any("assumes 2048" in n for n in s.notes)
