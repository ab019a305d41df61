"""The three parts of a job (shape, techniques, parallel layout): each refuses its own bad
fields in the words the WorkloadSpec uses, and a WorkloadSpec is exactly its three parts."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.errors import SpecError
from memfit.spec import LoraSpec, ParallelSpec, QuantSpec, ShapeSpec, TechniqueSpec, WorkloadSpec


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ShapeSpec(batch_size=0), r"batch_size \(0\) must be a positive integer"),
        (lambda: ShapeSpec(seq_len=1 << 30), r"seq_len \(1073741824\) is beyond what any GPU"),
        (lambda: ShapeSpec(mode="serve"), r"mode \('serve'\) must be one of train, infer"),
        (lambda: ShapeSpec(new_tokens=4), r"new_tokens \(4\) only applies to mode 'infer'"),
        (lambda: ShapeSpec(task="vqa"), r"task \('vqa'\) must be one of auto"),
        (lambda: ShapeSpec(mode="infer", grad_accum=4), r"grad_accum \(4\) only applies to mode"),
        (lambda: ShapeSpec(grad_accum=0), r"grad_accum \(0\) must be a positive integer"),
        (lambda: LoraSpec(rank=0), r"lora_rank \(0\) must be a positive integer or None"),
        (lambda: QuantSpec(format="int3"), r"quant \('int3'\) must be one of none, int8"),
        (lambda: QuantSpec(format="int4-gptq", group_size=0), r"quant_group_size \(0\) must be"),
        (lambda: QuantSpec(prepare_kbit=True), r"prepare_kbit .* needs --mode train and a --quant"),
        (lambda: QuantSpec(format="nf4", compute_dtype="f8"), r"quant_compute_dtype \('f8'\)"),
        (
            lambda: TechniqueSpec(precision="fp9"),
            r"precision \('fp9'\) must be one of bf16-mixed, bf16-true",
        ),
        (lambda: TechniqueSpec(optimizer="adam"), r"optimizer \('adam'\) must be one of adamw"),
        (lambda: TechniqueSpec(freeze_layers=-1), r"freeze_layers \(-1\) must be an integer >= 0"),
        (lambda: ParallelSpec(gpus=8, tp=3), r"tp \(3\) must divide gpus \(8\)"),
        (lambda: ParallelSpec(gpus=4, shard="none"), r"shard 'none' with 4 data-parallel ranks"),
        (lambda: ParallelSpec(offload="optimizer"), r"offload \('optimizer'\) needs.*zero2"),
        (lambda: ParallelSpec(offload="params", shard="zero2"), r"offload 'params' needs --shard"),
    ],
)
def test_each_part_refuses_its_own_bad_fields_with_the_workloads_message(build, message) -> None:
    with pytest.raises(SpecError, match=message):
        build()


def test_a_part_reports_all_its_problems_together() -> None:
    both = r"^2 problems: shard \('x'\) must be .*; gpus \(0\) must be a positive integer$"
    with pytest.raises(SpecError, match=both):
        ParallelSpec(gpus=0, shard="x")


def test_the_same_value_is_refused_in_the_same_words_by_the_part_and_the_workload() -> None:
    for part, flat in (
        (lambda: ShapeSpec(batch_size=-2), lambda: WorkloadSpec(batch_size=-2)),
        (lambda: QuantSpec(format="q3"), lambda: WorkloadSpec(mode="infer", quant="q3")),
        (lambda: ParallelSpec(gpus=6, tp=4), lambda: WorkloadSpec(gpus=6, tp=4)),
    ):
        with pytest.raises(SpecError) as a:
            part()
        with pytest.raises(SpecError) as b:
            flat()
        assert str(a.value) == str(b.value)


def test_the_parallel_layout_defaults_its_sharding_and_derives_dp() -> None:
    assert ParallelSpec(gpus=8).shard == "ddp"
    assert ParallelSpec(gpus=8, tp=8).shard == "none"
    assert ParallelSpec(gpus=8, tp=2).dp == 4


def test_a_workload_is_made_of_its_three_parts() -> None:
    w = WorkloadSpec(
        batch_size=4,
        seq_len=2048,
        precision="amp-bf16",
        lora_rank=16,
        lora_targets=["q_proj", "v_proj"],
        quant="nf4-dq",
        prepare_kbit=True,
        gpus=2,
    )
    assert w.shape == ShapeSpec(batch_size=4, seq_len=2048)
    assert w.techniques.lora == LoraSpec(rank=16, targets=("q_proj", "v_proj"))
    assert w.techniques.quantization == QuantSpec(format="nf4-dq", prepare_kbit=True)
    assert w.techniques.optimizer == "adamw"  # resolved from the mode
    assert w.parallel == ParallelSpec(gpus=2, shard="ddp")
    assert WorkloadSpec.of(shape=w.shape, techniques=w.techniques, parallel=w.parallel) == w
    assert WorkloadSpec().techniques.lora is None  # full fine-tuning


def test_a_workload_composed_of_parts_resolves_the_modes_optimizer() -> None:
    served = WorkloadSpec.of(shape=ShapeSpec(mode="infer", new_tokens=8))
    assert served.optimizer == "none" and served.new_tokens == 8
    assert WorkloadSpec.of(techniques=TechniqueSpec(precision="fp32")).optimizer == "adamw"


def test_flat_construction_flat_reads_and_replace_still_work() -> None:
    w = WorkloadSpec(batch_size=4, lora_rank=16)
    assert (w.batch_size, w.lora_rank, w.quant, w.dp) == (4, 16, "none", 1)
    wider = dataclasses.replace(w, batch_size=8, lora_rank=None)
    assert wider.shape.batch_size == 8 and wider.techniques.lora is None
    assert w.shape.batch_size == 4  # the original keeps its parts


def test_extra_is_gone_and_its_two_uses_are_typed_fields() -> None:
    assert "extra" not in {f.name for f in dataclasses.fields(WorkloadSpec)}
    with pytest.raises(TypeError):
        WorkloadSpec(extra={"grad_accum": 8})  # type: ignore[call-arg]
    w = WorkloadSpec(grad_accum=8, zero_grad_set_to_none=False)
    assert w.shape.grad_accum == 8 and "grad_accum" not in w.normalized()
    with pytest.raises(SpecError, match=r"quant_compute_dtype \('fp32'\) must be None or one of"):
        WorkloadSpec(quant_compute_dtype="fp32")


def test_accumulating_with_gradients_freed_each_step_is_warned_about() -> None:
    held = "gradients of the earlier micro-batches are held"
    assert any(held in n for n in WorkloadSpec(grad_accum=4).warnings())
    assert WorkloadSpec(grad_accum=4, zero_grad_set_to_none=False).warnings() == []


def test_prepare_kbit_runs_the_programs_in_fp32_with_the_quantized_layers_dtype() -> None:
    from memfit.estimate.analytic.engine import kbit_workload

    qlora = WorkloadSpec(quant="nf4", lora_rank=8, prepare_kbit=True, precision="bf16-true")
    seen = kbit_workload(qlora)
    assert (seen.precision, seen.prepare_kbit, seen.quant_compute_dtype) == (
        "32-true",
        False,
        "bf16",
    )
    assert seen.techniques.quantization.compute_dtype == "bf16"
    assert kbit_workload(WorkloadSpec()) == WorkloadSpec()  # nothing to rewrite
