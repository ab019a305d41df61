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
