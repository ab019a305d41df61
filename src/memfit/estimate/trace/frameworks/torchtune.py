"""A torchtune recipe traced through torchtune's own code: its model builder, and the step of
``recipes/full_finetune_single_device.py`` / ``lora_finetune_single_device.py`` (torchtune 0.6.1).

What runs, as the recipe runs it:

* the model from ``model._component_`` (only builders under ``torchtune.models.`` are imported:
  a recipe file is data, not code), built in the recipe's ``dtype`` (``bf16``: pure bf16, no fp32
  master weights) on ``meta``; LoRA builders with ``set_trainable_params(model,
  get_adapter_params(model))``; ``qlora_*`` builders quantize the layers torchtune quantizes
  (its ``FrozenNF4Linear`` and the NF4 bases of ``LoRALinear``), replaced by memfit's NF4
  stand-ins (torchao's ``NF4Tensor`` cannot become a fake tensor): the stored bytes of blocks of
  64 with double-quantized scales, and the bf16 weight ``linear_nf4`` dequantizes per call;
* ``enable_activation_checkpointing``: ``training.set_activation_checkpointing(model,
  auto_wrap_policy={TransformerSelfAttentionLayer})`` (torch's non-reentrant checkpoint wrapper);
* ``loss: CEWithChunkedOutputLoss``: ``model.set_num_output_chunks(8)``, the logits as chunks,
  each upcast to fp32 inside the loss;
* ``enable_activation_offloading``: torchtune's ``OffloadActivations`` moves every saved tensor of
  1 KiB or more that is not a parameter to pinned host memory and brings it back in backward; its
  CUDA streams cannot run here, so memfit's hooks do the same with its stash of the last 5
  tensors still on the device, and the output head excluded (``get_act_offloading_ctx_manager``);
* ``optimizer_in_bwd``: one optimizer per parameter stepped in its post-accumulate-grad hook
  (``training.register_optim_in_bwd_hooks``), so at most one gradient is alive;
* the step: forward (labels shifted with the ignore index), ``loss.backward()``, with
  ``gradient_accumulation_steps > 1`` a second micro-batch before ``optimizer.step()`` and
  ``zero_grad(set_to_none=True)``.

``compile: True`` is not modelled (the trace is eager; compiled runs need less): a note says so.

torchtune 0.6.1 imports two torchao names that torchao 0.18 moved or removed
(``torchao.dtypes.nf4tensor``, and ``TensorCoreTiledLayout`` in its quantizers, which memfit does
not use): :func:`import_torchtune` aliases the first and stands in for
``torchtune.training.quantization``.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections import deque
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

import torch

from memfit.errors import SpecError
from memfit.estimate.trace.frameworks import finish
from memfit.estimate.trace.quantized import QuantizedLinear
from memfit.estimate.trace.steps import InBackward, make_optimizer
from memfit.estimate.trace.user_step import trace_step

#: torchtune's ``OffloadActivations`` defaults (training/_activation_offloading.py).
OFFLOAD_MIN_BYTES = 1024
OFFLOAD_STASH = 5
#: ``CEWithChunkedOutputLoss(num_output_chunks=8)`` and torchtune's ignore index.
IGNORE_INDEX = -100
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def import_torchtune() -> Any:
    """``torchtune`` importable next to torchao 0.18 (see the module docstring)."""
    if "torchao.dtypes.nf4tensor" not in sys.modules:
        try:
            importlib.import_module("torchao.dtypes.nf4tensor")
        except ImportError:
            moved = importlib.import_module(
                "torchao.quantization.quantize_.workflows.nf4.nf4_tensor"
            )
            sys.modules["torchao.dtypes.nf4tensor"] = moved
            setattr(importlib.import_module("torchao.dtypes"), "nf4tensor", moved)  # noqa: B010
    name = "torchtune.training.quantization"
    if name not in sys.modules:
        try:
            importlib.import_module(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.__doc__ = "memfit: torchtune's quantizers do not import with this torchao"
            stub.get_quantizer_mode = lambda quantizer: None  # type: ignore[attr-defined]
            sys.modules[name] = stub
    return importlib.import_module("torchtune")


def build_model(data: dict[str, Any]) -> torch.nn.Module:
    """The recipe's model on ``meta``, in the recipe's dtype, trainable as the recipe sets it."""
    import_torchtune()
    cfg = dict(data.get("model") or {})
    component = str(cfg.pop("_component_", ""))
    if not component.startswith("torchtune.models."):
        raise SpecError(
            f"model._component_ ({component!r}) must be a torchtune model builder "
            "(torchtune.models.<family>.<builder>): memfit imports nothing else from a recipe"
        )
    module_name, _, attr = component.rpartition(".")
    try:
        builder = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"model._component_ ({component!r}): not in torchtune: {exc}") from None
    dtype = DTYPES.get(str(data.get("dtype", "bf16")))
    if dtype is None:
        raise SpecError(f"dtype ({data.get('dtype')!r}) must be bf16, fp16 or fp32")
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = builder(**cfg)
    except TypeError as exc:
        raise SpecError(f"model ({component}): {exc}") from None
    finally:
        torch.set_default_dtype(old)
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    adapters = get_adapter_params(model)
    if adapters:
        set_trainable_params(model, adapters)
    n_quantized = _nf4_stand_ins_(model, dtype)
    _rope_init_(model)
    if _on(data, "enable_activation_checkpointing"):
        from torchtune import modules, training

        training.set_activation_checkpointing(
            model, auto_wrap_policy={modules.TransformerSelfAttentionLayer}
        )
    model._memfit_nf4_layers = n_quantized  # type: ignore[assignment]
    return model


def _nf4_stand_ins_(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Replace each NF4 weight torchtune made by memfit's ``nf4-dq`` stand-in."""
    from torchao.dtypes.nf4tensor import NF4Tensor

    n = 0
    for name, module in list(model.named_modules()):
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if not isinstance(weight, NF4Tensor):
            continue
        out_f, in_f = weight.shape
        stand_in = QuantizedLinear(
            "nf4-dq", in_f, out_f, bias=False, dtype=dtype, compute_dtype=dtype
        )
        n += 1
        if type(module).__name__ == "FrozenNF4Linear":
            model.set_submodule(name, stand_in)
            continue
        del module._parameters["weight"]  # a LoRALinear: its base becomes the stand-in
        module.add_module("_memfit_nf4_base", stand_in)
        module.forward = types.MethodType(_lora_nf4_forward, module)
    return n


def _lora_nf4_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """torchtune ``LoRALinear.forward`` with ``_quantize_base``: ``linear_nf4`` + the adapter."""
    out = self._memfit_nf4_base(x)
    if self.disabled:
        return out
    lora_out = self.lora_b(self.lora_a(self.dropout(x)))
    return out + (self.alpha / self.rank) * lora_out


def _on(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    return value is True or str(value).lower() in ("true", "1", "yes")


class _Offload:
    """torchtune ``OffloadActivations`` as its device memory sees it: a saved tensor of at least
    1 KiB that is not a parameter leaves the device (its 5 most recent stay, the stream stash),
    and a new device copy is made when backward unpacks it."""

    def __init__(self) -> None:
        self.stash: deque[torch.Tensor] = deque(maxlen=OFFLOAD_STASH)
        self.paused = 0

    def pack(self, t: torch.Tensor) -> Any:
        nbytes = t.element_size() * t.nelement()
        if self.paused or nbytes < OFFLOAD_MIN_BYTES or isinstance(t, torch.nn.Parameter):
            return t
        self.stash.append(t)
        return ("offloaded", tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    def unpack(self, packed: Any) -> torch.Tensor:
        self.stash.clear()  # backward has begun: the stream stash was synchronised and dropped
        if isinstance(packed, torch.Tensor):
            return packed
        _, shape, stride, dtype, device = packed
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)

    def context(self, model: torch.nn.Module) -> AbstractContextManager[Any]:
        head = getattr(model, "output", None)
        head = getattr(head, "linear", head)  # TiedLinear wraps no module: hook the model's end
        if isinstance(head, torch.nn.Module):
            head.register_forward_pre_hook(lambda *a: self._pause(1))
            head.register_forward_hook(lambda *a: self._pause(-1), always_call=True)
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def _pause(self, delta: int) -> None:
        self.paused += delta


def _loss_fn(data: dict[str, Any], model: torch.nn.Module) -> tuple[Any, bool]:
    component = str((data.get("loss") or {}).get("_component_", ""))
    if "CEWithChunkedOutputLoss" in component:
        from torchtune.modules.loss import CEWithChunkedOutputLoss

        loss = CEWithChunkedOutputLoss()
        model.set_num_output_chunks(loss.num_output_chunks)  # type: ignore[operator]
        return loss, True
    return torch.nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX), False


def trace_torchtune(data: dict[str, Any], workload: Any, *, gpu: Any = None) -> Any:
    """Estimate the recipe ``data`` (overrides applied) with ``workload``'s batch and length."""
    model = build_model(data)
    loss_fn, chunked = _loss_fn(data, model)
    b, s = workload.batch_size, workload.seq_len
    in_bwd = _on(data, "optimizer_in_bwd")
    micro_batches = 2 if workload.grad_accum > 1 and not in_bwd else 1
    offload = _Offload() if _on(data, "enable_activation_offloading") else None
    ctx = offload.context(model) if offload is not None else None
    name = workload.optimizer or "adamw"

    def optimizer(params: list[torch.nn.Parameter]) -> Any:
        return InBackward(params, name) if in_bwd else make_optimizer(params, name)

    def inputs() -> dict[str, torch.Tensor]:
        return {
            "tokens": torch.zeros(b, s, dtype=torch.long),
            "labels": torch.zeros(b, s, dtype=torch.long),
            "ignore": torch.full((b, 1), IGNORE_INDEX, dtype=torch.long),
        }

    def step(m: torch.nn.Module, opt: Any, batch: dict[str, torch.Tensor]) -> None:
        for _ in range(micro_batches):
            with ExitStack() as stack:
                stack.enter_context(ctx if ctx is not None else nullcontext())
                logits = m(batch["tokens"])
            labels = torch.hstack((batch["labels"][..., 1:], batch["ignore"]))
            if not isinstance(logits, list):
                labels = labels.reshape(-1)
                logits = logits.reshape(-1, logits.size(-1))
            loss = loss_fn(logits, labels)
            del logits
            loss.backward()
        if opt is not None and not in_bwd:
            opt.step()
            opt.zero_grad(set_to_none=True)

    est = trace_step(
        step, model=model, optimizer=optimizer, inputs=inputs, gpu=gpu, name=name_of(data)
    )
    notes = [
        f"traced through torchtune's {name_of(data)} and its recipe step"
        + (", chunked cross-entropy" if chunked else "")
        + (", activation offloading (emulated hooks)" if offload is not None else "")
        + (", optimizer in backward" if in_bwd else "")
        + (f", {model._memfit_nf4_layers} NF4 layers" if model._memfit_nf4_layers else "")
    ]
    if _on(data, "compile"):
        notes.append("compile: True is not modelled: the trace is eager (compiled runs need less)")
    return finish(est, workload, "torchtune", notes)


def _rope_init_(model: torch.nn.Module) -> None:
    """Build the RoPE caches a meta-built model skipped (the recipes' ``rope_init()`` after
    ``to_empty``) on the host: Llama 3.1's frequency scaling is a Python loop over values, which
    fake tensors cannot run. The trace makes the cache (``max_seq_len`` rows, one per model: the
    builders share one RoPE module) a device buffer like the rest."""
    for module in model.modules():
        if hasattr(module, "rope_init") and not getattr(module, "is_cache_built", True):
            with torch.device("cpu"):
                module.rope_init()  # type: ignore[operator]


def name_of(data: dict[str, Any]) -> str:
    return str((data.get("model") or {}).get("_component_", "torchtune model")).rsplit(".", 1)[-1]
