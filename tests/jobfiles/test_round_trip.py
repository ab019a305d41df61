"""What memfit writes (plan/export.py: TrainingArguments, DeepSpeed JSON, accelerate FSDP config)
reads back through `memfit check` as the same job."""

from __future__ import annotations

import json

import pytest
import yaml

from memfit.jobfiles import read_job, workload_of
from memfit.plan.export import deepspeed_config, fsdp_config, training_arguments_kwargs
from memfit.plan.space import Settings

SETTINGS = [
    Settings(
        precision="bf16-mixed",
        optimizer="adamw-fused",
        checkpointing="full",
        micro_batch=2,
        grad_accum=8,
        gpus=4,
        shard="zero2",
    ),
    Settings(
        precision="16-mixed",
        optimizer="adamw-8bit",
        micro_batch=1,
        grad_accum=4,
        gpus=8,
        shard="zero3",
        offload="params",
    ),
    Settings(
        precision="bf16-mixed",
        optimizer="adamw",
        checkpointing="full",
        micro_batch=4,
        gpus=2,
        shard="zero3",
        offload="optimizer",
    ),
    Settings(
        precision="bf16-mixed", optimizer="paged-adamw-8bit", micro_batch=4, grad_accum=2, gpus=1
    ),
]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.describe())
def test_training_arguments_and_deepspeed_read_back_as_the_same_job(tmp_path, s):
    args = {"model_name_or_path": "gpt2", "max_length": 1024, **training_arguments_kwargs(s)}
    files = [tmp_path / "args.json"]
    files[0].write_text(json.dumps(args))
    if s.shard.startswith("zero"):
        (tmp_path / "ds_config.json").write_text(json.dumps(deepspeed_config(s)))
    job = read_job(files)
    w = workload_of(job, overrides={"gpus": s.gpus})
    assert (w.batch_size, w.grad_accum, w.precision, w.optimizer, w.checkpointing) == (
        s.micro_batch,
        s.grad_accum,
        s.precision,
        s.optimizer,
        s.checkpointing,
    )
    assert (w.shard, w.offload) == (s.shard if s.gpus > 1 else w.shard, s.offload)


@pytest.mark.parametrize("offload", ["none", "params"])
def test_the_accelerate_fsdp_config_reads_back_as_the_same_job(tmp_path, offload):
    s = Settings(
        precision="bf16-mixed",
        optimizer="adamw",
        checkpointing="full",
        micro_batch=2,
        gpus=4,
        shard="fsdp",
        offload=offload,
    )
    acc = tmp_path / "fsdp.yaml"
    acc.write_text(yaml.safe_dump(fsdp_config(s)))
    args = tmp_path / "args.json"
    args.write_text(
        json.dumps(
            {"model_name_or_path": "gpt2", "max_length": 512, **training_arguments_kwargs(s)}
        )
    )
    job = read_job([args, acc])
    w = workload_of(job)
    assert (w.gpus, w.shard, w.offload, w.checkpointing, w.precision) == (
        4,
        "fsdp",
        offload,
        "full",
        "bf16-mixed",
    )
