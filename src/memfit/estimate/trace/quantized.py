"""Stand-ins for quantized Linear layers: the tensors the libraries store, the temporaries their
CUDA kernels allocate.

The real layers (bitsandbytes ``Linear4bit`` / ``Linear8bitLt``, GPTQ and AWQ ``QuantLinear``, FP8
linears) call CUDA kernels that cannot run on fake tensors, and a dispatch-level tracker cannot see
what a kernel allocates inside itself. :class:`QuantizedLinear` holds exactly the stored tensors of
:func:`memfit.estimate.quant.stored_tensors` as buffers (so they are counted as ``parameters``)
and, in forward and backward, allocates the tensors the library's CUDA path allocates, with the
same shapes, dtypes and lifetimes. The values are zeros: only memory is being modelled.

Per format (M = tokens in the call, N × K the weight; docs/quantization.md has the sources):

* ``nf4`` / ``nf4-dq`` / ``fp4`` — bitsandbytes 0.50 ``Linear4bit``: the input is cast to the
  compute dtype; ``gemm_4bit`` runs the fused kernel (output only) for M ≤ 4, otherwise
  dequantizes: nested statistics to an fp32 absmax (two fp32 block vectors), the weight to an
  (N, K) compute-dtype tensor, then ``F.linear``. Backward (``MatMul4Bit``) dequantizes again
  (fp32 absmax, (N, K) in the stored dtype, cast to the gradient's dtype) for the grad-input
  matmul; nothing is saved from forward but the packed weight.
* ``int8`` — ``Linear8bitLt`` with ``threshold=6.0`` (transformers' default) on CUDA
  (``MatMul8bitLt``): input cast to fp16, row-wise int8 quantization (int8 copy, fp32 row stats, the
  fp16 ``abs()`` and the bool outlier mask), int32 GEMM output, fp16 dequantized output, cast to the
  input dtype. Outlier columns are data dependent; memfit assumes none. Saves the input for
  backward, which rebuilds ``CB.to(dtype) * SCB / 127`` (N, K) for the grad-input matmul.
* ``int4-awq`` — AutoAWQ ``WQLinearMMFunction``: input cast to fp16 (saved for backward), fused
  GEMM below 1024 tokens else an (K, N) fp16 dequantized weight and ``matmul``; bias added out of
  place; output cast back. Backward dequantizes (K, N) and repeats it per batch row for ``bmm``.
* ``int4-gptq`` — fp16 GEMM as exllama v2 runs it: fused up to 50 rows, an (K, N) fp16 weight above
  (exllama v2 keeps that scratch for the largest layer persistently; memfit frees it per call);
  backward dequantizes (K, N) fp16.
* ``fp8`` — per-tensor W8A8 through ``torch._scaled_mm`` (torchao / transformer-engine style): the
  input's ``abs()`` for its amax, the scaled and clamped copy, its float8 copy, the output.
  Backward dequantizes the weight to the compute dtype.

LoRA: peft wraps the quantized base layer with format-specific forwards (peft/tuners/lora/bnb.py,
awq.py, gptq.py): :func:`quantize_` patches the wrappers so the trace runs the same code.

FSDP / ZeRO-3 (``shard`` ``fsdp`` / ``zero3``): FSDP-QLoRA stores bitsandbytes' packed 4-bit
weight in a float ``quant_storage`` dtype so that FSDP can shard it ("FSDP only supports sharding
float data types", bitsandbytes docs ``fsdp_qlora.md`` at 0.50.2; bitsandbytes PR #970); Answer.AI's
``train.py`` (AnswerDotAI/fsdp_qlora@05ed9f2a, line 532: "The Linear4Bit quant_storage dtype
should always match the FSDP param_dtype") and peft's docs (huggingface/peft@5d602fdb
``docs/source/accelerate/fsdp.md`` and ``deepspeed.md``, "Use PEFT QLoRA and FSDP / DeepSpeed
with ZeRO3": ``bnb_4bit_quant_storage=torch.bfloat16``) run it so. The packed weight is then a
``Params4bit`` *parameter* of dtype bf16, (numel + 1) // 4 elements (bitsandbytes
``quantize_4bit``: ``(n + 1) // (2 * itemsize)`` rows), that FSDP shards and all-gathers with its
block and ZeRO-3 partitions and gathers per module; the quant state (absmax, code, nested
statistics) is metadata every rank keeps whole. :func:`packs_as_parameter` says when; the stand-in
then holds ``weight`` as a frozen bf16 parameter (the rest stay buffers). bf16 whatever the run's
precision: the bytes of a shard and of the gathered block are the packed bytes either way, and a
bf16 storage is the one FSDP2's ``param_dtype=bf16`` cast leaves alone. 8-bit
(``Linear8bitLt``): ``Int8Params`` has no ``quant_storage`` (int8 only), so no FSDP-QLoRA recipe
shards it: memfit keeps it whole on every rank and says so (:func:`notes`).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

from memfit.estimate import quant
from memfit.spec import PRECISION_RULES, WorkloadSpec

TORCH_DTYPE = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "float32": torch.float32,
}
#: Compute dtype of the quantized matmuls per precision (``bnb_4bit_compute_dtype`` = the
#: workload's compute dtype).
COMPUTE_DTYPE = {name: getattr(torch, r.compute) for name, r in PRECISION_RULES.items()}
#: LLM.int8 outlier threshold (transformers ``BitsAndBytesConfig.llm_int8_threshold`` default).
INT8_THRESHOLD = 6.0
#: Largest finite float8_e4m3fn value: the per-tensor scale maps the amax onto it.
FP8_E4M3_MAX = 448.0
#: bitsandbytes 4-bit formats whose packed weight FSDP / ZeRO-3 shard (module docstring).
BNB_4BIT = quant.BNB_4BIT_FORMATS
#: ``bnb_4bit_quant_storage`` of FSDP-QLoRA (Answer.AI train.py, peft's FSDP / ZeRO-3 QLoRA docs).
QUANT_STORAGE_DTYPE = torch.bfloat16


def packs_as_parameter(workload: WorkloadSpec) -> bool:
    """Whether ``workload``'s quantized weights are packed ``Params4bit`` parameters in a bf16
    ``quant_storage`` (FSDP-QLoRA), which FSDP / ZeRO-3 shard, rather than rank-local buffers."""
    return quant.packs_as_parameter(workload.quant, workload.shard)


def notes(workload: WorkloadSpec) -> list[str]:
    """What the trace assumes about quantized weights under a sharded setup."""
    if packs_as_parameter(workload):
        return [
            "FSDP-QLoRA: the packed 4-bit weights are bf16 quant_storage parameters "
            f"(bnb_4bit_quant_storage=bfloat16), sharded by {workload.shard} and gathered "
            "with their block; the quant state (absmax, code) is kept whole on every rank"
        ]
    if workload.quant == "int8" and workload.shard in quant.PARAMETER_SHARDING:
        return [
            f"int8 weights under {workload.shard}: bitsandbytes' Int8Params have no float "
            "quant_storage, so FSDP / ZeRO-3 do not shard them; counted whole on every rank"
        ]
    return []


class QuantizedLinear(torch.nn.Module):
    """A frozen quantized Linear (or GPT-2 Conv1D): stored tensors as buffers, CUDA temporaries."""

    def __init__(
        self,
        fmt: str,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        dtype: torch.dtype,
        compute_dtype: torch.dtype,
        group_size: int = 128,
        device: Any = "meta",
        state_dtype: torch.dtype | None = None,
        packed_param: bool = False,
    ) -> None:
        super().__init__()
        self.fmt = fmt
        #: bitsandbytes 4-bit: the dtype ``QuantState.dtype`` records (the weight's dtype when it
        #: was quantized), which ``dequantize_4bit`` returns before the matmul's ``.to(A.dtype)``;
        #: None: the layer's compute dtype in forward, ``dtype`` in backward
        self.state_dtype = state_dtype
        self.in_features = in_features
        self.out_features = out_features
        self.dtype = dtype
        self.compute_dtype = compute_dtype
        dtype_name = str(dtype).removeprefix("torch.")
        #: the packed weight is a frozen bf16 parameter (FSDP-QLoRA; module docstring)
        self.packed_param = packed_param and fmt in BNB_4BIT
        for t in quant.stored_tensors(
            fmt, out_features, in_features, group_size=group_size, bias=bias, dtype=dtype_name
        ):
            if self.packed_param and t.name == "weight":
                self.weight = torch.nn.Parameter(
                    torch.zeros(
                        _packed_shape(in_features * out_features),
                        dtype=QUANT_STORAGE_DTYPE,
                        device=device,
                    ),
                    requires_grad=False,
                )
                continue
            buf = torch.zeros(t.shape, dtype=TORCH_DTYPE[t.dtype], device=device)
            self.register_buffer(t.name, buf)
        if not bias:
            self.bias = None

    def extra_repr(self) -> str:
        return f"{self.fmt}, in_features={self.in_features}, out_features={self.out_features}"

    def stored(self, name: str) -> torch.Tensor:
        """One of the stored tensors (a buffer, or the packed parameter) by its library name."""
        t = self._buffers.get(name, self._parameters.get(name))
        if t is None:
            raise KeyError(name)
        return t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fn = _FUNCTIONS[self.fmt]
        return fn(self, x)


def _packed_shape(numel: int) -> tuple[int, int]:
    """bitsandbytes ``quantize_4bit``'s packed shape in ``quant_storage``: ``((n + 1) // mod, 1)``
    with ``mod = 2 * itemsize`` (two 4-bit values per byte)."""
    itemsize = torch.finfo(QUANT_STORAGE_DTYPE).bits // 8
    return ((numel + 1) // (2 * itemsize), 1)


def _bnb4_forward(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    inp_dtype = x.dtype
    x = x.to(layer.compute_dtype)
    bias = layer.bias.to(layer.compute_dtype) if layer.bias is not None else None
    return _Bnb4Matmul.apply(x, layer, bias).to(inp_dtype)


class _Bnb4Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: QuantizedLinear, bias: Any) -> torch.Tensor:
        ctx.layer = layer
        tokens = x.numel() // x.shape[-1]
        if not quant.uses_dequantized_weight(layer.fmt, tokens, layer.in_features):
            return x.new_zeros((*x.shape[:-1], layer.out_features))  # fused gemm_4bit kernel
        if layer.fmt == "nf4-dq":
            n_blocks = layer.stored("absmax").numel()
            absmax_dq = torch.zeros(n_blocks, dtype=torch.float32, device=x.device)
            absmax = absmax_dq + layer.stored("offset")
        shape = (layer.out_features, layer.in_features)
        if layer.state_dtype is None:
            weight = torch.zeros(shape, dtype=x.dtype, device=x.device)
        else:  # dequantize_4bit(B, state).to(A.dtype): both copies exist at the cast
            weight = torch.zeros(shape, dtype=layer.state_dtype, device=x.device).to(x.dtype)
        out = F.linear(x, weight, bias)
        if layer.fmt == "nf4-dq":
            del absmax_dq, absmax
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        layer: QuantizedLinear = ctx.layer
        if layer.fmt == "nf4-dq":
            n_blocks = layer.stored("absmax").numel()
            absmax = torch.zeros(n_blocks, dtype=torch.float32, device=grad.device)
            absmax += layer.stored("offset")
        weight = torch.zeros(
            (layer.out_features, layer.in_features),
            dtype=layer.dtype if layer.state_dtype is None else layer.state_dtype,
            device=grad.device,
        )
        if layer.fmt == "nf4-dq":
            del absmax
        return torch.matmul(grad, weight.to(grad.dtype)), None, None


def _int8_forward(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    bias = layer.bias
    if bias is not None and bias.dtype != x.dtype:  # Linear8bitLt casts its bias once, in place
        layer.bias = bias.to(x.dtype)
        bias = layer.bias
    return _Int8Matmul.apply(x, layer, bias)


class _Int8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: QuantizedLinear, bias: Any) -> torch.Tensor:
        ctx.layer = layer
        shape = x.shape
        a = x.reshape(-1, shape[-1])
        ca, sca = _int8_vectorwise_quant(a.to(torch.float16))
        # int8_mixed_scaled_mm with no outlier columns: an empty subA, the int32 GEMM, its fp16
        # dequantization (bias fused when fp16, else added in place), the cast to the input dtype.
        sub_a = torch.empty(0, dtype=a.dtype, device=a.device)
        out_i32 = torch.zeros((a.shape[0], layer.out_features), dtype=torch.int32, device=a.device)
        out16 = torch.zeros(out_i32.shape, dtype=torch.float16, device=a.device)
        if bias is not None and bias.dtype != torch.float16:
            out16.add_(bias)
        del out_i32
        out = out16.to(a.dtype)
        del out16, ca, sca
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(sub_a, a)
        ctx.grad_shape = shape
        ctx.dtype_a = a.dtype
        return out.reshape(*shape[:-1], layer.out_features)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        layer: QuantizedLinear = ctx.layer
        grad = grad.reshape(-1, grad.shape[-1]).contiguous()
        scale = layer.stored("SCB").unsqueeze(1).mul(1.0 / 127.0)
        cb = layer.stored("weight").to(ctx.dtype_a, copy=True).mul_(scale)
        grad_a = torch.matmul(grad.to(ctx.dtype_a), cb).view(ctx.grad_shape)
        return grad_a, None, None


def _int8_vectorwise_quant(a16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bitsandbytes' CUDA ``int8_vectorwise_quant`` with a threshold: row stats, the int8 rows,
    the outlier mask from ``abs() >= threshold`` (and ``any()``), no outlier columns found."""
    rows = a16.numel() // a16.shape[-1]
    row_stats = torch.zeros(rows, dtype=torch.float32, device=a16.device)
    out_row = torch.zeros(a16.shape, dtype=torch.int8, device=a16.device)
    outliers = a16.abs() >= INT8_THRESHOLD
    outliers.any()
    del outliers
    return out_row, row_stats


def _awq_forward(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    inp_dtype = x.dtype
    out_shape = (*x.shape[:-1], layer.out_features)
    x16 = x.half() if inp_dtype != torch.float16 else x
    if layer.training:  # WQLinear_GEMM: the autograd path only in training mode
        out = _AwqMatmul.apply(x16, layer)
    else:
        with torch.no_grad():
            out = _AwqMatmul.apply(x16, layer)
    if inp_dtype != torch.float16:
        out = out.to(dtype=inp_dtype)
    return out.reshape(out_shape)


class _AwqMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: QuantizedLinear) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.layer = layer
        tokens = x.numel() // x.shape[-1]
        if quant.uses_dequantized_weight("int4-awq", tokens, layer.in_features):
            weight = torch.zeros(
                (layer.in_features, layer.out_features), dtype=torch.float16, device=x.device
            )
            out = torch.matmul(x, weight)
            del weight
        else:
            out = torch.zeros((tokens, layer.out_features), dtype=torch.float16, device=x.device)
        out = out + layer.bias if layer.bias is not None else out
        out = out.reshape(*x.shape[:-1], layer.out_features)
        return out.unsqueeze(0) if out.dim() == 2 else out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
        layer: QuantizedLinear = ctx.layer
        weight = torch.zeros(
            (layer.in_features, layer.out_features), dtype=torch.float16, device=grad.device
        ).to(grad.dtype)
        grad_input = None
        if ctx.needs_input_grad[0]:
            repeated = weight.transpose(0, 1).unsqueeze(0).repeat(grad.shape[0], 1, 1)
            grad_input = grad.bmm(repeated)
        return grad_input, None


def _gptq_forward(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    inp_dtype = x.dtype
    x16 = x.half() if inp_dtype != torch.float16 else x
    out = _GptqMatmul.apply(x16, layer)
    return out.to(inp_dtype) if inp_dtype != torch.float16 else out


class _GptqMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: QuantizedLinear) -> torch.Tensor:
        ctx.layer = layer
        a = x.reshape(-1, x.shape[-1])
        if quant.uses_dequantized_weight("int4-gptq", a.shape[0], layer.in_features):
            weight = torch.zeros(
                (layer.in_features, layer.out_features), dtype=torch.float16, device=x.device
            )
            out = torch.matmul(a, weight)
            del weight
        else:
            out = torch.zeros(
                (a.shape[0], layer.out_features), dtype=torch.float16, device=x.device
            )
        if layer.bias is not None:
            out.add_(layer.bias)
        return out.reshape(*x.shape[:-1], layer.out_features)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
        layer: QuantizedLinear = ctx.layer
        weight = torch.zeros(
            (layer.in_features, layer.out_features), dtype=torch.float16, device=grad.device
        )
        return torch.matmul(grad, weight.t().to(grad.dtype)), None


def _fp8_forward(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    inp_dtype = x.dtype
    x = x.to(layer.compute_dtype)
    return _Fp8Matmul.apply(x, layer).to(inp_dtype)


class _Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: QuantizedLinear) -> torch.Tensor:
        ctx.layer = layer
        amax = x.abs().amax().to(torch.float32)
        scale = FP8_E4M3_MAX / amax.clamp(min=1e-12)
        x_fp8 = (x * scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
        out = torch.zeros((*x.shape[:-1], layer.out_features), dtype=x.dtype, device=x.device)
        del x_fp8, amax, scale
        if layer.bias is not None:
            out.add_(layer.bias)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
        layer: QuantizedLinear = ctx.layer
        weight = torch.zeros(
            (layer.out_features, layer.in_features), dtype=grad.dtype, device=grad.device
        )
        return torch.matmul(grad, weight), None


_FUNCTIONS = {
    "nf4": _bnb4_forward,
    "nf4-dq": _bnb4_forward,
    "fp4": _bnb4_forward,
    "int8": _int8_forward,
    "int4-awq": _awq_forward,
    "int4-gptq": _gptq_forward,
    "fp8": _fp8_forward,
}


# ----------------------------------------------------------------------------- model surgery
def linears_to_quantize(model: torch.nn.Module, fmt: str) -> list[str]:
    """Names of the Linear (and GPT-2 Conv1D) modules the library would quantize, by its default
    kept-out rule (:data:`memfit.estimate.quant.KEPT_OUT`). Call on the model before peft wraps it.
    """
    rule = quant.KEPT_OUT[fmt]
    skip = _default_skips(model) if rule.skip_output_embeddings else []
    blocks = [n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and n]
    out = []
    for name, module in model.named_modules():
        if not _is_linear(module) or not _should_convert(name, skip):
            continue
        if rule.only_repeated_blocks and not any(name.startswith(b + ".") for b in blocks):
            continue
        out.append(name)
    return out


#: Formats whose models peft's ``prepare_model_for_kbit_training`` leaves uncast (its
#: ``is_gptq_quantized`` / ``is_torchao_quantized`` checks).
PREPARE_KBIT_SKIPS = ("int4-gptq", "fp8")


def prepare_kbit_(model: torch.nn.Module, fmt: str) -> int:
    """The casts of peft's ``prepare_model_for_kbit_training`` (peft/utils/other.py): every
    fp16/bf16 parameter that is not a bitsandbytes ``Params4bit`` becomes fp32 (quantized weights
    are buffers of the stand-ins, or int8). Its other steps change no memory here: it freezes
    every parameter (memfit adds the LoRA adapters afterwards in the same order of effect) and
    enables input gradients only for reentrant checkpointing. Returns the parameters cast."""
    if fmt in PREPARE_KBIT_SKIPS:
        return 0
    packed = {
        id(m.weight) for m in model.modules() if isinstance(m, QuantizedLinear) and m.packed_param
    }
    n = 0
    for param in model.parameters():
        if id(param) in packed:  # the stand-in's Params4bit (FSDP-QLoRA's bf16 quant_storage)
            continue
        if param.dtype in (torch.float16, torch.bfloat16) and type(param).__name__ != "Params4bit":
            param.data = param.data.to(torch.float32)
            n += 1
    return n


def _is_linear(module: torch.nn.Module) -> bool:
    if type(module) is torch.nn.Linear:
        return True
    return type(module).__name__ == "Conv1D" and module.__class__.__module__.startswith(
        "transformers"
    )


def _default_skips(model: torch.nn.Module) -> list[str]:
    """transformers' ``get_modules_to_not_convert(model, None, model._keep_in_fp32_modules)``."""
    from transformers.quantizers.base import get_keys_to_not_convert

    skip = list(get_keys_to_not_convert(model))
    skip += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return skip


def _should_convert(name: str, patterns: list[str]) -> bool:
    from transformers.quantizers.quantizers_utils import should_convert_module

    return bool(should_convert_module(name, patterns))


def quantize_(
    model: torch.nn.Module, names: list[str], workload: WorkloadSpec, *, device: Any = "meta"
) -> torch.nn.Module:
    """Replace the modules ``names`` (found before peft wrapped the model) by stand-ins; where peft
    wrapped one in a LoRA layer, replace its ``base_layer`` and give the wrapper the forward of
    peft's layer for that format."""
    fmt = workload.quant
    compute = COMPUTE_DTYPE[workload.run_precision]
    by_suffix = {n: m for n, m in model.named_modules()}
    for name in names:
        path = _current_path(by_suffix, name)
        module = by_suffix[path]
        wrapper = None
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            wrapper, path, module = module, path + ".base_layer", module.base_layer
        in_f, out_f = _features(module)
        weight = module.weight
        stand_in = QuantizedLinear(
            fmt,
            in_f,
            out_f,
            bias=getattr(module, "bias", None) is not None,
            dtype=weight.dtype,
            compute_dtype=compute,
            group_size=workload.quant_group_size,
            device=device,
            packed_param=packs_as_parameter(workload),
        )
        stand_in.train(module.training)
        model.set_submodule(path, stand_in)
        if wrapper is not None and fmt in _LORA_FORWARDS:
            wrapper.forward = types.MethodType(_LORA_FORWARDS[fmt], wrapper)
    return model


def _current_path(modules: dict[str, torch.nn.Module], name: str) -> str:
    """peft prefixes names (``base_model.model.``): find the module registered under ``name``."""
    if name in modules:
        return name
    matches = [n for n in modules if n.endswith("." + name)]
    return min(matches, key=len)


def _features(module: torch.nn.Module) -> tuple[int, int]:
    if type(module).__name__ == "Conv1D":  # GPT-2: weight is (in, out)
        in_f, out_f = tuple(module.weight.shape)  # type: ignore[union-attr,arg-type]
        return int(in_f), int(out_f)
    return int(module.in_features), int(module.out_features)  # type: ignore[arg-type]


def n_quantized_params(model: torch.nn.Module) -> int:
    """Logical parameter count of the quantized layers that ``model.parameters()`` does not
    already count: weights and biases held as buffers; for a packed weight held as a parameter
    (FSDP-QLoRA), its logical count less the packed elements ``parameters()`` counts."""
    n = 0
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            n += m.in_features * m.out_features + (m.out_features if m.bias is not None else 0)
            if m.packed_param:
                n -= m.stored("weight").numel()
    return n


def _autocast_on() -> bool:
    """``torch.is_autocast_enabled()`` on a CUDA run: the trace emulates CUDA autocast on CPU."""
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled()


def _lora_adapters(self: Any) -> Any:
    for name in self.active_adapters:
        if name in self.lora_A:
            yield (
                self.lora_A[name],
                self.lora_B[name],
                self.lora_dropout[name],
                self.scaling[name],
            )


def _lora_forward_bnb(self: Any, x: torch.Tensor, clone: bool) -> torch.Tensor:
    """peft lora/bnb.py ``Linear4bit.forward`` (``clone``) / ``Linear8bitLt.forward``: the adapter
    output is scaled, cast to the base output's dtype, then added."""
    result = self.base_layer(x)
    if clone:  # "for 4bit, we need to defensively clone here"
        result = result.clone()
    for lora_a, lora_b, dropout, scaling in _lora_adapters(self):
        convert = not _autocast_on()
        if convert:
            expected = result.dtype
            x = self._cast_input_dtype(x, lora_a.weight.dtype)
        output = lora_b(lora_a(dropout(x))) * scaling
        if convert:
            output = output.to(expected)
        result = result + output
    return result


def _lora_forward_4bit(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return _lora_forward_bnb(self, x, clone=True)


def _lora_forward_8bit(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return _lora_forward_bnb(self, x, clone=False)


def _lora_forward_awq(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """peft lora/awq.py ``AwqLoraLinear.forward``: cast to the base dtype, then scale."""
    result = self.base_layer(x)
    for lora_a, lora_b, dropout, scaling in _lora_adapters(self):
        convert = not _autocast_on()
        if convert:
            expected = result.dtype
            x = self._cast_input_dtype(x, lora_a.weight.dtype)
        output = lora_b(lora_a(dropout(x)))
        if convert:
            output = output.to(expected)
        result = result + output * scaling
    return result


#: peft's format-specific LoRA forwards. GPTQ (lora/gptq.py) and torchao FP8 run the same
#: arithmetic as peft's default ``Linear.forward``, which stays.
_LORA_FORWARDS = {
    "nf4": _lora_forward_4bit,
    "nf4-dq": _lora_forward_4bit,
    "fp4": _lora_forward_4bit,
    "int8": _lora_forward_8bit,
    "int4-awq": _lora_forward_awq,
}
