"""The Hugging Face Trainer path: real TrainingArguments from a plan, and a real (CPU) Trainer run
checked by PlanCallback."""

from __future__ import annotations

import json

import pytest
import torch
from tests.apply.conftest import build
from tests.conftest import TINY_LLAMA

import memfit
import memfit.apply
from memfit.spec import WorkloadSpec

transformers = pytest.importorskip("transformers")


def test_training_arguments_carry_the_plan() -> None:
    w = WorkloadSpec(
        precision="amp-bf16",
        checkpointing="full",
        optimizer="adamw-8bit",
        batch_size=4,
        grad_accum=8,
    )
    args = memfit.apply.training_arguments(w, output_dir="unused", report_to=[])
    assert isinstance(args, transformers.TrainingArguments)
    assert args.per_device_train_batch_size == 4 and args.gradient_accumulation_steps == 8
    assert args.bf16 and not args.fp16
    assert args.activation_checkpointing and args.activation_checkpointing_kwargs == {
        "use_reentrant": False
    }
    assert args.optim == "adamw_bnb_8bit"


@pytest.mark.parametrize(
    "optimizer,optim",
    [
        ("adamw", "adamw_torch"),
        ("adamw-fused", "adamw_torch_fused"),
        ("paged-adamw-8bit", "paged_adamw_8bit"),
        ("lion", "lion_32bit"),
        ("adafactor", "adafactor"),
        ("sgd", "sgd"),
        ("sgd-momentum", "sgd"),
    ],
)
def test_every_optimizer_maps_to_an_hf_optim_name(optimizer: str, optim: str) -> None:
    args = memfit.apply.training_arguments(WorkloadSpec(optimizer=optimizer), output_dir="u")
    assert args.optim == optim
    assert (args.optim_args == "momentum=0.9") == (optimizer == "sgd-momentum")


def test_pure_bf16_loads_bf16_weights_instead_of_autocasting() -> None:
    args = memfit.apply.training_arguments(WorkloadSpec(precision="bf16-true"), output_dir="u")
    assert not args.bf16 and not args.fp16


def test_selective_checkpointing_is_left_to_apply_plan() -> None:
    args = memfit.apply.training_arguments(WorkloadSpec(checkpointing="selective"), output_dir="u")
    assert not args.activation_checkpointing  # a policy function cannot go into the arguments


def test_an_inference_plan_has_no_training_arguments() -> None:
    with pytest.raises(memfit.SpecError, match="needs a training plan"):
        memfit.apply.training_arguments(WorkloadSpec(mode="infer"), output_dir="u")


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 500, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def _trainer(model, plan, tmp_path, callback, **overrides):
    args = memfit.apply.training_arguments(
        plan,
        output_dir=str(tmp_path),
        max_steps=2,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        **overrides,
    )
    return transformers.Trainer(
        model=model, args=args, train_dataset=_Tokens(), callbacks=[callback]
    )


def test_the_two_lines_train_with_the_plan_and_the_monitor(tmp_path) -> None:
    plan = WorkloadSpec(
        precision="fp32", lora_rank=4, checkpointing="full", optimizer="adamw-8bit", batch_size=2
    )
    model = memfit.apply_plan_(build(TINY_LLAMA), plan)
    log = tmp_path / "run.jsonl"
    callback = memfit.apply.PlanCallback(plan, monitor_log=log)
    trainer = _trainer(model, plan, tmp_path, callback)
    trainer.train()
    assert callback.problems == []
    assert memfit.apply.applied_plan(model) is not None
    opt = trainer.optimizer.optimizer  # accelerate wraps the one HF built from optim=
    assert memfit.apply.optimizers.optimizer_name(opt) == "adamw-8bit"
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["type"] for r in records] == ["start", "step", "step", "end"]
    assert all(r["peak_allocated_bytes"] > 0 for r in records if r["type"] == "step")


def test_the_callback_refuses_a_run_that_does_not_match(tmp_path) -> None:
    plan = WorkloadSpec(precision="fp32", lora_rank=4, optimizer="adamw-8bit", batch_size=2)
    model = build(TINY_LLAMA)  # the plan was never applied: no adapters, full model trains
    trainer = _trainer(model, plan, tmp_path, memfit.apply.PlanCallback(plan), optim="adamw_torch")
    with pytest.raises(memfit.SpecError) as err:
        trainer.train()
    text = str(err.value)
    assert "no LoRA adapter" in text and "TrainingArguments.optim is 'adamw_torch'" in text


def test_the_callback_turns_on_missing_checkpointing(tmp_path) -> None:
    plan = WorkloadSpec(precision="fp32", checkpointing="selective", optimizer="sgd", batch_size=2)
    model = build(TINY_LLAMA)
    callback = memfit.apply.PlanCallback(plan)
    _trainer(model, plan, tmp_path, callback).train()
    assert model.is_activation_checkpointing and callback.problems == []
