"""Quantized base weights, with the libraries that store them.

Two paths:

- **Loading** (the usual one): :func:`from_pretrained_kwargs` gives ``from_pretrained`` its
  ``quantization_config`` — transformers' ``BitsAndBytesConfig`` (built from the same keyword
  arguments ``memfit plan`` prints, :func:`memfit.plan.export.bnb_kwargs`) or ``TorchAoConfig``.
- **In place** on a model that is already built: :func:`quantize_linears_` replaces the Linear
  layers transformers would quantize (its default kept-out rule, as memfit's estimator reads it:
  :func:`memfit.estimate.trace.quantized.linears_to_quantize`) by bitsandbytes ``Linear8bitLt``
  (LLM.int8, threshold 6.0) / ``Linear4bit`` (NF4, FP4, double quantization), or quantizes them
  with torchao's ``quantize_``.

Backends (``quant_backend``):

==============  ======================================================================
``auto``        int8 / nf4 / nf4-dq / fp4: bitsandbytes (runs on CUDA and, in 0.50, on CPU);
                fp8: torchao dynamic float8 activations and weights with per-tensor scales
                (``torch._scaled_mm``: CUDA compute capability 8.9+) — the FP8 path memfit
                estimates; int4-gptq / int4-awq: refused (they are pre-quantized checkpoints).
``torchao``     weight-only torchao: int8 ``Int8WeightOnlyConfig`` and fp8
                ``Float8WeightOnlyConfig`` (both run on CPU), int4-gptq / int4-awq
                ``Int4WeightOnlyConfig(group_size)`` (round-to-nearest, same storage as GPTQ/AWQ;
                CUDA only).
``bitsandbytes`` int8 / nf4 / nf4-dq / fp4 only.
==============  ======================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from memfit.apply.requirements import (
    FP8_MIN_CAPABILITY,
    UnsupportedHardwareError,
    device_of,
    import_bitsandbytes,
    require_capability,
    require_package,
)

if TYPE_CHECKING:
    from memfit.apply.target import PlanLike
from memfit.errors import SpecError
from memfit.estimate.trace.quantized import COMPUTE_DTYPE, linears_to_quantize
from memfit.plan.export import bnb_kwargs
from memfit.spec import WorkloadSpec

QUANT_BACKENDS = ("auto", "bitsandbytes", "torchao")
BNB_FORMATS = ("int8", "nf4", "nf4-dq", "fp4")
#: LLM.int8 outlier threshold: transformers' ``BitsAndBytesConfig.llm_int8_threshold`` default,
#: also what the estimator assumes (memfit.estimate.trace.quantized.INT8_THRESHOLD).
INT8_THRESHOLD = 6.0


def backend_for(fmt: str, quant_backend: str) -> str:
    """Which library quantizes ``fmt`` under ``quant_backend`` ("bitsandbytes" / "torchao")."""
    if quant_backend not in QUANT_BACKENDS:
        raise SpecError(
            f"quant_backend ({quant_backend!r}) must be one of {', '.join(QUANT_BACKENDS)}"
        )
    if quant_backend == "torchao" or (quant_backend == "auto" and fmt == "fp8"):
        if fmt in ("nf4", "nf4-dq", "fp4"):
            raise SpecError(
                f"quant ({fmt!r}) is a bitsandbytes format; use quant_backend 'auto' or "
                "'bitsandbytes'"
            )
        return "torchao"
    if fmt in BNB_FORMATS:
        return "bitsandbytes"
    if fmt in ("int4-gptq", "int4-awq"):
        kind = fmt.split("-")[1].upper()
        raise SpecError(
            f"quant ({fmt!r}): {kind} weights come from a calibrated, pre-quantized checkpoint; "
            f"load one with from_pretrained (transformers reads its quantization_config), or "
            "pass quant_backend='torchao' for int4 weight-only round-to-nearest (same storage)"
        )
    raise SpecError(f"quant ({fmt!r}) cannot be applied by quant_backend {quant_backend!r}")


def quantize_linears_(
    model: torch.nn.Module, workload: WorkloadSpec, *, quant_backend: str = "auto"
) -> tuple[str, list[str]]:
    """Quantize the model's Linear layers in place; returns (library, names quantized)."""
    fmt = workload.quant
    backend = backend_for(fmt, quant_backend)
    names = _targets(model, fmt)
    if not names:
        raise SpecError(f"quant ({fmt!r}): {type(model).__name__} has no Linear layer to quantize")
    if backend == "bitsandbytes":
        bnb = import_bitsandbytes(f"quant {fmt!r}")
        compute = COMPUTE_DTYPE[workload.run_precision]
        for name in names:
            old = model.get_submodule(name)
            model.set_submodule(name, _bnb_layer(bnb, old, fmt, compute))
        # what transformers' bitsandbytes quantizers set after loading; peft reads it to wrap
        # the layers with its bitsandbytes LoRA layers
        setattr(model, "is_loaded_in_8bit" if fmt == "int8" else "is_loaded_in_4bit", True)
        return "bitsandbytes", names
    _torchao_quantize_(model, workload, names, quant_backend)
    return "torchao", names


def _targets(model: torch.nn.Module, fmt: str) -> list[str]:
    """The Linear layers transformers would quantize; every Linear of a plain module."""
    if hasattr(model, "config") and hasattr(model, "get_input_embeddings"):
        return linears_to_quantize(model, fmt)
    return [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]


def _bnb_layer(bnb: Any, old: torch.nn.Module, fmt: str, compute: torch.dtype) -> torch.nn.Module:
    """A bitsandbytes layer holding ``old``'s weights, quantized on ``old``'s device."""
    weight: torch.Tensor = old.weight.detach()  # type: ignore[operator]
    if type(old).__name__ == "Conv1D":  # GPT-2 stores (in, out); bitsandbytes wants (out, in)
        weight = weight.t().contiguous()
    out_f, in_f = weight.shape
    has_bias = getattr(old, "bias", None) is not None
    if fmt == "int8":
        new = bnb.nn.Linear8bitLt(
            in_f,
            out_f,
            bias=has_bias,
            has_fp16_weights=False,
            threshold=INT8_THRESHOLD,
            device="meta",
        )
        new.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        new = bnb.nn.Linear4bit(
            in_f,
            out_f,
            bias=has_bias,
            compute_dtype=compute,
            compress_statistics=fmt == "nf4-dq",
            quant_type="fp4" if fmt == "fp4" else "nf4",
            device="meta",
        )
        new.weight = bnb.nn.Params4bit(
            weight,
            requires_grad=False,
            quant_type="fp4" if fmt == "fp4" else "nf4",
            compress_statistics=fmt == "nf4-dq",
            module=new,
        )
    if has_bias:
        new.bias = torch.nn.Parameter(old.bias.detach(), requires_grad=False)  # type: ignore[operator]
    new.train(old.training)
    return new.to(weight.device)  # bitsandbytes quantizes when the layer moves to a device


def _torchao_config(workload: WorkloadSpec, quant_backend: str) -> Any:
    require_package("torchao", "torchao", f"quant {workload.quant!r} with torchao")
    from torchao import quantization as q

    fmt = workload.quant
    if fmt == "int8":
        return q.Int8WeightOnlyConfig()
    if fmt == "fp8" and quant_backend == "torchao":
        return q.Float8WeightOnlyConfig()
    if fmt == "fp8":
        return q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerTensor())
    return q.Int4WeightOnlyConfig(group_size=workload.quant_group_size)


def check_quant(workload: WorkloadSpec, device: torch.device, quant_backend: str) -> str:
    """Raise when ``workload.quant`` cannot be applied on ``device``; returns the library."""
    fmt = workload.quant
    backend = backend_for(fmt, quant_backend)
    if backend == "bitsandbytes":
        import_bitsandbytes(f"quant {fmt!r}")
        return backend
    require_package("torchao", "torchao", f"quant {fmt!r} with torchao")
    if fmt == "fp8" and quant_backend == "auto":
        require_capability(
            device,
            FP8_MIN_CAPABILITY,
            "quant 'fp8' (float8 matmuls, torch._scaled_mm; or quant_backend='torchao' for "
            "fp8 weight-only storage, which runs anywhere)",
        )
    if fmt.startswith("int4") and device.type != "cuda":
        raise UnsupportedHardwareError(
            f"quant ({fmt!r}) with torchao Int4WeightOnlyConfig needs a CUDA GPU (its packed "
            f"int4 kernels); the model is on {device.type!r}: use quant 'int8' on CPU"
        )
    return backend


def _torchao_quantize_(
    model: torch.nn.Module, workload: WorkloadSpec, names: list[str], quant_backend: str
) -> None:
    check_quant(workload, device_of(model), quant_backend)
    from torchao.quantization import quantize_

    wanted = set(names)
    quantize_(
        model,
        _torchao_config(workload, quant_backend),
        filter_fn=lambda m, fqn: type(m) is torch.nn.Linear and fqn in wanted,
    )


def from_pretrained_kwargs(plan: PlanLike, *, quant_backend: str = "auto") -> dict[str, Any]:
    """Keyword arguments for ``AutoModel*.from_pretrained``: ``dtype``, ``attn_implementation``
    and, for a quantized plan, ``quantization_config``."""
    from memfit.apply.attention import HF_ATTENTION
    from memfit.apply.precision import PARAM_DTYPE
    from memfit.apply.target import resolve

    target = resolve(plan)
    w = target.workload
    out: dict[str, Any] = {
        "dtype": PARAM_DTYPE[w.run_precision],
        "attn_implementation": HF_ATTENTION[w.attention],
    }
    if w.quant == "none":
        return out
    if backend_for(w.quant, quant_backend) == "bitsandbytes":
        from transformers import BitsAndBytesConfig

        kwargs = bnb_kwargs(target.settings) or {}
        if "bnb_4bit_compute_dtype" in kwargs:
            kwargs["bnb_4bit_compute_dtype"] = getattr(torch, kwargs["bnb_4bit_compute_dtype"])
        out["quantization_config"] = BitsAndBytesConfig(**kwargs)
        return out
    from transformers import TorchAoConfig

    out["quantization_config"] = TorchAoConfig(_torchao_config(w, quant_backend))
    return out


def quantized_layers(model: torch.nn.Module) -> dict[str, str]:
    """Name → storage kind of every quantized layer (bitsandbytes class or torchao tensor)."""
    out = {}
    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls in ("Linear8bitLt", "Linear4bit") and type(m).__module__.startswith("bitsandbytes"):
            out[name] = cls
        elif type(m) is torch.nn.Linear and type(m.weight).__name__ not in ("Parameter", "Tensor"):
            out[name] = type(m.weight).__name__
    return out
