"""WorkloadSpec: technique combinations that cannot run are refused with the rule and the fix."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.spec import WorkloadSpec


def test_quantized_training_without_lora_is_refused_with_the_qlora_hint() -> None:
    with pytest.raises(SpecError, match=r"quant \('nf4'\).*needs LoRA adapters.*--lora-rank"):
        WorkloadSpec(quant="nf4", precision="fp32")


def test_qlora_and_quantized_inference_are_valid() -> None:
    assert WorkloadSpec(quant="nf4-dq", lora_rank=16).quant == "nf4-dq"
    assert WorkloadSpec(mode="infer", quant="int4-awq").quant == "int4-awq"


def test_several_gpus_default_to_ddp_and_tensor_parallel_alone_needs_no_shard() -> None:
    assert WorkloadSpec(gpus=8).shard == "ddp"
    assert WorkloadSpec(gpus=8, tp=8).shard == "none"
    assert WorkloadSpec(gpus=8, tp=2).dp == 4


def test_tp_must_divide_the_gpu_count() -> None:
    with pytest.raises(SpecError, match=r"tp \(3\) must divide gpus \(8\)"):
        WorkloadSpec(gpus=8, tp=3)


def test_several_ranks_without_a_sharding_mode_are_refused() -> None:
    with pytest.raises(SpecError, match=r"shard 'none' with 4 data-parallel ranks"):
        WorkloadSpec(gpus=4, shard="none")


def test_offload_needs_a_sharding_engine_that_offloads() -> None:
    with pytest.raises(SpecError, match=r"offload \('optimizer'\) needs.*--shard zero2"):
        WorkloadSpec(offload="optimizer")
    with pytest.raises(SpecError, match=r"offload 'params' needs --shard zero3 or fsdp"):
        WorkloadSpec(offload="params", shard="zero2")
    assert WorkloadSpec(offload="optimizer", shard="zero2").offload == "optimizer"


def test_sharding_over_one_rank_is_a_warning_not_an_error() -> None:
    spec = WorkloadSpec(shard="zero3")
    assert any("partitions nothing" in w for w in spec.warnings())
    assert WorkloadSpec(shard="zero3", offload="params").warnings() == []


def test_training_only_sharding_is_refused_for_inference() -> None:
    with pytest.raises(SpecError, match=r"shard \('zero2'\) is a training setup"):
        WorkloadSpec(mode="infer", gpus=2, shard="zero2")


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(SpecError) as info:
        WorkloadSpec(quant="int3", gpus=0, shard="zero9")
    text = str(info.value)
    assert "quant ('int3') must be one of" in text
    assert "gpus (0) must be a positive integer" in text
    assert "shard ('zero9') must be one of" in text


def test_prepare_kbit_is_for_qlora_training_and_shows_in_the_json() -> None:
    for bad in (WorkloadSpec, lambda **k: WorkloadSpec(mode="infer", quant="nf4", **k)):
        with pytest.raises(SpecError, match=r"prepare_kbit .* needs --mode train and a --quant"):
            bad(prepare_kbit=True)
    w = WorkloadSpec(quant="nf4", lora_rank=8, prepare_kbit=True)
    assert w.normalized()["prepare_kbit"] is True
    assert "prepare_kbit" not in WorkloadSpec().normalized()  # only where it can apply
    gptq = WorkloadSpec(quant="int4-gptq", lora_rank=8, prepare_kbit=True)
    assert any("skips the fp32 casts for GPTQ" in n for n in gptq.warnings())
