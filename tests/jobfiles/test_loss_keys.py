"""The config keys that replace the LM head's cross-entropy (torchtune's chunked losses,
axolotl's Liger / Cut Cross-Entropy keys, TrainingArguments' use_liger_kernel) are read as
``loss``."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.jobfiles.files import read_job
from memfit.jobfiles.job import workload_of

PRACTICE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "practice"


def _loss(path: Path) -> str:
    return workload_of(read_job([path]), overrides={"seq_len": 2048}).loss


def test_torchtune_linear_cross_entropy_is_the_chunked_loss() -> None:
    path = PRACTICE / "torchtune-llama3_1-8B_full_single_device.yaml"
    assert _loss(path) == "chunked"


@pytest.mark.parametrize("key", ["liger_fused_linear_cross_entropy", "cut_cross_entropy"])
def test_axolotl_fused_loss_keys_are_the_fused_loss(tmp_path, key) -> None:
    text = (PRACTICE / "axolotl-llama-3-fft-8b.yaml").read_text()
    on, off = tmp_path / "on.yaml", tmp_path / "off.yaml"
    on.write_text(text + f"{key}: true\n")
    off.write_text(text + f"{key}: false\n")
    assert _loss(on) == "fused"
    assert _loss(off) == "full"


def test_use_liger_kernel_in_training_arguments_is_the_fused_loss(tmp_path) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 1024\n"
        "per_device_train_batch_size: 2\nbf16: true\nuse_liger_kernel: true\n"
    )
    assert _loss(path) == "fused"
