"""Tiny real models and the measurement harness shared by the apply tests.

``measured_train`` runs the plan's training step on the *applied* model — memfit's
``apply_plan_`` + ``build_optimizer`` + ``AmpStep`` — under the same exact tensor tracker the
estimator counts with, phase by phase as ``memfit.estimate.trace.steps.run_train_steps`` does, so
its phase peaks can be compared with the estimator's own trace (``emulate_cuda=False``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from tests.conftest import TINY_GPT2, TINY_LLAMA

import memfit
from memfit.apply import AmpStep
from memfit.estimate.trace.steps import label_model_state
from memfit.estimate.trace.tracker import StorageTracker
from memfit.spec import WorkloadSpec

VOCAB = 500


def build(config: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """A transformers causal LM from a tiny config, random fp32 weights, on CPU."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(config)
    model_type = d.pop("model_type")
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **d))


def batch(b: int = 2, s: int = 16, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, s), generator=g)
    return {"input_ids": ids, "labels": ids}


def applied(config: dict[str, Any], **workload: Any) -> tuple[torch.nn.Module, WorkloadSpec]:
    w = WorkloadSpec(**{"batch_size": 2, "seq_len": 16, **workload})
    return memfit.apply_plan_(build(config), w), w


def measured_train(config: dict[str, Any], w: WorkloadSpec, n_steps: int = 2) -> dict[str, int]:
    """Phase peaks (bytes) of ``n_steps`` real steps of the applied model, tracked exactly."""
    model = memfit.apply_plan_(build(config), w)
    opt = memfit.build_optimizer(model, w) if w.uses_optimizer else None
    amp = AmpStep(w, device_type="cpu")
    inputs = batch(w.batch_size, w.seq_len)
    tracker = StorageTracker(device_type="cpu")
    with tracker:
        label_model_state(tracker, model)
        tracker.label(list(inputs.values()), "activations")
        for _ in range(n_steps):
            tracker.set_phase("forward")
            with amp.autocast():
                out = model(**inputs)
            loss = out.loss
            tracker.set_phase("backward")
            amp.backward(loss)
            del out, loss
            label_model_state(tracker, model)
            tracker.set_phase("optimizer")
            if opt is not None:
                amp.step(opt)
                label_model_state(tracker, model, opt, amp.scaler)
                opt.zero_grad(set_to_none=True)
        tracker.set_phase("end")
    return {p: s.total_bytes for p, s in tracker.phase_peaks.items() if p not in ("init", "end")}


@pytest.fixture(params=[TINY_LLAMA, TINY_GPT2], ids=["llama", "gpt2"])
def tiny_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(request.param)
