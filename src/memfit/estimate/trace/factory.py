"""``package.module:factory`` models: any ``nn.Module`` (CNNs, diffusion UNets, custom code).

The factory is called with no arguments under ``torch.device("meta")`` (so nothing is allocated) and
returns either a module, or ``(module, inputs)`` where ``inputs`` describes one micro-batch:

* a dict ``{name: shape}`` whose shapes may use the strings ``"batch"`` and ``"seq"``, e.g.
  ``{"x": ("batch", 3, 224, 224)}`` (float inputs in the model's dtype); integer inputs as
  ``{"ids": {"shape": ("batch", "seq"), "dtype": "long", "high": 32000}}``;
* or a callable ``inputs(batch_size, seq_len)`` returning a dict or tuple of tensors.

Without ``inputs`` the model must define ``example_inputs(batch_size, seq_len)``. Training uses the
output's ``.loss`` if it has one, else the mean of the (first) output as the loss.
Importing the factory runs the user's code: it is the user's own module, named explicitly.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from memfit.errors import SpecError, UnknownModelError
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace.build import PARAM_DTYPE
from memfit.estimate.trace.steps import AUTOCAST_DTYPE, make_optimizer
from memfit.estimate.trace.user_step import trace_step
from memfit.spec import WorkloadSpec


def load_factory(spec: str) -> tuple[torch.nn.Module, Any]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownModelError(
            f"cannot import {module_name!r} for factory {spec!r}: {exc}; make sure the module "
            "is on "
            "PYTHONPATH (run memfit from its directory)"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UnknownModelError(f"{module_name!r} has no callable {attr!r} (from {spec!r})")
    with torch.device("meta"):
        made = factory()
    model, inputs = made if isinstance(made, tuple) else (made, None)
    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"factory {spec!r} returned {type(model).__name__}, not an nn.Module")
    if inputs is None:
        inputs = getattr(model, "example_inputs", None)
    if inputs is None:
        raise SpecError(
            f"factory {spec!r} gave no input description: return (model, inputs) or define "
            "model.example_inputs(batch_size, seq_len)"
        )
    return model, inputs


def _materialise(inputs: Any, workload: WorkloadSpec, dtype: torch.dtype) -> Any:
    """Meta tensors for one micro-batch from the factory's description."""
    b, s = workload.batch_size, workload.seq_len
    if callable(inputs):
        return inputs(b, s)
    out = {}
    for name, desc in inputs.items():
        spec = desc if isinstance(desc, dict) else {"shape": desc}
        dims = tuple(b if d == "batch" else s if d == "seq" else int(d) for d in spec["shape"])
        if spec.get("dtype", "float") == "long":
            out[name] = torch.randint(0, int(spec.get("high", 2)), dims, device="meta")
        else:
            out[name] = torch.empty(dims, dtype=dtype, device="meta")
    return out


#: Workload settings a factory model cannot take from memfit (they change how the model is built
#: or distributed, which is the user's code), with their neutral value.
FACTORY_NEUTRAL: dict[str, Any] = {
    "lora_rank": None,
    "freeze_layers": 0,
    "checkpointing": "none",
    "quant": "none",
    "gpus": 1,
    "tp": 1,
    "shard": "none",
    "offload": "none",
}


def _reject_model_techniques(spec: str, workload: WorkloadSpec) -> None:
    if not workload.is_train:
        neutral = {k: v for k, v in FACTORY_NEUTRAL.items() if k in ("quant", "gpus", "tp")}
    else:
        neutral = FACTORY_NEUTRAL
    bad = [f"{k}={getattr(workload, k)!r}" for k, v in neutral.items() if getattr(workload, k) != v]
    if bad:
        raise SpecError(
            f"{', '.join(bad)} cannot be applied to factory model {spec!r}: memfit builds "
            "Hugging Face configs itself but runs your factory's module as it is; apply the "
            "technique inside the factory (or trace your own step with memfit.trace_step)"
        )


def trace_factory(spec: str, workload: WorkloadSpec, *, gpu: Any = None) -> MemoryEstimate:
    _reject_model_techniques(spec, workload)
    model, inputs = load_factory(spec)
    dtype = PARAM_DTYPE[workload.run_precision]
    model = model.to(dtype)
    model.train(workload.is_train)
    batch = _materialise(inputs, workload, dtype)
    autocast = AUTOCAST_DTYPE.get(workload.run_precision)

    def step(m: torch.nn.Module, opt: Any, data: Any) -> None:
        amp = torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None)
        with amp, torch.set_grad_enabled(workload.is_train):
            out = m(**data) if isinstance(data, dict) else m(*data)
        if not workload.is_train:
            return
        loss = getattr(out, "loss", None)
        if loss is None:
            first = out if isinstance(out, torch.Tensor) else out[0]
            loss = first.mean()
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=workload.zero_grad_set_to_none)

    optimizer = None
    if workload.uses_optimizer:

        def optimizer(params: list[torch.nn.Parameter]) -> Any:
            return make_optimizer(params, workload.optimizer or "none", model)

    est = trace_step(step, model=model, optimizer=optimizer, inputs=batch, gpu=gpu, name=spec)
    return _with_workload(est, workload)


def _with_workload(est: MemoryEstimate, workload: WorkloadSpec) -> MemoryEstimate:
    import dataclasses

    return dataclasses.replace(est, workload=workload.normalized())
