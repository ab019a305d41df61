"""The search space: constraints, quality risk, and the memory order used to skip combinations."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.errors import SpecError
from memfit.plan import PlanRequest
from memfit.plan.recipe import CHANGES_RESULT, MEMORY_ONLY, changes, quality_risk
from memfit.plan.space import Settings, SpaceOptions, candidates, dominates, recipe
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


def test_multi_gpu_training_tries_zero_and_fsdp_and_offload_as_memory_only_layouts() -> None:
    shards = {(s.shard, s.offload) for s in candidates(_opts(gpus=4, per_rank_batch=2))}
    assert shards == {
        ("ddp", "none"),
        ("zero2", "none"),
        ("zero3", "none"),
        ("fsdp", "none"),
        ("zero2", "optimizer"),
        ("zero3", "optimizer"),
        ("zero3", "params"),
    }
    assert {s.offload for s in candidates(_opts(mode="infer"))} == {"none"}


def test_pure_16_bit_states_are_never_tried_under_deepspeed_zero() -> None:
    got = candidates(_opts(gpus=2, per_rank_batch=2))
    assert {s.shard for s in got if s.precision == "bf16-true"} == {"ddp", "fsdp"}


def test_gpus_without_bf16_plan_in_fp16() -> None:
    precisions = {s.precision for s in candidates(_opts(supports_bf16=False))}
    assert precisions == {"16-mixed", "16-true"}


def test_inference_splits_requests_over_replicas_and_tries_fp8_where_supported() -> None:
    got = candidates(_opts(mode="infer", per_rank_batch=8, gpus=4, supports_fp8=True))
    assert {(s.tp, s.micro_batch) for s in got} == {(1, 2), (2, 4), (4, 8)}
    assert "fp8" in {s.quant for s in got}


ASKED = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=8)


def _risk(s: Settings, asked: Settings = ASKED, mode: str = "train") -> tuple[int, tuple[str, ...]]:
    return quality_risk(changes(s, asked, mode))


def test_quality_risk_sums_the_result_changing_reasons() -> None:
    fused = Settings(precision="bf16-mixed", optimizer="adamw-fused", micro_batch=8)
    assert _risk(fused) == (0, ())  # the same update in one kernel: memory-only
    level, why = _risk(
        Settings(precision="bf16-mixed", optimizer="adamw-8bit", lora_rank=16, quant="nf4-dq")
    )
    # LoRA 1 + 4-bit 2 + 8-bit states 1 = 4, capped at high
    assert level == 3 and len(why) == 3
    assert any("4-bit" in w for w in why) and any("8-bit" in w for w in why)
    assert _risk(Settings(precision="16-true"), Settings(precision="16-mixed"))[0] == 3


def test_three_reasons_are_never_low_risk() -> None:
    # the opt-125m recommendation: pure bf16, 8-bit AdamW, half the layers frozen
    s = Settings(precision="bf16-true", optimizer="adamw-8bit", freeze_layers=6, micro_batch=8)
    level, why = _risk(s)
    assert len(why) == 3 and level == 3


def test_each_change_is_labelled_memory_only_or_result_changing() -> None:
    s = Settings(
        precision="bf16-true",
        optimizer="adamw-fused",
        checkpointing="full",
        micro_batch=2,
        grad_accum=4,
    )
    kinds = {c.what: c.kind for c in changes(s, ASKED, "train")}
    assert kinds["precision bf16-true"] == CHANGES_RESULT
    assert kinds["full activation checkpointing"] == MEMORY_ONLY
    assert kinds["micro-batch 2 x 4 accumulation steps"] == MEMORY_ONLY
    assert kinds["optimizer adamw-fused (same update, one fused kernel)"] == MEMORY_ONLY
    assert changes(ASKED, ASKED, "train") == []


def test_the_recipe_is_the_job_as_asked() -> None:
    asked = recipe(_opts(per_rank_batch=8, optimizer="sgd", precision="bf16"))
    assert (asked.precision, asked.optimizer, asked.micro_batch) == ("bf16-mixed", "sgd", 8)
    assert (asked.lora_rank, asked.freeze_layers, asked.checkpointing) == (None, 0, "none")
    lora = recipe(_opts(lora_asked=True, lora_ranks=(8,)))
    assert lora.lora_rank == 8
    assert recipe(_opts(mode="infer", per_rank_batch=4)).precision == "bf16-true"
    assert all(s.lora_rank == 8 for s in candidates(_opts(lora_asked=True, lora_ranks=(8,))))


def test_a_larger_micro_batch_with_less_checkpointing_is_dominated_by_a_failure() -> None:
    failed = Settings(precision="bf16-mixed", checkpointing="selective", micro_batch=2)
    assert dominates(Settings(precision="bf16-mixed", checkpointing="none", micro_batch=4), failed)
    assert not dominates(
        Settings(precision="bf16-mixed", checkpointing="full", micro_batch=4), failed
    )
    assert not dominates(
        Settings(precision="bf16-true", checkpointing="none", micro_batch=4), failed
    )
    # equal rank, different value: not comparable
    zero3 = Settings(precision="bf16-mixed", gpus=2, shard="zero3")
    assert not dominates(Settings(precision="bf16-mixed", gpus=2, shard="fsdp"), zero3)


def test_plan_request_reports_every_problem_together() -> None:
    with pytest.raises(SpecError, match=r"3 problems: .*global_batch \(10\) must be a multiple"):
        PlanRequest(global_batch=10, gpus=4, goal="speed", max_quality_risk="tiny")
    with pytest.raises(SpecError, match=r"not both"):
        PlanRequest(batch_size=2, global_batch=8)


def test_gradient_accumulation_holds_the_gradients_through_later_micro_batches() -> None:
    one_step = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=8, grad_accum=1)
    accumulating = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=2, grad_accum=4)
    assert one_step.workload("train", 512).zero_grad_set_to_none is True
    assert accumulating.workload("train", 512).zero_grad_set_to_none is False
    assert accumulating.workload("infer", 512).zero_grad_set_to_none is True


def test_inference_risk_counts_only_the_weight_format() -> None:
    asked = Settings(precision="bf16-true")
    served = Settings(precision="bf16-true", quant="int4-awq")
    assert _risk(served, asked, "infer") == (
        2,
        ("4-bit AWQ weights: check quality on your eval set",),
    )
    assert _risk(Settings(precision="bf16-true", tp=1), asked, "infer") == (0, ())


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
    assert (s.precision, s.lora_rank, s.quant, s.prepare_kbit) == ("bf16-mixed", 16, "nf4", True)
    assert (s.gpus, s.shard, s.dp) == (2, "zero3", 2)


def test_settings_take_flat_names_and_validate_them_as_the_workload_does() -> None:
    s = Settings(precision="bf16-mixed", gpus=2, shard="zero3", micro_batch=2)
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
    s = Settings(precision="bf16-mixed", optimizer="adamw-fused", micro_batch=2, grad_accum=4)
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
        "loss",
    ]
    assert s.to_json()["grad_accum"] == 4 and s.to_json()["optimizer"] == "adamw-fused"


def test_the_optimizer_step_in_backward_is_kept_on_one_gpu_without_accumulation() -> None:
    """``--optimizer-in-bwd`` (torchtune optimizer_in_bwd): every plan keeps it, none splits the
    batch into accumulated micro-batches or shards / offloads (not runnable, not modelled); each
    plan's workload is valid and the recipe is the whole batch at once."""
    got = candidates(_opts(keep_full_finetune=True, optimizer_in_bwd=True))
    assert got
    assert all(s.techniques.optimizer_in_bwd for s in got)
    assert all(s.grad_accum == 1 and s.micro_batch == 8 for s in got)
    assert all(s.shard == "none" and s.offload == "none" for s in got)
    assert all(s.workload("train", 512).optimizer_in_bwd for s in got)
    plain = candidates(_opts(keep_full_finetune=True))
    assert any(s.grad_accum > 1 for s in plain) and len(plain) > len(got)
    r = recipe(_opts(optimizer_in_bwd=True))
    assert r.techniques.optimizer_in_bwd and "in backward" in r.describe()
    with pytest.raises(SpecError, match="optimizer_in_bwd needs a training job"):
        PlanRequest(mode="infer", optimizer_in_bwd=True)


def test_judged_candidates_name_each_candidates_own_split() -> None:
    """The split changes are shared per (micro-batch, accumulation) in a search's space: every
    candidate's still names its own split, and the recipe's split none (issue 32)."""
    from memfit.plan.search import judged_candidates

    opts = _opts(per_rank_batch=12)  # splits 1x12, 2x6, 3x4, 4x3, 6x2, 12x1
    seen = set()
    for s, found, _, _ in judged_candidates(opts):
        named = [c.what for c in found if c.what.startswith("micro-batch ")]
        if (s.micro_batch, s.grad_accum) == (12, 1):
            assert named == []
        else:
            assert named == [f"micro-batch {s.micro_batch} x {s.grad_accum} accumulation steps"]
        seen.add((s.micro_batch, s.grad_accum))
    assert seen == {(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)}


@pytest.mark.parametrize(
    "kw",
    [
        {},  # a full fine-tune on one GPU, bf16-mixed (and its pure-bf16 variants)
        {"gpus": 2, "per_rank_batch": 8},
        {"lora_asked": True, "lora_ranks": (16,), "quant": "nf4", "prepare_kbit": True},
        {"lora_asked": True, "lora_ranks": (8,), "lora_dropout": 0.1, "precision": "bf16-true"},
        {"optimizer_in_bwd": True, "per_rank_batch": 4},
        {"supports_bf16": False, "supports_fp8": False, "precision": "16-mixed"},
    ],
    ids=["full", "2-gpus", "qlora-kbit", "lora-dropout", "in-bwd", "fp16"],
)
def test_candidates_made_of_shared_parts_are_the_constructors(kw: dict[str, object]) -> None:
    """The space built from parts it built already (issue 32) is the one built through the
    Settings constructor for every combination: the same settings, in the same order."""
    o = _opts(**kw)
    shared, built = candidates(o), candidates(o, share_parts=False)
    assert len(shared) == len(built) > 100
    for a, b in zip(shared, built, strict=True):
        assert a == b
        assert (a.technique_key, a.describe(), a.to_json()) == (
            b.technique_key,
            b.describe(),
            b.to_json(),
        )
        assert a.techniques.flat() == b.techniques.flat()
    # distinct stacks stay distinct: sharing never merged two of them
    assert len({a.technique_key for a in shared}) == len({b.technique_key for b in built})


@pytest.mark.parametrize(
    "kw",
    [
        {"per_rank_batch": 12},
        {"per_rank_batch": 6, "fixed_micro_batch": True},
        {"gpus": 2, "per_rank_batch": 4, "keep_full_finetune": True},
        {"lora_asked": True, "lora_ranks": (16, 64), "quant": "nf4", "per_rank_batch": 4},
        {"optimizer_in_bwd": True, "per_rank_batch": 4},
        {"mode": "infer", "gpus": 2, "per_rank_batch": 8},
    ],
    ids=["full-12", "fixed", "2-gpus", "qlora", "in-bwd", "infer"],
)
def test_judged_candidates_from_kept_stacks_are_each_candidates_own(kw: dict[str, object]) -> None:
    """The judged space built from technique stacks kept across batch sizes (``judged_stacks``,
    issue 32) is each candidate's settings with its own changes (``changes``) and risk, in the
    order of the space, whatever batch read the stacks first."""
    from memfit.plan import search

    opts = _opts(**kw)
    search.judged_candidates.cache_clear()
    search.judged_stacks.cache_clear()
    other = dataclasses.replace(opts, per_rank_batch=opts.per_rank_batch * 2 + 1)
    search.judged_candidates(other)  # the stacks kept by another batch size first
    got = search.judged_candidates(opts)
    base = recipe(opts)
    asked = opts.lora_ranks if opts.lora_asked else ()
    want = []
    for s in candidates(opts, share_parts=False):
        found = changes(s, base, opts.mode, asked_ranks=asked)
        want.append((s, tuple(found), *quality_risk(found)))
    assert len(got) == len(want) > 5
    for (s, found, level, reasons), expected in zip(got, want, strict=True):
        assert (s, found, level, reasons) == expected
        assert s.to_json() == expected[0].to_json()
