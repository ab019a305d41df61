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

A factory may also return ``(module, inputs, {"supports": {...}})`` or carry a
``memfit_supports`` attribute (on the function or the module) naming the techniques memfit may
apply to it: ``checkpointing``, ``lora``, ``freeze``, ``quant``
(:mod:`memfit.estimate.trace.factory_techniques`, docs/factories.md); the others are refused.
``timm/NAME`` and ``torchvision/NAME`` are built here too, by those libraries (no weights), with
the input size their configs give and the techniques they support.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from memfit.errors import SpecError, UnknownModelError
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace import build, quantized
from memfit.estimate.trace.build import PARAM_DTYPE
from memfit.estimate.trace.factory_techniques import (
    apply_techniques_,
    declared_supports,
    refuse_undeclared,
)
from memfit.estimate.trace.steps import AUTOCAST_DTYPE, InBackward, make_optimizer
from memfit.estimate.trace.user_step import trace_step
from memfit.models.zoo import ZOO_PREFIXES, zoo_source
from memfit.spec import WorkloadSpec


def load_factory(spec: str) -> tuple[torch.nn.Module, Any, frozenset[str]]:
    """(model on meta, its input description, the techniques it declares)."""
    if spec.split("/", 1)[0] in ZOO_PREFIXES:
        return _zoo_model(spec)
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
    parts = made if isinstance(made, tuple) else (made,)
    if not 1 <= len(parts) <= 3:
        raise SpecError(
            f"factory {spec!r} returned {len(parts)} values; return model, (model, inputs) or "
            "(model, inputs, {'supports': {...}})"
        )
    model, inputs, extra = (*parts, None, None)[:3]
    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"factory {spec!r} returned {type(model).__name__}, not an nn.Module")
    if inputs is None:
        inputs = getattr(model, "example_inputs", None)
    if inputs is None:
        raise SpecError(
            f"factory {spec!r} gave no input description: return (model, inputs) or define "
            "model.example_inputs(batch_size, seq_len)"
        )
    return model, inputs, declared_supports(factory, model, extra=extra)


def _zoo_model(spec: str) -> tuple[torch.nn.Module, Any, frozenset[str]]:
    """``timm/NAME`` (``timm.create_model``, input size from its ``pretrained_cfg``) or
    ``torchvision/NAME`` (``torchvision.models.get_model``, 224 x 224: the crop of most of its
    ImageNet weights' transforms), on meta, without weights."""
    prefix, _, name = spec.partition("/")
    zoo_source(spec)  # the library is installed (else the one-line pip error)
    supports: frozenset[str] = frozenset({"checkpointing", "lora", "freeze", "quant"})
    with torch.device("meta"):
        try:
            if prefix == "timm":
                import timm

                model = timm.create_model(name, pretrained=False)
                size = tuple((getattr(model, "pretrained_cfg", None) or {}).get("input_size", ()))
            else:
                import torchvision

                model = torchvision.models.get_model(name, weights=None)
                size = ()
        except (RuntimeError, KeyError, ValueError) as exc:
            raise UnknownModelError(f"{prefix} cannot build {name!r}: {exc}") from exc
    if len(size) != 3:
        size = (3, 224, 224)
    if not callable(getattr(model, "set_grad_checkpointing", None)):
        supports -= {"checkpointing"} if build.decoder_layers(model) is None else set()
    return model, {"pixel_values": ("batch", *size)}, supports


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


def trace_factory(spec: str, workload: WorkloadSpec, *, gpu: Any = None) -> MemoryEstimate:
    model, inputs, supports = load_factory(spec)
    refuse_undeclared(spec, workload, supports)
    dtype = PARAM_DTYPE[workload.run_precision]
    model = model.to(dtype)
    model.train(workload.is_train)
    model = apply_techniques_(model, workload)
    batch = _materialise(inputs, workload, dtype)
    autocast = AUTOCAST_DTYPE.get(workload.run_precision)

    def step(m: torch.nn.Module, opt: Any, data: Any) -> None:
        amp = torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None)
        with amp, torch.set_grad_enabled(workload.is_train):
            if isinstance(data, dict) and set(data) == {"pixel_values"} and _positional(m):
                out = m(data["pixel_values"])  # timm / torchvision: forward(x)
            else:
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
            name = workload.optimizer or "none"
            if workload.optimizer_in_bwd:
                return InBackward(params, name, model)
            return make_optimizer(params, name, model)

    est = trace_step(step, model=model, optimizer=optimizer, inputs=batch, gpu=gpu, name=spec)
    n_quantized = quantized.n_quantized_params(model)  # stand-ins hold them as buffers
    if n_quantized:
        est = dataclasses.replace(est, n_params=est.n_params + n_quantized)
    return _with_workload(est, workload)


def _positional(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the model a peft wrapper holds) is a timm / torchvision network,
    whose forward takes the image tensor positionally."""
    base = getattr(model, "get_base_model", lambda: model)()
    return type(base).__module__.split(".")[0] in ZOO_PREFIXES


def _with_workload(est: MemoryEstimate, workload: WorkloadSpec) -> MemoryEstimate:
    return dataclasses.replace(est, workload=workload.normalized())
