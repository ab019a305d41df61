"""The workload flags table: every command's argparse block comes from it, and a workload written
as flags parses back to the same workload."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shlex

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memfit.cli.entry import build_parser
from memfit.errors import SpecError
from memfit.flags import EVERY, FLAGS, flags_for, workload_flags, workload_from_args
from memfit.plan.request import PlanRequest
from memfit.spec import (
    ATTENTIONS,
    CHECKPOINTING,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    QUANTS,
    SHARDS,
    TASKS,
    WorkloadSpec,
)


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command]  # type: ignore[index]


@pytest.mark.parametrize("command", EVERY)
def test_every_commands_workload_flags_come_from_the_table(command: str) -> None:
    actions = _subparser(command)._option_string_actions
    rows = flags_for(command)
    assert rows, command
    for row in rows:
        action = actions[row.name]
        got = (action.dest, action.default, action.help, action.choices)
        assert got == (row.dest, row.default, row.help, row.choices), (command, row.name)


def test_fit_and_doctor_take_the_estimates_flags_with_its_help_and_choices() -> None:
    estimate = _subparser("estimate")._option_string_actions
    for command in ("fit", "doctor"):
        text = _subparser(command).format_help()
        assert "--task {auto,causal-lm,seq-cls,seq2seq}" in text
        assert "tensor-parallel degree (default 1)" in text
        actions = _subparser(command)._option_string_actions
        for row in flags_for("estimate"):
            if row.target == "pipeline":  # diffusion pipelines: estimate only (docs/diffusion.md)
                continue
            assert actions[row.name].help == estimate[row.name].help, (command, row.name)


def test_fit_refuses_an_unknown_task_on_the_command_line(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["fit", "gpt2", "--gpu", "T4", "--solve", "batch", "--task", "x"])
    assert exit_.value.code == 2
    assert "invalid choice: 'x'" in capsys.readouterr().err


def test_every_row_sets_a_field_that_exists() -> None:
    targets = {
        "workload": {f.name for f in dataclasses.fields(WorkloadSpec)},
        "request": {f.name for f in dataclasses.fields(PlanRequest)},
    }
    from memfit.spec.diffusion import DiffusionJob, DiffusionTrainJob

    targets["pipeline"] = {f.name for f in dataclasses.fields(DiffusionJob)}
    targets["pipeline"] |= {f.name for f in dataclasses.fields(DiffusionTrainJob)}  # training
    from memfit.spec.media import MediaSpec

    targets["media"] = {f.name for f in dataclasses.fields(MediaSpec)}
    for row in FLAGS:
        assert row.field in targets[row.target], row.name
        assert set(row.commands) <= set(EVERY), row.name


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def _parsed(flags: str) -> WorkloadSpec:
    return workload_from_args(_parser().parse_args(["estimate", "m", *shlex.split(flags)]))


@st.composite
def workloads(draw: st.DrawFn) -> WorkloadSpec:
    mode = draw(st.sampled_from(("train", "infer")))
    train = mode == "train"
    lora = draw(st.none() | st.integers(1, 256)) if train else None
    quant = draw(st.sampled_from(QUANTS)) if lora is not None or not train else "none"
    names = st.lists(st.sampled_from(("q_proj", "v_proj", "fc1")), min_size=1)
    # targets without a rank mean nothing (the command line refuses them): only with LoRA
    targets = draw(st.just("all-linear") | names) if lora is not None else "all-linear"
    tp = draw(st.sampled_from((1, 2, 4)))
    gpus = tp * draw(st.sampled_from((1, 2, 3)))
    kw = dict(
        mode=mode,
        batch_size=draw(st.integers(1, 64)),
        seq_len=draw(st.integers(1, 8192)),
        new_tokens=0 if train else draw(st.integers(0, 512)),
        precision=draw(st.sampled_from(PRECISIONS)),
        attention=draw(st.sampled_from(ATTENTIONS)),
        checkpointing=draw(st.sampled_from(CHECKPOINTING)) if train else "none",
        optimizer=draw(st.sampled_from(OPTIMIZERS)) if train else None,
        lora_rank=lora,
        lora_targets=tuple(targets) if isinstance(targets, list) else targets,
        freeze_layers=draw(st.integers(0, 8)) if train else 0,
        task=draw(st.sampled_from(TASKS)),
        quant=quant,
        quant_group_size=draw(st.sampled_from((128, 64, 32))),
        prepare_kbit=train and quant != "none" and draw(st.booleans()),
        gpus=gpus,
        tp=tp,
        shard=draw(st.none() | st.sampled_from(SHARDS)),
        offload=draw(st.sampled_from(OFFLOADS)),
    )
    try:
        return WorkloadSpec(**kw)
    except SpecError:
        assume(False)
        raise


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(workloads())
def test_a_workload_written_as_flags_parses_back_to_itself(w: WorkloadSpec) -> None:
    assert _parsed(workload_flags(w)) == w
    every = tuple(f.field for f in flags_for("estimate"))
    assert _parsed(workload_flags(w, explicit=every)) == w


def test_the_flag_strings_leave_out_defaults_but_keep_the_shape_and_precision() -> None:
    assert workload_flags(WorkloadSpec()) == (
        "--mode train --batch 1 --seq 512 --precision bf16-mixed"
    )
    assert workload_flags(WorkloadSpec(mode="infer", gpus=4, tp=4, new_tokens=8)) == (
        "--mode infer --batch 1 --seq 512 --new-tokens 8 --precision bf16-true --gpus 4 --tp 4"
    )


def test_the_flag_strings_say_what_the_parser_cannot_infer() -> None:
    offloaded = WorkloadSpec(shard="zero2", offload="optimizer")  # one GPU, ZeRO-Offload
    assert "--shard zero2 --offload optimizer" in workload_flags(offloaded)
    lora = WorkloadSpec(lora_rank=8, lora_targets=("q_proj", "v_proj"))
    assert "--lora-rank 8 --lora-targets q_proj,v_proj" in workload_flags(lora)
    gptq = WorkloadSpec(mode="infer", quant="int4-gptq", quant_group_size=64, task="seq-cls")
    assert workload_flags(gptq).endswith("--quant int4-gptq --group-size 64 --task seq-cls")
    assert "--shard" not in workload_flags(WorkloadSpec(gpus=8))  # ddp: the default for 8 ranks


def test_a_plans_estimate_command_names_its_checkpointing_and_optimizer() -> None:
    from memfit.plan.export import memfit_flags
    from memfit.plan.space import Settings

    s = Settings(precision="bf16-true", optimizer="adamw", micro_batch=4, grad_accum=2)
    text = memfit_flags(s, PlanRequest(seq_len=1024), "m")
    assert text == (
        "memfit estimate m --mode train --batch 4 --seq 1024 --grad-accum 2 --precision bf16-true "
        "--checkpointing none --optimizer adamw"
    )
