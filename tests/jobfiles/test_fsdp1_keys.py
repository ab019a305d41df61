"""Where job files say FSDP1: accelerate's ``fsdp_version`` (1 when absent, accelerate's default),
HF Trainer's ``fsdp`` with ``fsdp_config.version`` (2 when absent, transformers 5's default),
LitGPT's full fine-tune on several devices (Lightning's FSDPStrategy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.jobfiles import read_job
from memfit.jobfiles.job import workload_of

ACCELERATE = """\
distributed_type: FSDP
fsdp_config:
  fsdp_sharding_strategy: {strategy}
{version}mixed_precision: bf16
num_processes: 4
"""


def _accelerate(tmp_path: Path, strategy: str = "FULL_SHARD", version: str = "") -> Path:
    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE.format(strategy=strategy, version=version))
    return path


def test_accelerate_without_fsdp_version_runs_fsdp1_as_accelerate_does(tmp_path: Path) -> None:
    job = read_job([_accelerate(tmp_path)])
    w = workload_of(job, overrides={"seq_len": 512})
    assert (w.shard, w.fsdp_version) == ("fsdp", 1)
    assert job.fields["fsdp_version"].key == "fsdp_config.fsdp_version"


def test_accelerate_fsdp_version_2_stays_fsdp2(tmp_path: Path) -> None:
    job = read_job([_accelerate(tmp_path, version="  fsdp_version: 2\n")])
    assert workload_of(job, overrides={"seq_len": 512}).fsdp_version == 2


def test_accelerate_shard_grad_op_is_zero2_whatever_the_version(tmp_path: Path) -> None:
    job = read_job([_accelerate(tmp_path, strategy="SHARD_GRAD_OP")])
    w = workload_of(job, overrides={"seq_len": 512})
    assert (w.shard, w.fsdp_version) == ("zero2", 2)


def test_accelerate_fsdp_version_3_is_refused_by_key(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"fsdp_config.fsdp_version \(3\) must be 1 or 2"):
        read_job([_accelerate(tmp_path, version="  fsdp_version: 3\n")])


def test_trainer_fsdp_words_with_version_1_are_fsdp1(tmp_path: Path) -> None:
    args = tmp_path / "args.yaml"
    args.write_text(
        "model_name_or_path: gpt2\nper_device_train_batch_size: 2\n"
        'fsdp: "full_shard auto_wrap"\nfsdp_config:\n  version: 1\n'
        "  backward_prefetch: backward_pre\n"
    )
    job = read_job([args])
    w = workload_of(job, overrides={"seq_len": 512, "gpus": 2})
    assert (w.shard, w.fsdp_version) == ("fsdp", 1)
    assert ("args.yaml", "fsdp_config.backward_prefetch") in job.no_effect()


def test_trainer_fsdp_without_version_is_fsdp2(tmp_path: Path) -> None:
    args = tmp_path / "args.yaml"
    args.write_text('model_name_or_path: gpt2\nfsdp: "full_shard offload auto_wrap"\n')
    w = workload_of(read_job([args]), overrides={"seq_len": 512, "gpus": 2})
    assert (w.shard, w.fsdp_version, w.offload) == ("fsdp", 2, "params")


def test_litgpt_full_fine_tune_on_two_devices_is_fsdp1(tmp_path: Path) -> None:
    cfg = tmp_path / "full.yaml"
    cfg.write_text(
        "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\n"
        "devices: 2\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 2\n"
        "  max_seq_length: 512\n"
    )
    w = workload_of(read_job([cfg]))
    assert (w.gpus, w.shard, w.fsdp_version, w.checkpointing, w.grad_accum) == (
        2,
        "fsdp",
        1,
        "full",
        2,
    )
