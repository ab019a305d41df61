"""The keys that train modules in full beside LoRA (peft's ``modules_to_save``) are read as
``lora_modules_to_save``: axolotl and TRL's ``lora_modules_to_save``, LLaMA-Factory's
``additional_target``; axolotl's canonical ``attn_implementation`` is read as the attention."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.jobfiles.files import read_job
from memfit.jobfiles.job import workload_of
from memfit.plan.export import export_settings
from memfit.plan.request import PlanRequest
from memfit.plan.space import Settings

PRACTICE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "practice"


def _workload(path: Path):
    return workload_of(read_job([path]), overrides={"seq_len": 2048})


def test_axolotl_lora_8b_example_trains_embeddings_and_head_in_full() -> None:
    """axolotl's examples/llama-3/lora-8b.yml: ``lora_modules_to_save: [embed_tokens,
    lm_head]``."""
    w = _workload(PRACTICE / "axolotl-llama-3-lora-8b.yml")
    assert w.lora_modules_to_save == ("embed_tokens", "lm_head")


@pytest.mark.parametrize(
    ("value", "attention"),
    [("flash_attention_2", "flash"), ("sdpa", "sdpa"), ("eager", "eager")],
)
def test_axolotl_attn_implementation_is_the_attention(tmp_path, value, attention) -> None:
    text = (PRACTICE / "axolotl-llama-3-lora-8b.yml").read_text()
    text = text.replace("flash_attention: true\n", "")  # the legacy flag this key replaced
    path = tmp_path / "cfg.yml"
    path.write_text(text + f"attn_implementation: {value}\n")
    assert _workload(path).attention == attention


def test_an_empty_lora_modules_to_save_is_none(tmp_path) -> None:
    text = (PRACTICE / "axolotl-llama-3-lora-8b.yml").read_text()
    text = text.replace("lora_modules_to_save:\n  - embed_tokens\n  - lm_head\n", "")
    path = tmp_path / "cfg.yml"
    path.write_text(text + "lora_modules_to_save:\n")
    assert _workload(path).lora_modules_to_save == ()


def test_llamafactory_additional_target_and_trl_lora_modules_to_save(tmp_path) -> None:
    lf = tmp_path / "lf.yaml"
    lf.write_text(
        "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"
        "lora_rank: 8\nlora_target: all\nadditional_target: embed_tokens,lm_head\n"
        "cutoff_len: 1024\nper_device_train_batch_size: 1\nbf16: true\n"
    )
    assert _workload(lf).lora_modules_to_save == ("embed_tokens", "lm_head")
    trl = tmp_path / "sft.yaml"
    trl.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 1024\nuse_peft: true\nlora_r: 16\n"
        "lora_modules_to_save: [lm_head]\nper_device_train_batch_size: 2\nbf16: true\n"
    )
    assert _workload(trl).lora_modules_to_save == ("lm_head",)


def test_a_modules_to_save_key_that_is_no_list_is_refused(tmp_path) -> None:
    text = (PRACTICE / "axolotl-llama-3-lora-8b.yml").read_text()
    text = text.replace("lora_modules_to_save:\n  - embed_tokens\n  - lm_head\n", "")
    path = tmp_path / "cfg.yml"
    path.write_text(text + "lora_modules_to_save: 3\n")
    with pytest.raises(SpecError, match="lora_modules_to_save"):
        _workload(path)


def test_the_exported_lora_config_keeps_targets_and_modules_to_save() -> None:
    s = Settings(
        precision="bf16-true",
        lora_rank=16,
        lora_targets=("q_proj", "v_proj"),
        lora_modules_to_save=("embed_tokens", "lm_head"),
        optimizer="adamw",
    )
    req = PlanRequest(mode="train", seq_len=1024, global_batch=1, lora_asked=True)
    lora = export_settings(s, req, "llama-3.1-8b")["lora"]
    assert "target_modules=['q_proj', 'v_proj']" in lora
    assert "modules_to_save=['embed_tokens', 'lm_head']" in lora
