"""Tracing the user's own step and `module:factory` models (non-transformer code)."""

from __future__ import annotations

import pytest
import torch
from tests.fixtures.cnn import SmallCNN

import memfit
from memfit import SpecError, WorkloadSpec


def _train_step(model, opt, batch):
    loss = model(batch["x"]).float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_trace_step_of_a_meta_model_matches_real_cpu_execution() -> None:
    with torch.device("meta"):
        meta_model = SmallCNN()
    fake = memfit.trace_step(
        _train_step,
        model=meta_model,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
        inputs={"x": torch.empty(8, 3, 32, 32, device="meta")},
    )
    from memfit.estimate.trace.steps import label_model_state
    from memfit.estimate.trace.tracker import StorageTracker

    torch.manual_seed(0)
    real_model = SmallCNN()
    opt = torch.optim.SGD(real_model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    batch = {"x": torch.randn(8, 3, 32, 32)}
    tracker = StorageTracker(device_type="cpu")
    with tracker:
        label_model_state(tracker, real_model)
        for _ in range(2):
            _train_step(real_model, opt, batch)
    from memfit.hardware.overhead import device_overhead

    workspaces = device_overhead(None, training=True).workspace_bytes  # cuBLAS, added by memfit
    assert fake.peak_allocated_bytes == tracker.peak.total_bytes + 8 * 3 * 32 * 32 * 4 + workspaces
    assert fake.phases["optimizer"].components["optimizer_states"] > 0
    assert set(fake.phases) == {"forward", "backward", "optimizer"}


def test_trace_step_leaves_a_real_model_untouched() -> None:
    model = SmallCNN()
    before = model.head.weight.detach().clone()
    est = memfit.trace_step(
        _train_step,
        model=model,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        inputs={"x": torch.randn(4, 3, 32, 32)},
    )
    assert est.n_params == sum(p.numel() for p in model.parameters())
    assert torch.equal(model.head.weight, before)
    assert not isinstance(model.head.weight, torch._subclasses.FakeTensor)


def test_trace_step_rejects_an_optimizer_instance() -> None:
    model = SmallCNN()
    with pytest.raises(SpecError, match="optimizer must be a factory"):
        memfit.trace_step(_train_step, model=model, optimizer=torch.optim.SGD(model.parameters()))


CNN = "tests.fixtures.cnn:make_cnn"


def test_factory_models_are_estimated_from_module_colon_function() -> None:
    small = memfit.estimate(CNN, WorkloadSpec(batch_size=4), allow_code=True)
    big = memfit.estimate(CNN, WorkloadSpec(batch_size=16), allow_code=True)
    assert small.n_params == sum(p.numel() for p in SmallCNN().parameters())
    assert big.components["activations"] > 3 * small.components["activations"]
    assert small.workload["batch_size"] == 4


def test_factory_without_input_description_is_a_clear_error() -> None:
    with pytest.raises(SpecError, match="gave no input description"):
        memfit.estimate("tests.fixtures.cnn:make_cnn_without_inputs", allow_code=True)


def test_factory_models_refuse_techniques_memfit_cannot_apply_to_user_code() -> None:
    with pytest.raises(SpecError, match=r"gpus=2, shard='ddp' cannot be applied to factory"):
        memfit.estimate(CNN, WorkloadSpec(lora_rank=8, gpus=2, shard="ddp"), allow_code=True)


def test_factory_models_refuse_techniques_they_do_not_declare() -> None:
    with pytest.raises(
        SpecError, match=r"lora_rank=8 cannot be applied .*declares memfit_supports = nothing"
    ):
        memfit.estimate(CNN, WorkloadSpec(lora_rank=8), allow_code=True)


def test_factory_models_take_the_8bit_optimizer() -> None:
    est = memfit.estimate(CNN, WorkloadSpec(optimizer="adamw-8bit"), allow_code=True)
    ref = memfit.estimate(CNN, WorkloadSpec(optimizer="adamw"), allow_code=True)
    assert 0 < est.components["optimizer_states"] <= ref.components["optimizer_states"]


def test_a_factory_model_is_refused_without_allow_code_and_nothing_is_imported() -> None:
    import sys

    sys.modules.pop("tests.fixtures.cnn", None)
    with pytest.raises(SpecError, match=r"names Python code .*--allow-code .*allow_code=True"):
        memfit.estimate(CNN, WorkloadSpec())
    assert "tests.fixtures.cnn" not in sys.modules
