"""DeepSpeed's bf16 / fp16 training (a 16-bit model, fp32 masters and Adam states in the
partitioned optimizer state), as its JSON, accelerate and Lightning spell it, checked against
DeepSpeed's own estimator (``estimate_zero3_model_states_mem_needs``, reproduced in
``sharding.deepspeed_zero3_estimate``) and the ZeRO paper's 2 + 2 + 12 bytes per parameter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.estimate import sharding
from memfit.estimate.analytic.api import estimate_analytic
from memfit.jobfiles import read_job, workload_of
from memfit.models.bundled import find_bundled
from memfit.spec import WorkloadSpec


def _gpt2_xl() -> dict:
    bundled = find_bundled("gpt2-xl")
    assert bundled is not None
    return json.loads(bundled.config_path.read_text())


def test_true_names_under_zero_run_as_deepspeeds_16_bit_optimizer_and_say_so() -> None:
    for name in ("16-true", "bf16-true"):
        w = WorkloadSpec(gpus=8, shard="zero3", precision=name)
        mixed = WorkloadSpec(gpus=8, shard="zero3", precision=name.replace("-true", "-mixed"))
        assert w.run_precision == mixed.run_precision == name
        (note,) = [line for line in w.warnings() if "DeepSpeed" in line]
        assert "fp32 master weights" in note and "-mixed" in note


def test_a_deepspeed_json_with_fp16_enabled_is_deepspeeds_fp16_optimizer(tmp_path: Path) -> None:
    ds = {
        "fp16": {"enabled": True, "loss_scale": 0},
        "zero_optimization": {"stage": 3},
        "train_micro_batch_size_per_gpu": 4,
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(ds))
    w = workload_of(read_job([path]), overrides={"seq_len": 1024, "gpus": 8})
    assert (w.shard, w.precision, w.run_precision) == ("zero3", "16-mixed", "16-true")


@pytest.mark.parametrize("gpus", [4, 8, 64])
def test_zero3_model_states_cover_deepspeeds_own_estimate(gpus: int) -> None:
    """DeepSpeed's estimator counts 18 B/param/GPU (2 fp16 params, 4 fp32 grads, 12 fp32
    masters + m + v) plus 4 B per element of the largest layer; memfit's optimizer phase holds
    the 16-bit partitions (2), the 16-bit gradient partition (2) and its fp32 copy for the step
    (4), masters + m + v (12): 20 B/param/GPU, plus the 5e8-element reduce bucket. So memfit
    must never be below DeepSpeed's figure and at most 20/18 above it (+ the bucket)."""
    cfg = _gpt2_xl()
    w = WorkloadSpec(gpus=gpus, shard="zero3", precision="16-mixed", batch_size=1, seq_len=64)
    e = estimate_analytic(cfg, w)
    opt = e.phases["optimizer"].components
    states = opt["parameters"] + opt["gradients"] + opt["optimizer_states"]
    bucket = sharding.DEEPSPEED_DEFAULTS["reduce_bucket_size"] * 2
    largest = cfg["vocab_size"] * cfg["n_embd"]  # wte, the largest layer
    ds = sharding.deepspeed_zero3_estimate(
        e.n_params, largest, gpus_per_node=gpus, offload_optimizer=False, offload_params=False
    )
    ds_states = ds.gpu_bytes - ds.largest_layer_bytes  # the 18 B/param part
    assert ds_states <= states - bucket <= ds_states * 20 / 18 * 1.02


def test_zero_plus_plus_hpz_adds_a_16_bit_secondary_partition_per_rank() -> None:
    cfg = _gpt2_xl()
    base = dict(gpus=16, shard="zero3", precision="bf16-mixed", batch_size=1, seq_len=64)
    off = estimate_analytic(cfg, WorkloadSpec(**base))  # type: ignore[arg-type]
    on = estimate_analytic(cfg, WorkloadSpec(**base, zero_hpz_partition_size=8))  # type: ignore[arg-type]
    grown = on.phases["optimizer"].components["parameters"]
    grown -= off.phases["optimizer"].components["parameters"]
    # 2 B per parameter over 8 ranks, less the small parameters ZeRO-3 keeps whole (< 1e5:
    # GPT-2's biases and layer norms, under 0.1 % of the model)
    assert 2 * on.n_params / 8 * 0.99 <= grown <= 2 * on.n_params / 8 * 1.01


def test_a_deepspeed_json_names_hpz_and_a_bad_group_is_refused(tmp_path: Path) -> None:
    zero = {"stage": 3, "zero_hpz_partition_size": 8}
    ds = {"bf16": {"enabled": True}, "zero_optimization": zero}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    w = workload_of(read_job([path]), overrides={"seq_len": 512, "gpus": 16})
    assert w.zero_hpz_partition_size == 8
    with pytest.raises(SpecError, match=r"zero_hpz_partition_size \(8\) must divide"):
        workload_of(read_job([path]), overrides={"seq_len": 512, "gpus": 12})
    with pytest.raises(SpecError, match=r"zero_hpz_partition_size \(2\) is ZeRO\+\+"):
        WorkloadSpec(gpus=4, shard="zero2", zero_hpz_partition_size=2)
