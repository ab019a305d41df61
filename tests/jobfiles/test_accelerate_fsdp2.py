"""accelerate's FSDP2 config names onto memfit's FSDP2 fields (reshard_after_forward, HSDP)."""

from __future__ import annotations

from pathlib import Path

from memfit.jobfiles import read_job
from memfit.jobfiles.job import workload_of

CONFIG = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: {reshard}
  fsdp_sharding_strategy: {strategy}
mixed_precision: bf16
num_machines: 2
num_processes: 16
"""


def _job(tmp_path: Path, reshard: str, strategy: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "accelerate.yaml"
    path.write_text(CONFIG.format(reshard=reshard, strategy=strategy))
    return read_job([path])


def test_hybrid_shard_over_two_machines_is_hsdp_with_two_replicas(tmp_path: Path) -> None:
    job = _job(tmp_path, "true", "HYBRID_SHARD")
    w = workload_of(job, overrides={"seq_len": 512})
    assert (w.shard, w.dp_replicate, w.dp_shard, w.reshard_after_forward) == ("fsdp", 2, 8, True)
    assert job.fields["dp_replicate"].key == "num_machines"


def test_reshard_after_forward_false_is_read_and_full_shard_stays_one_group(
    tmp_path: Path,
) -> None:
    w = workload_of(_job(tmp_path, "false", "FULL_SHARD"), overrides={"seq_len": 512})
    assert (w.dp_replicate, w.reshard_after_forward, w.fsdp_policy) == (
        1,
        False,
        ("bfloat16", "float32"),
    )


def test_the_launchers_gpu_count_wins_over_num_processes_and_is_said(tmp_path: Path) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(CONFIG.format(reshard="true", strategy="FULL_SHARD"))
    job = read_job([path], gpus=8)
    w = workload_of(job, overrides={"seq_len": 512})
    assert w.gpus == 8
    assert job.fields["gpus"].key == "num_processes"
    said = [x.message for x in job.warnings if x.key == "num_processes"]
    assert said and "--gpus 8" in said[0] and "num_processes 8" in said[0]
    # the same count as the file: no word
    assert not [x for x in read_job([path], gpus=16).warnings if x.key == "num_processes"]


def test_litgpt_devices_overridden_by_the_launcher_splits_the_global_batch(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "full.yaml"
    cfg.write_text(
        "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\n"
        "devices: 2\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 2\n"
        "  max_seq_length: 512\n"
    )
    job = read_job([cfg], gpus=4)
    w = workload_of(job)
    assert (w.gpus, w.grad_accum) == (4, 1)
    assert any("litgpt finetune --devices 4" in x.message for x in job.warnings)
