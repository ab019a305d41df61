"""Stand-ins for quantized routed experts: the tensors each format stores, the temporaries of the
forward transformers runs on CUDA (:mod:`memfit.estimate.quant_experts` has the formats and
sources).

The real modules (``Mxfp4GptOssExperts``, ``FP8Experts``, GPTQ / AWQ expert Linears) call triton /
CUDA kernels that cannot run on fake tensors. :func:`quantize_experts_` keeps the model's own
experts module (its ``_apply_gate``, activation and config) but replaces its 3-D parameters by the
stored tensors (buffers, counted as ``parameters``) and its forward by one that allocates what
the format's forward allocates, with the same shapes, dtypes and lifetimes (values are zeros):

* ``fp8`` / ``int4-gptq`` / ``int4-awq``: transformers' ``fp8_grouped_mm_experts_forward`` (the
  default ``grouped_mm`` experts implementation): sort the S = T x top-k routes, gather the
  hidden states, the up (gate/up) projection, the gate, the down projection, the routing weights,
  the inverse permutation and the per-token sum. Each projection is a :class:`_ExpertsMatmul`.
* ``mxfp4``: ``Mxfp4GptOssExperts.forward_routed``: routing metadata, ``matmul_ogs`` with the
  SwiGLU fused (an (S, I) output) and ``matmul_ogs`` with the scatter (an (S, H) scratch pad and
  the (T, H) output).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from memfit.estimate import quant_experts
from memfit.estimate.quant_experts import ExpertsShape
from memfit.estimate.trace.quantized import TORCH_DTYPE
from memfit.spec import WorkloadSpec

#: The experts module's attribute holding what memfit replaced (format, shape).
MARK = "_memfit_quantized_experts"


def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, ExpertsShape]]:
    """The routed-experts modules (3-D ``down_proj`` parameter) with their shapes."""
    out = []
    for name, module in model.named_modules():
        down = module._parameters.get("down_proj") if hasattr(module, "_parameters") else None
        if down is None or down.dim() != 3:
            continue
        has_gate = bool(getattr(module, "has_gate", True))
        transposed = bool(getattr(module, "is_transposed", False))
        e, a, b = (int(d) for d in down.shape)
        h, i = (b, a) if transposed else (a, b)
        shape = ExpertsShape(
            n_experts=e,
            hidden=h,
            intermediate=i,
            has_gate=has_gate,
            has_bias=module._parameters.get("down_proj_bias") is not None,
        )
        out.append((name, module, shape))
    return out


def quantize_experts_(
    model: torch.nn.Module, workload: WorkloadSpec, *, device: Any = "meta", gpu: Any = None
) -> int:
    """Give every routed-experts module the stored tensors and forward of ``workload.quant``;
    returns how many modules were converted."""
    fmt = workload.quant
    hopper = _is_hopper(gpu)
    found = experts_modules(model)
    _unwrap_lora_(model, {id(m) for _, m, _ in found})
    for _, module, shape in found:
        dtype = module._parameters["down_proj"].dtype  # type: ignore[union-attr]
        dtype_name = str(dtype).removeprefix("torch.")
        for pname in list(module._parameters):
            if pname.startswith(("gate_up_proj", "up_proj", "down_proj")):
                del module._parameters[pname]
        for t in quant_experts.stored_expert_tensors(
            fmt, shape, dtype=dtype_name, group_size=workload.quant_group_size, hopper=hopper
        ):
            buf = torch.zeros(t.shape, dtype=TORCH_DTYPE[t.dtype], device=device)
            module.register_buffer(t.name.replace(".", "_"), buf)
        setattr(module, MARK, (fmt, shape))
        module.forward = types.MethodType(  # type: ignore[method-assign]
            _mxfp4_forward if fmt == "mxfp4" else _grouped_forward, module
        )
    return len(found)


def _unwrap_lora_(model: torch.nn.Module, experts: set[int]) -> None:
    """peft's ``all-linear`` also wraps the experts' 3-D parameters (``ParamWrapper``); LoRA on
    quantized experts is not modelled: the wrappers give way to the experts module."""
    for name, module in list(model.named_modules()):
        base = getattr(module, "get_base_layer", None)
        if not name or not callable(base) or id(base()) not in experts:
            continue
        try:
            model.get_submodule(name)
        except AttributeError:  # inside a wrapper already removed
            continue
        model.set_submodule(name, base())


def n_quantized_expert_params(model: torch.nn.Module) -> int:
    """Logical parameter count of the converted experts (held as buffers)."""
    return sum(getattr(m, MARK)[1].numel for m in model.modules() if hasattr(m, MARK))


def _is_hopper(gpu: Any) -> bool:
    cc = getattr(gpu, "compute_capability", None)
    return cc is not None and cc[0] == 9


def _grouped_forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """``fp8_grouped_mm_experts_forward``'s allocations with :class:`_ExpertsMatmul` kernels."""
    shape: ExpertsShape = getattr(self, MARK)[1]
    k = top_k_index.size(-1)
    n_tokens, hidden = hidden_states.shape
    sample_weights = top_k_weights.reshape(-1)
    expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))
    x_g = hidden_states[perm // k]
    weights_g = sample_weights[perm]
    # locals live until the function returns, as in transformers; ``proj_out`` is rebound
    hist_in = expert_ids_g.int()  # CUDA's histc takes int input
    tokens_per_expert = torch.zeros(shape.n_experts, dtype=torch.int32, device=x_g.device)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    proj_out = _ExpertsMatmul.apply(x_g, self, "up")
    if shape.has_bias:
        bias = self._buffers["gate_up_proj_bias" if shape.has_gate else "up_proj_bias"]
        proj_out.add_(bias[expert_ids_g])
    proj_out = self._apply_gate(proj_out) if shape.has_gate else self.act_fn(proj_out)
    proj_out = _ExpertsMatmul.apply(proj_out, self, "down")
    if shape.has_bias:
        proj_out.add_(self._buffers["down_proj_bias"][expert_ids_g])
    weighted = proj_out * weights_g.to(proj_out.dtype).unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=perm.device)
    weighted = weighted[inv_perm]
    out = weighted.view(n_tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)
    del hist_in, offsets
    return out


class _ExpertsMatmul(torch.autograd.Function):
    """One grouped projection over the S routed rows: ``up`` (H → up_out) or ``down``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: Any, proj: str) -> torch.Tensor:
        fmt, shape = getattr(module, MARK)
        n, k = (shape.up_out, shape.hidden) if proj == "up" else (shape.hidden, shape.intermediate)
        ctx.module, ctx.nk, ctx.proj = module, (n, k), proj
        rows = x.shape[0]
        if fmt == "fp8":  # finegrained-fp8 grouped kernel: activations quantized inside
            return x.new_zeros((rows, n))
        x16 = x.half() if x.dtype != torch.float16 else x
        if quant_experts.gptq_dequantizes(fmt, rows, shape.n_experts, k):
            # one expert's Linear dequantized (gate and up are separate Linears)
            n_one = shape.intermediate if proj == "up" else n
            weight = torch.zeros((k, n_one), dtype=torch.float16, device=x.device)
            del weight
        out16 = torch.zeros((rows, n), dtype=torch.float16, device=x.device)
        del x16
        return out16.to(x.dtype) if x.dtype != torch.float16 else out16

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        fmt, shape = getattr(ctx.module, MARK)
        n, k = ctx.nk
        if fmt == "fp8":  # FP8GroupedMatmulFunction.backward: a chunk of experts dequantized
            grad = grad.contiguous()
            e = quant_experts.fp8_backward_experts(shape, n, k, grad.element_size())
            bn, bk = quant_experts.FP8_BLOCK
            scale = torch.zeros((e, -(-n // bn), -(-k // bk)), dtype=grad.dtype, device=grad.device)
            expanded = scale.repeat_interleave(bn, dim=-2)
            weight = torch.zeros((e, n, k), dtype=grad.dtype, device=grad.device)
            del scale, expanded
            grad_in = torch.zeros((grad.shape[0], k), dtype=grad.dtype, device=grad.device)
            del weight
            return grad_in, None, None
        n_one = shape.intermediate if ctx.proj == "up" else n
        weight = torch.zeros((k, n_one), dtype=torch.float16, device=grad.device)
        cast = weight.t().to(grad.dtype)
        del weight, cast
        return torch.zeros((grad.shape[0], k), dtype=grad.dtype, device=grad.device), None, None


def _mxfp4_forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """``Mxfp4GptOssExperts.forward_routed`` (triton ``matmul_ogs``, triton_kernels
    ``init_allocation``): the gate/up output with the SwiGLU fused; the scattered down projection
    writes an (S, H) scratch pad, then reduces it into the (T, H) output."""
    shape: ExpertsShape = getattr(self, MARK)[1]
    n_tokens, hidden = hidden_states.shape
    rows = n_tokens * top_k_index.size(-1)
    dev, dt = hidden_states.device, hidden_states.dtype
    index = [
        torch.zeros(rows, dtype=torch.int32, device=dev)
        for _ in range(quant_experts.MXFP4_ROUTING_INT32_PER_ROW)
    ]
    gate_scal = torch.zeros(rows, dtype=dt, device=dev)
    hist = torch.zeros(shape.n_experts, dtype=torch.int32, device=dev)
    cache1 = torch.zeros((rows, shape.intermediate), dtype=dt, device=dev)
    scratch = torch.zeros((rows, hidden), dtype=dt, device=dev)
    out = torch.zeros((n_tokens, hidden), dtype=dt, device=dev)
    del scratch, cache1, index, gate_scal, hist
    return out


__all__ = ["experts_modules", "n_quantized_expert_params", "quantize_experts_"]
