"""peft's LoRA dropout is read from every job file that names it (TRL / LLaMA-Factory
``lora_dropout``, axolotl ``lora_dropout``, torchtune ``model.lora_dropout``, LitGPT
``lora_dropout``), with the framework's own default where a LoRA file leaves it out (TRL and
LitGPT 0.05, the others 0: memfit.jobfiles.hf.LORA_DROPOUT_DEFAULT), instead of being listed as
a key without effect: above 0 each adapter keeps a dropped copy of its input and a mask."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.jobfiles.files import read_job
from memfit.jobfiles.job import workload_of

EXAMPLES = Path(__file__).resolve().parent / "examples"
PRACTICE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "practice"


def _read(path: Path):
    job = read_job([path])
    return job, workload_of(job, overrides={"seq_len": 1024})


def _edited(tmp_path: Path, example: Path, old: str, new: str) -> Path:
    text = example.read_text()
    assert old in text, f"{example.name} no longer holds {old!r}"
    path = tmp_path / example.name
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    "example",
    [EXAMPLES / "axolotl-llama3-qlora.yml", PRACTICE / "axolotl-llama-3-lora-8b.yml"],
    ids=["qlora", "lora-8b"],
)
def test_axolotl_examples_run_their_lora_dropout(example: Path) -> None:
    job, w = _read(example)
    assert w.lora_dropout == 0.05
    assert "lora_dropout" not in {k for _, k in job.no_effect()}


def test_axolotl_without_the_key_runs_its_schema_default_of_zero(tmp_path) -> None:
    path = _edited(
        tmp_path, EXAMPLES / "axolotl-llama3-qlora.yml", "lora_dropout: 0.05\n", "lora_dropout:\n"
    )
    assert _read(path)[1].lora_dropout == 0.0
    path = _edited(tmp_path, EXAMPLES / "axolotl-llama3-qlora.yml", "lora_dropout: 0.05\n", "")
    assert _read(path)[1].lora_dropout == 0.0


def test_trl_peft_config_without_the_key_runs_model_config_default() -> None:
    """trl-sft-config.yaml sets ``use_peft: true`` and no ``lora_dropout``: TRL's ModelConfig
    default 0.05 reaches peft's LoraConfig."""
    job, w = _read(EXAMPLES / "trl-sft-config.yaml")
    assert w.lora_rank == 32 and w.lora_dropout == 0.05
    assert job.fields["lora_dropout"].key == "lora_dropout"


@pytest.mark.parametrize(("value", "expected"), [("0.1", 0.1), ("0", 0.0), ("0.0", 0.0)])
def test_trl_lora_dropout_is_read(tmp_path, value: str, expected: float) -> None:
    path = _edited(
        tmp_path,
        EXAMPLES / "trl-sft-config.yaml",
        "lora_r: 32\n",
        f"lora_r: 32\nlora_dropout: {value}\n",
    )
    assert _read(path)[1].lora_dropout == expected


def test_a_trl_full_fine_tune_has_no_adapter_dropout() -> None:
    assert _read(EXAMPLES / "trl-sft-full.yaml")[1].lora_dropout == 0.0


def test_llamafactory_lora_dropout_is_read_with_default_zero(tmp_path) -> None:
    example = EXAMPLES / "llamafactory-qwen3-lora-sft-otfq.yaml"
    assert _read(example)[1].lora_dropout == 0.0
    path = _edited(tmp_path, example, "lora_rank: 8\n", "lora_rank: 8\nlora_dropout: 0.1\n")
    assert _read(path)[1].lora_dropout == 0.1


@pytest.mark.parametrize(
    "example",
    [
        EXAMPLES / "torchtune-llama3_1-8B_qlora_single_device.yaml",
        PRACTICE / "torchtune-llama3_1-8B_lora_single_device.yaml",
    ],
    ids=["qlora", "lora"],
)
def test_torchtune_model_lora_dropout_is_read(tmp_path, example: Path) -> None:
    job, w = _read(example)
    assert w.lora_dropout == 0.0  # the recipes set 0.0
    assert "model.lora_dropout" not in {k for _, k in job.no_effect()}
    path = _edited(tmp_path, example, "lora_dropout: 0.0", "lora_dropout: 0.1")
    assert _read(path)[1].lora_dropout == 0.1


def test_litgpt_lora_dropout_is_read_and_its_fused_qkv_dropout_is_warned(tmp_path) -> None:
    example = EXAMPLES / "litgpt-llama-3.1-8b-qlora.yaml"
    job, w = _read(example)
    assert w.lora_dropout == 0.05
    assert any(x.key == "lora_dropout" and "LoRAQKVLinear" in x.message for x in job.warnings)
    # finetune/lora.py's own default when the file leaves the key out
    path = _edited(tmp_path, example, "lora_dropout: 0.05\n", "")
    assert _read(path)[1].lora_dropout == 0.05
    path = _edited(tmp_path, example, "lora_dropout: 0.05\n", "lora_dropout: 0\n")
    job, w = _read(path)
    assert w.lora_dropout == 0.0 and not any(x.key == "lora_dropout" for x in job.warnings)


@pytest.mark.parametrize("value", ["1.5", "-0.1", "lots", "true"])
def test_a_lora_dropout_that_is_no_probability_is_refused(tmp_path, value: str) -> None:
    path = _edited(
        tmp_path,
        EXAMPLES / "axolotl-llama3-qlora.yml",
        "lora_dropout: 0.05\n",
        f"lora_dropout: {value}\n",
    )
    with pytest.raises(SpecError, match=r"lora_dropout .* must be a probability in \[0, 1\)"):
        _read(path)
