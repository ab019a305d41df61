"""The search space: constraints, quality risk, and the memory order used to skip combinations."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.errors import SpecError
from memfit.plan import PlanRequest
from memfit.plan.space import Settings, SpaceOptions, candidates, dominates, quality_risk
from memfit.spec import LoraSpec, ParallelSpec, WorkloadSpec


def _opts(**kw: object) -> SpaceOptions:
    base: dict[str, object] = dict(
        mode="train",
        per_rank_batch=8,
        fixed_micro_batch=False,
        gpus=1,
        n_layers=4,
        supports_bf16=True,
        supports_fp8=False,
    )
    base.update(kw)
    return SpaceOptions(**base)  # type: ignore[arg-type]


def test_keep_full_finetune_excludes_lora_freezing_and_quantization() -> None:
    got = candidates(_opts(keep_full_finetune=True))
    assert got
    assert all(s.lora_rank is None and s.freeze_layers == 0 and s.quant == "none" for s in got)


def test_no_quant_keeps_16_bit_weights_but_allows_lora() -> None:
    got = candidates(_opts(allow_quant=False))
    assert all(s.quant == "none" for s in got)
    assert any(s.lora_rank is not None for s in got)


def test_micro_batch_times_accumulation_is_the_per_gpu_batch() -> None:
    got = candidates(_opts(per_rank_batch=12))
    assert {s.micro_batch * s.grad_accum for s in got} == {12}
    assert {s.micro_batch for s in got} == {1, 2, 3, 4, 6, 12}


def test_multi_gpu_training_tries_zero_and_fsdp_and_offload_only_when_allowed() -> None:
    shards = {(s.shard, s.offload) for s in candidates(_opts(gpus=4, per_rank_batch=2))}
    assert shards == {("ddp", "none"), ("zero2", "none"), ("zero3", "none"), ("fsdp", "none")}
    offl = {s.offload for s in candidates(_opts(allow_offload=True))}
    assert offl == {"none", "optimizer", "params"}


def test_gpus_without_bf16_plan_in_fp16() -> None:
    precisions = {s.precision for s in candidates(_opts(supports_bf16=False))}
    assert precisions == {"amp-fp16", "fp16"}


def test_inference_splits_requests_over_replicas_and_tries_fp8_where_supported() -> None:
    got = candidates(_opts(mode="infer", per_rank_batch=8, gpus=4, supports_fp8=True))
    assert {(s.tp, s.micro_batch) for s in got} == {(1, 2), (2, 4), (4, 8)}
    assert "fp8" in {s.quant for s in got}


def test_quality_risk_is_the_highest_of_the_settings_with_reasons() -> None:
    assert quality_risk(Settings(precision="amp-bf16", optimizer="adamw-fused")) == (0, ())
    level, why = quality_risk(
        Settings(precision="amp-bf16", optimizer="adamw-8bit", lora_rank=16, quant="nf4-dq")
    )
    assert level == 2 and any("4-bit" in w for w in why) and any("8-bit" in w for w in why)
    assert quality_risk(Settings(precision="fp16"))[0] == 3  # no loss scaling


def test_a_larger_micro_batch_with_less_checkpointing_is_dominated_by_a_failure() -> None:
    failed = Settings(precision="amp-bf16", checkpointing="selective", micro_batch=2)
    assert dominates(Settings(precision="amp-bf16", checkpointing="none", micro_batch=4), failed)
    assert not dominates(
        Settings(precision="amp-bf16", checkpointing="full", micro_batch=4), failed
    )
    assert not dominates(Settings(precision="bf16", checkpointing="none", micro_batch=4), failed)
    # equal rank, different value: not comparable
    zero3 = Settings(precision="amp-bf16", gpus=2, shard="zero3")
    assert not dominates(Settings(precision="amp-bf16", gpus=2, shard="fsdp"), zero3)


def test_plan_request_reports_every_problem_together() -> None:
    with pytest.raises(SpecError, match=r"3 problems: .*global_batch \(10\) must be a multiple"):
        PlanRequest(global_batch=10, gpus=4, goal="speed", max_quality_risk="tiny")
    with pytest.raises(SpecError, match=r"not both"):
        PlanRequest(batch_size=2, global_batch=8)


def test_gradient_accumulation_holds_the_gradients_through_later_micro_batches() -> None:
    one_step = Settings(precision="amp-bf16", optimizer="adamw", micro_batch=8, grad_accum=1)
    accumulating = Settings(precision="amp-bf16", optimizer="adamw", micro_batch=2, grad_accum=4)
    assert one_step.workload("train", 512).zero_grad_set_to_none is True
    assert accumulating.workload("train", 512).zero_grad_set_to_none is False
    assert accumulating.workload("infer", 512).zero_grad_set_to_none is True


def test_inference_risk_counts_only_the_weight_format() -> None:
    served = Settings(precision="bf16", quant="int4-awq")
    assert quality_risk(served, "infer") == (
        2,
        ("4-bit AWQ weights: check quality on your eval set",),
    )
    assert quality_risk(Settings(precision="bf16"), "infer") == (0, ())
    assert quality_risk(Settings(precision="bf16"), "train")[0] == 1


def test_prepare_kbit_marks_the_quantized_training_stacks_only() -> None:
    from memfit.plan.export import memfit_flags

    got = candidates(_opts(prepare_kbit=True))
    quantized = [s for s in got if s.quant != "none"]
    assert quantized and all(s.prepare_kbit for s in quantized)
    assert all(not s.prepare_kbit for s in got if s.quant == "none")
    s = quantized[0]
    assert s.workload("train", 512).prepare_kbit
    assert "(prepare_kbit)" in s.describe()
    assert "--prepare-kbit" in memfit_flags(s, PlanRequest(seq_len=512), "m")
    assert not any(s.prepare_kbit for s in candidates(_opts()))


# -- settings share the workload's records ------------------------------------------------------
def test_settings_are_the_workloads_techniques_and_layout_plus_the_batch_split() -> None:
    w = WorkloadSpec(
        precision="amp-bf16",
        lora_rank=16,
        quant="nf4",
        prepare_kbit=True,
        gpus=2,
        shard="zero3",
        batch_size=4,
        grad_accum=8,
        zero_grad_set_to_none=False,
    )
    s = Settings.of(w)
    assert s.techniques == w.techniques and s.parallel == w.parallel
    assert (s.micro_batch, s.grad_accum) == (4, 8)
    assert (s.precision, s.lora_rank, s.quant, s.prepare_kbit) == ("amp-bf16", 16, "nf4", True)
    assert (s.gpus, s.shard, s.dp) == (2, "zero3", 2)


def test_settings_take_flat_names_and_validate_them_as_the_workload_does() -> None:
    s = Settings(precision="amp-bf16", gpus=2, shard="zero3", micro_batch=2)
    assert s.optimizer == "none" and s.techniques.lora is None  # the planner names optimizers
    assert Settings(precision="bf16", gpus=4).shard == "ddp"  # the layout's default
    assert dataclasses.replace(s, lora_rank=16).techniques.lora == LoraSpec(rank=16)
    single = dataclasses.replace(s, parallel=ParallelSpec(), grad_accum=4)
    assert (single.gpus, single.shard, single.micro_batch, single.grad_accum) == (1, "none", 2, 4)
    with pytest.raises(SpecError, match=r"tp \(3\) must divide gpus \(4\)"):
        Settings(precision="bf16", gpus=4, tp=3)
    with pytest.raises(TypeError, match="batch_size"):
        Settings(precision="bf16", batch_size=2)


def test_a_plans_workload_carries_its_split_and_gives_the_settings_back() -> None:
    accumulating = [s for s in candidates(_opts(prepare_kbit=True)) if s.grad_accum > 1]
    assert accumulating
    for s in accumulating:
        w = s.workload("train", 512)
        back = Settings.of(w)
        assert back.technique_key == s.technique_key
        assert (back.micro_batch, back.grad_accum) == (s.micro_batch, s.grad_accum)
        assert "grad_accum" not in w.normalized()  # the estimate is of one micro-batch


def test_settings_print_their_flat_names_in_the_plan_json() -> None:
    s = Settings(precision="amp-bf16", optimizer="adamw-fused", micro_batch=2, grad_accum=4)
    assert list(s.to_json()) == [
        "precision",
        "quant",
        "attention",
        "checkpointing",
        "optimizer",
        "lora_rank",
        "freeze_layers",
        "gpus",
        "shard",
        "offload",
        "tp",
        "micro_batch",
        "grad_accum",
        "prepare_kbit",
    ]
    assert s.to_json()["grad_accum"] == 4 and s.to_json()["optimizer"] == "adamw-fused"
