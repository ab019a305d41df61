"""The plan's optimizer: the class and settings memfit's estimate assumes, and the state dtypes it
really keeps after a step."""

from __future__ import annotations

import pytest
import torch
from tests.apply.conftest import applied, batch
from tests.conftest import TINY_LLAMA

import memfit
from memfit.apply import AmpStep, training_step
from memfit.apply.optimizers import optimizer_name
from memfit.estimate.optim_states import BNB_MIN_8BIT_SIZE
from memfit.estimate.trace.steps import make_optimizer


def _stepped(name: str, **workload):
    model, w = applied(TINY_LLAMA, optimizer=name, precision="fp32", **workload)
    opt = memfit.build_optimizer(model, w)
    training_step(model, batch(), opt, AmpStep(w, device_type="cpu"))
    return model, opt


@pytest.mark.parametrize("name", ["adamw", "adamw-fused", "sgd", "sgd-momentum", "adafactor"])
def test_torch_and_transformers_optimizers_match_what_the_estimator_builds(name: str) -> None:
    model, w = applied(TINY_LLAMA, optimizer=name)
    ours = memfit.build_optimizer(model, w)
    theirs = make_optimizer([p for p in model.parameters() if p.requires_grad], name, model)
    assert type(ours) is type(theirs)
    keys = ("foreach", "fused", "momentum", "scale_parameter", "relative_step")
    assert {k: ours.defaults.get(k) for k in keys} == {k: theirs.defaults.get(k) for k in keys}
    assert optimizer_name(ours) == name


def test_adamw_keeps_two_fp32_moments_per_parameter() -> None:
    model, opt = _stepped("adamw")
    p = model.model.layers[0].mlp.up_proj.weight
    assert (
        opt.state[p]["exp_avg"].dtype == torch.float32 and opt.state[p]["exp_avg"].shape == p.shape
    )
    assert opt.state[p]["exp_avg_sq"].dtype == torch.float32


@pytest.mark.parametrize("name", ["adamw-8bit", "paged-adamw-8bit"])
def test_8bit_adamw_keeps_uint8_states_and_fp32_embedding_states(name: str) -> None:
    pytest.importorskip("bitsandbytes")
    model, opt = _stepped(name)
    assert optimizer_name(opt) == name
    big = model.model.layers[0].mlp.up_proj.weight
    assert big.numel() >= BNB_MIN_8BIT_SIZE
    s = opt.state[big]
    assert s["state1"].dtype == torch.uint8 and s["state2"].dtype == torch.uint8
    assert s["absmax1"].dtype == torch.float32
    emb = model.model.embed_tokens.weight  # 64000 elements: 8-bit unless overridden, as HF does
    assert emb.numel() >= BNB_MIN_8BIT_SIZE
    assert opt.state[emb]["state1"].dtype == torch.float32
    small = model.model.norm.weight  # below bitsandbytes' min_8bit_size: 32-bit states
    assert opt.state[small]["state1"].dtype == torch.float32


def test_lion_keeps_one_fp32_state() -> None:
    pytest.importorskip("bitsandbytes")
    model, opt = _stepped("lion")
    s = opt.state[model.model.layers[0].mlp.up_proj.weight]
    assert s["state1"].dtype == torch.float32 and "state2" not in s


def test_adafactor_factors_the_second_moment() -> None:
    model, opt = _stepped("adafactor")
    p = model.model.layers[0].mlp.up_proj.weight  # (256, 128)
    s = opt.state[p]
    assert s["exp_avg_sq_row"].shape == (256,) and s["exp_avg_sq_col"].shape == (128,)
    assert "exp_avg" not in s  # beta1=None: no momentum


def test_sgd_momentum_keeps_a_momentum_buffer_and_plain_sgd_none() -> None:
    model, opt = _stepped("sgd-momentum")
    p = model.model.layers[0].mlp.up_proj.weight
    assert opt.state[p]["momentum_buffer"].shape == p.shape
    model, opt = _stepped("sgd")
    assert opt.state[model.model.layers[0].mlp.up_proj.weight].get("momentum_buffer") is None


def test_only_trainable_parameters_get_states() -> None:
    model, opt = _stepped("adamw", lora_rank=4)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in model.parameters() if p.requires_grad}
    assert all("lora_" in n for n, p in model.named_parameters() if id(p) in in_opt)


def test_an_inference_plan_has_no_optimizer_to_build() -> None:
    model, w = applied(TINY_LLAMA, mode="infer")
    with pytest.raises(memfit.SpecError, match="optimizer 'none': the plan runs no optimizer"):
        memfit.build_optimizer(model, w)


def test_user_settings_reach_the_optimizer() -> None:
    model, w = applied(TINY_LLAMA, optimizer="adamw")
    opt = memfit.build_optimizer(model, w, lr=3e-5, weight_decay=0.1)
    assert opt.defaults["lr"] == 3e-5 and opt.defaults["weight_decay"] == 0.1
