"""Multi-GPU plans write their launcher configs; techniques that cannot run here say why."""

from __future__ import annotations

import json

import pytest
import torch
from tests.apply.conftest import build
from tests.conftest import TINY_LLAMA

import memfit
from memfit.apply import UnsupportedHardwareError, resolve, write_launch_configs
from memfit.apply import requirements as req
from memfit.plan import export
from memfit.spec import WorkloadSpec


def test_zero3_with_offload_writes_the_deepspeed_config_memfit_plan_prints(tmp_path) -> None:
    w = WorkloadSpec(gpus=8, shard="zero3", offload="params", precision="amp-bf16", batch_size=2)
    launch = write_launch_configs(w, tmp_path, script="train.py")
    written = json.loads(launch.files["deepspeed"].read_text())
    assert written == export.deepspeed_config(resolve(w).settings)
    assert written["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert launch.command == "deepspeed --num_gpus 8 train.py"


def test_fsdp_writes_an_accelerate_config(tmp_path) -> None:
    import yaml

    launch = write_launch_configs(WorkloadSpec(gpus=4, shard="fsdp"), tmp_path)
    cfg = yaml.safe_load(launch.files["accelerate_fsdp"].read_text())
    assert cfg["distributed_type"] == "FSDP" and cfg["num_processes"] == 4
    assert launch.command.startswith("accelerate launch --config_file")


def test_ddp_and_single_gpu_need_no_file(tmp_path) -> None:
    assert write_launch_configs(WorkloadSpec(gpus=2), tmp_path).command == (
        "torchrun --nproc_per_node 2 train.py"
    )
    single = write_launch_configs(WorkloadSpec(), tmp_path)
    assert single.files == {} and single.command == "python train.py"


def test_flash_attention_needs_a_cuda_gpu() -> None:
    model = build(TINY_LLAMA)
    with pytest.raises(
        UnsupportedHardwareError,
        match=r"attention 'flash' needs a CUDA GPU of compute capability 8\.0\+",
    ):
        memfit.apply_plan_(model, WorkloadSpec(attention="flash"))
    assert model.config._attn_implementation == "sdpa"  # unchanged


def test_bf16_on_a_pre_ampere_gpu_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla T4")
    with pytest.raises(
        UnsupportedHardwareError,
        match=r"bf16 .* needs compute capability 8\.0\+; Tesla T4 has 7\.5",
    ):
        req.require_bf16(torch.device("cuda", 0))


def test_a_missing_package_names_the_pip_command(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "flash_attn" else real(n, *a)
    )
    with pytest.raises(memfit.MissingDependencyError, match="pip install flash-attn"):
        req.require_package("flash_attn", "flash-attn", "attention 'flash'")


def test_a_plan_that_does_not_fit_is_not_applied() -> None:
    plan = memfit.plan(
        "llama-2-7b",
        gpu="T4",
        seq_len=4096,
        batch_size=64,
        keep_full_finetune=True,
        allow_quant=False,
        estimator=_huge,
        confirm=None,
    )
    with pytest.raises(memfit.DoesNotFitError):
        memfit.apply_plan_(build(TINY_LLAMA), plan)


def _huge(w):
    import dataclasses

    from tests.plan.conftest import closed_form_estimate

    est = closed_form_estimate(w)
    return dataclasses.replace(
        est, device_used_bytes=10**15, ranges={"device_used_bytes": (10**15, 10**15)}
    )


def test_anything_else_is_refused_with_what_to_pass() -> None:
    with pytest.raises(
        memfit.SpecError, match=r"plan \(dict\) must be a memfit Plan, PlanOption or WorkloadSpec"
    ):
        memfit.apply_plan_(build(TINY_LLAMA), {"precision": "bf16"})
