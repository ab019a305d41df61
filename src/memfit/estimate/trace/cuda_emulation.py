"""Make a trace on fake CPU tensors allocate what the same step allocates on a CUDA GPU.

Fake ``cuda`` tensors abort the process in ``backward()`` on a CPU-only torch build (a C++
``terminate`` that cannot be caught; see shared/notes/tracing.md, trap 1), so memfit traces on fake
``cpu`` tensors and reproduces the choices CUDA would make where they differ:

* **SDPA kernel choice** (:class:`SdpaRouter`): on CPU, ``scaled_dot_product_attention`` takes the
  math path and materialises B·H·S² scores; CUDA picks FlashAttention-2 or the memory-efficient
  kernel. We route the call to the same ATen kernels CUDA would pick (they have meta kernels), by
  patching ``F.scaled_dot_product_attention`` (a TorchFunctionMode would not be active during
  checkpoint recomputation inside ``backward()``).
* **Autocast op lists** (:func:`cuda_autocast_policy`): CPU autocast keeps ops such as
  ``layer_norm``, ``softmax``, ``log_softmax``, ``sum`` in the input dtype where CUDA autocast runs
  them in fp32 (``aten/src/ATen/autocast_mode.cpp``, the ``AT_FORALL_FP32`` and
  ``AT_FORALL_FP32_SET_OPT_DTYPE`` lists). We register AutocastCPU kernels that apply CUDA's policy
  for the duration of the trace.
* **Dropout** (:func:`fused_dropout`): CUDA's fused kernel saves a bool mask, CPU a noise tensor.
* **Reduction staging** (:func:`cuda_kernel_workspaces`): CUDA's ``gpu_reduce_kernel`` takes a
  global-memory buffer and semaphores from the caching allocator when it splits each output's
  inputs across blocks (bias and RMSNorm weight gradients: a sum over every token); CPU's sum
  allocates nothing. Sized by ``setReduceConfig`` (:mod:`memfit.estimate.cuda_reduce`).
* **Hugging Face fake-tensor detection** (:func:`hf_treat_fake_as_real`): transformers treats a
  FakeTensor as "tracing" and then builds a (B, 1, S, S) mask a real run skips (trap 5).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from memfit.estimate import cuda_reduce
from memfit.estimate.trace import tracker as tracker_mod

#: Ops CUDA autocast runs in fp32 (CastPolicy::fp32), from aten/src/ATen/autocast_mode.cpp
#: (``AT_FORALL_FP32``). Only overloads that exist in this torch build are patched.
CUDA_FP32_OPS = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
)
#: Ops CUDA autocast runs with ``dtype=float32`` when no dtype is given
#: (CastPolicy::fp32_set_opt_dtype, ``AT_FORALL_FP32_SET_OPT_DTYPE``).
CUDA_FP32_SET_OPT_DTYPE_OPS = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "sum",
    "sum.dim_IntList",
)

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_LOW = (torch.float16, torch.bfloat16)


def _upcast(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in _LOW:
        return x.float()
    if isinstance(x, (list, tuple)):
        return type(x)(_upcast(v) for v in x)
    return x


def _resolve(name: str) -> Any | None:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _fp32_kernel(op: Any) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            return op(*_upcast(args), **{k: _upcast(v) for k, v in kwargs.items()})

    return kernel


def _set_opt_dtype_kernel(op: Any) -> Any:
    names = [a.name for a in op._schema.arguments]
    dtype_pos = names.index("dtype")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            first = args[0] if args else None
            eligible = isinstance(first, torch.Tensor) and first.dtype in _LOW
            given = args[dtype_pos] if len(args) > dtype_pos else kwargs.get("dtype")
            if eligible and given is None:
                args = args[:dtype_pos]
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    return kernel


@contextmanager
def cuda_autocast_policy() -> Iterator[None]:
    """Within this context, CPU autocast follows CUDA autocast's fp32 op lists."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name in CUDA_FP32_OPS:
                op = _resolve(name)
                if op is not None:
                    lib.impl(name, _fp32_kernel(op), "AutocastCPU")
            for name in CUDA_FP32_SET_OPT_DTYPE_OPS:
                op = _resolve(name)
                if op is not None and "dtype" in [a.name for a in op._schema.arguments]:
                    lib.impl(name, _set_opt_dtype_kernel(op), "AutocastCPU")
        yield
    finally:
        lib._destroy()


class SdpaRouter:
    """Route ``F.scaled_dot_product_attention`` to the kernel a CUDA GPU (sm80+) would run.

    ``mode``: ``"auto"`` picks as PyTorch's ``_fused_sdp_choice`` does on CUDA (priority flash →
    memory-efficient → math): flash for fp16/bf16 without an explicit mask and head_dim ≤ 256 and a
    multiple of 8; memory-efficient for masks, fp32, or shapes flash rejects; math otherwise.
    ``"flash"`` forces FlashAttention (what ``attn_implementation="flash_attention_2"`` runs).
    ``choices`` counts the backend picked per call (forward calls only, recomputation included).
    """

    def __init__(self, mode: str = "auto") -> None:
        self.mode = mode
        self.choices: Counter[str] = Counter()
        self._orig = F.scaled_dot_product_attention

    def __enter__(self) -> SdpaRouter:
        self._orig = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._sdpa  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        F.scaled_dot_product_attention = self._orig

    def choose(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, gqa: bool = False
    ) -> str:
        head_dim = q.shape[-1]
        half = q.dtype in _LOW
        flash_ok = half and head_dim <= 256 and head_dim % 8 == 0 and k.shape[-1] == v.shape[-1]
        if self.mode == "flash" and flash_ok:
            return "flash"
        if flash_ok and mask is None:
            return "flash"
        if gqa:
            # The memory-efficient kernel has no grouped-query support: with enable_gqa and fewer
            # K/V heads, CUDA falls back to math (measured: fp32 Qwen2.5 on an H200 materialises
            # the B·H·S² fp32 scores, benchmarks/results/gpu_h200_measurements.jsonl).
            return "math"
        align = 8 if half else 4
        if q.dtype in (*_LOW, torch.float32) and head_dim % align == 0:
            return "efficient"
        return "math"

    def _sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        q, k, v, mask = query, key, value, attn_mask
        if torch.is_autocast_enabled("cpu"):  # SDPA is on autocast's lower-precision list
            low = torch.get_autocast_dtype("cpu")
            q, k, v = (t.to(low) if t.dtype == torch.float32 else t for t in (q, k, v))
            if mask is not None and mask.is_floating_point():
                mask = mask.to(low)
        n_rep = q.shape[-3] // k.shape[-3]
        choice = self.choose(q, k, v, mask, gqa=enable_gqa and n_rep > 1)
        self.choices[choice] += 1
        if choice == "flash":
            # flash handles a causal mask itself; with an explicit mask only when forced ("flash").
            # FlashAttention-2 takes fewer K/V heads than Q heads (GQA) natively: no repeat.
            causal = is_causal or mask is not None
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, causal, False, scale=scale
            )[0]
            if out.requires_grad and out.grad_fn is not None:
                _reserve_during_backward(out.grad_fn, flash_backward_workspace_bytes(q, k))
            return out
        if choice == "efficient":
            if n_rep > 1:
                k, v = (t.repeat_interleave(n_rep, dim=-3) for t in (k, v))
            bias = mask
            if bias is not None and bias.dtype == torch.bool:
                bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill_(
                    bias.logical_not(), float("-inf")
                )
            if bias is not None:
                bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, bias, need_lse, dropout_p, is_causal, scale=scale
            )[0]
        # CUDA's math path (CPU's own SDPA would pick its flash kernel instead).
        return torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )[0]


#: FlashAttention-2 backward (``mha_bwd``) allocates, for the duration of the kernel, an fp32
#: ``dq_accum`` (B, S_q rounded to 128, H_q, D rounded to 32), the fp32 ``softmax_d`` (B, H_q, S_q
#: rounded) and, with grouped-query attention, ``dk``/``dv`` expanded to H_q heads in the input
#: dtype. On an H200 (torch 2.11) these came as one block per backward call: 32.25 MiB for
#: Llama-3.2-1B at B=2, S=1024 and 129 MiB at B=4, S=2048, as the formula gives
#: (benchmarks/results/).
FLASH_SEQ_ROUND = 128
FLASH_HEAD_ROUND = 32


def flash_backward_workspace_bytes(q: torch.Tensor, k: torch.Tensor) -> int:
    b, h_q, s_q, d = q.shape
    h_k, s_k = k.shape[-3], k.shape[-2]
    s_q_r = -(-s_q // FLASH_SEQ_ROUND) * FLASH_SEQ_ROUND
    d_r = -(-d // FLASH_HEAD_ROUND) * FLASH_HEAD_ROUND
    n_bytes = b * s_q_r * h_q * d_r * 4 + b * h_q * s_q_r * 4
    if h_k != h_q:
        n_bytes += 2 * b * s_k * h_q * d * q.element_size()
    return int(n_bytes)


def _reserve_during_backward(node: Any, n_bytes: int) -> None:
    """Allocate ``n_bytes`` when autograd enters ``node`` and free them when it leaves."""
    held: list[torch.Tensor] = []

    def pre(_grad_outputs: Any) -> None:
        held.append(torch.empty(n_bytes, dtype=torch.uint8))

    def post(_grad_inputs: Any, _grad_outputs: Any) -> None:
        held.clear()

    node.register_prehook(pre)
    node.register_hook(post)


@contextmanager
def fused_dropout() -> Iterator[None]:
    """Dropout as CUDA runs it: ``aten::dropout`` takes the fused ``native_dropout`` kernel on CUDA
    (``is_fused_kernel_acceptable``), saving a 1-byte bool mask, while on CPU it multiplies by a
    noise tensor in the input's dtype (2-4 bytes per element). Seen on an H200: BERT training keeps
    one (tokens × hidden) bool mask per dropout (benchmarks/results/gpu_h200_alloc_traces.tgz)."""
    original = F.dropout

    def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False):
        if not training or p == 0.0 or inplace or not 0.0 < p < 1.0 or input.numel() == 0:
            return original(input, p, training, inplace)
        return torch.ops.aten.native_dropout(input, p, True)[0]

    F.dropout = dropout  # type: ignore[assignment]
    try:
        yield
    finally:
        F.dropout = original


#: Reductions that run ``gpu_reduce_kernel`` on CUDA with a float accumulator (``sum_kernel_cuda``
#: and ``mean_kernel_cuda``: ``acc_type`` of half, bf16 and fp32 is fp32, of fp64 fp64;
#: ``aten/src/ATen/native/cuda/ReduceSumProdKernel.cu``, ``ReduceMomentKernel.cu``): "acc";
#: ``amax``/``amin`` accumulate in the input dtype (``ReduceAMinMaxKernel.cu``): "input".
REDUCE_OPS = {
    "sum.dim_IntList": "acc",
    "sum.default": "acc",
    "mean.dim": "acc",
    "mean.default": "acc",
    "amax.default": "input",
    "amin.default": "input",
}
_ACC_BYTES = {torch.float16: 4, torch.bfloat16: 4, torch.float32: 4, torch.float64: 8}


def _reduce_ops() -> dict[Any, str]:
    ops = {}
    for name, acc in REDUCE_OPS.items():
        op = _resolve(name)
        if op is not None:
            ops[op] = acc
    return ops


def reduction_call(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int] | None:
    """(input shape, input strides in elements, reduced dimensions, accumulator bytes) of an op
    that runs ``gpu_reduce_kernel`` on CUDA: what :func:`cuda_reduce.reduce_staging_bytes`
    sizes its staging from (None: not such an op). Derived forms record these arguments and size
    the staging at the estimate's batch size and GPU (``derived/staging.py``)."""
    acc = _REDUCE_OPS.get(func)
    if acc is None or not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    acc_bytes = _ACC_BYTES.get(x.dtype) if acc == "acc" else x.element_size()
    if acc_bytes is None or x.dim() == 0:
        return None
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(x.dim()))
    elif isinstance(dims, int):
        dims = [dims]
    nd = x.dim()
    reduced = tuple(sorted({int(d) % nd for d in dims}))
    return tuple(x.shape), tuple(x.stride()), reduced, int(acc_bytes)


def reduction_workspaces(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[int, ...]:
    """Request sizes (buffer, semaphores) CUDA's reduction kernel allocates for this op, if any
    (``gpu_reduce_kernel`` in ``aten/src/ATen/native/cuda/Reduce.cuh``)."""
    call = reduction_call(func, args, kwargs)
    if call is None:
        return ()
    shape, strides, dims, acc_bytes = call
    buf, sem = cuda_reduce.reduce_staging_bytes(
        shape, list(dims), acc_bytes=acc_bytes, strides=strides
    )
    return (buf, sem) if buf else ()


_REDUCE_OPS: dict[Any, str] = _reduce_ops()


@contextmanager
def cuda_kernel_workspaces(gpu: Any = None) -> Iterator[None]:
    """Within this context, every tracker allocates (and frees) the blocks CUDA kernels take
    for the duration of an op on ``gpu`` (None: memfit's default device, an A100):
    :func:`reduction_workspaces`."""
    token = tracker_mod.OP_WORKSPACES.set(reduction_workspaces)
    try:
        with cuda_reduce.reduce_device(gpu):
            yield
    finally:
        tracker_mod.OP_WORKSPACES.reset(token)


@contextmanager
def hf_treat_fake_as_real() -> Iterator[None]:
    """Make transformers take the code path it takes for real tensors of an unpadded batch."""
    try:
        import transformers.masking_utils as masking
        import transformers.utils.import_utils as import_utils
    except ImportError:
        yield
        return
    saved_fake, saved_packed = import_utils.is_fake_tensor, masking.find_packed_sequence_indices

    def find_packed(position_ids: Any) -> Any:
        if isinstance(position_ids, torch._subclasses.FakeTensor):
            return None  # memfit's inputs are never packed sequences
        return saved_packed(position_ids)

    import_utils.is_fake_tensor = lambda x: False
    masking.find_packed_sequence_indices = find_packed
    try:
        yield
    finally:
        import_utils.is_fake_tensor = saved_fake
        masking.find_packed_sequence_indices = saved_packed
