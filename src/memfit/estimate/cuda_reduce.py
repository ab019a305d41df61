"""The staging buffer CUDA's reduction kernel allocates: PyTorch's ``setReduceConfig``, in Python.

``sum``, ``mean``, ``amax`` and the other TensorIterator reductions run ``gpu_reduce_kernel``
(``aten/src/ATen/native/cuda/Reduce.cuh``). When each output has many inputs and there are few
outputs — a bias gradient (``grad.sum(0)`` over every token), the weight gradient of an RMSNorm
(``sum_to`` of ``grad * x_normed`` over the tokens) — it splits every output's inputs across
``ctas_per_output`` thread blocks and combines their partial results through global memory: a
``buffer`` of ``global_memory_size()`` bytes and ``semaphore_size()`` bytes of semaphores, both
taken from the caching allocator for the duration of the kernel (``gpu_reduce_kernel``:
``allocator.allocate(config.global_memory_size())``). CPU kernels allocate nothing of the kind, so a
trace on CPU tensors misses these blocks.

Seen on an H200 (132 SMs, torch 2.11; ``benchmarks/results/gpu_h200_alloc_traces.tgz``), one block
per bias gradient right after it: BERT-base at 32 x 512 tokens, 96 MiB + 24 B for each 768-wide
bias and 132 MiB + 96 B for the 3072-wide one (``4 * 768 * 256 * 128`` and ``4 * 3072 * 88 * 128``,
as :func:`reduce_staging_bytes` gives); Llama-3.2-1B at 2 x 1024 tokens, 32 MiB for each RMSNorm
weight gradient.

:func:`reduce_config` follows ``setReduceConfig`` (torch 2.13's ``Reduce.cuh``; the same logic in
2.11) for a contiguous input: TensorIterator puts the reduced dimensions first and coalesces
neighbours, then the block shape, vectorisation and ``ctas_per_output`` are chosen from the
device's SM count and resident threads per SM. Not modelled: inputs over 2**31 elements (split
into 32-bit-indexable sub-iterators) and ROCm (other constants); both answer 0.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError

#: ``ReduceConfig`` constants (Reduce.cuh): threads per block (``mnt_wrapper``), the warp, the
#: values per thread below which inputs are not split across blocks, and above which they are.
MAX_NUM_THREADS = 512
WARP_SIZE = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
#: ``vt0`` / ``input_vec_size`` of the sum/mean kernels (``gpu_reduce_kernel`` defaults).
VT0 = 4
#: The allocator's granularity (``kMinBlockSize``): each of the two blocks rounds up to it.
BLOCK_ROUND_BYTES = 512
#: Reductions over more elements than this are split into 32-bit-indexable parts (not modelled).
MAX_32BIT_NUMEL = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class ReduceDevice:
    """What ``setReduceConfig`` reads from ``cudaDeviceProp``: ``multiProcessorCount`` and
    ``maxThreadsPerMultiProcessor``."""

    n_sms: int
    max_threads_per_sm: int
    #: a compute capability 9.x GPU (Hopper): what else the kernels lay out per GPU generation
    #: reads it (triton's ``HopperMXValueLayout`` for MXFP4 experts,
    #: ``quant_experts.stored_expert_tensors``), as the trace engine does from ``--gpu``
    hopper: bool = False

    def __post_init__(self) -> None:
        for name in ("n_sms", "max_threads_per_sm"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecError(f"ReduceDevice: {name} ({value!r}) must be a positive integer")


#: SMs per GPU (NVIDIA's product briefs / architecture whitepapers: V100 80, T4 40, A100 108,
#: A10G 80, A10 72, L4 58, L40/L40S/RTX 6000 Ada 142, H100 SXM/NVL and H200 132, H100 PCIe 114,
#: B200 148, RTX 4090 128, RTX 5090 170); the H200's 132 is what torch reported on the measured
#: card (its reduction blocks match, see the module docstring).
SM_COUNT = {
    "V100-16GB": 80, "V100-32GB": 80, "V100-PCIe-16GB": 80, "V100-PCIe-32GB": 80, "T4": 40,
    "A10G": 80, "A10": 72, "A2": 10, "A30": 56, "A40": 84, "A100-40GB": 108,
    "A100-PCIe-40GB": 108, "A100-80GB": 108, "A100-PCIe-80GB": 108, "RTX-A4000": 48,
    "RTX-A5000": 64, "RTX-A6000": 84, "RTX-3060": 28, "RTX-3090": 82, "L4": 58, "L40": 142,
    "L40S": 142, "RTX-4080": 76, "RTX-4060-Ti-16GB": 34, "RTX-4070-Ti-SUPER": 66,
    "RTX-4080-SUPER": 80, "RTX-4090": 128, "RTX-6000-Ada": 142, "H100-80GB": 132,
    "H100-PCIe": 114, "H100-NVL": 132, "H200": 132, "H200-NVL": 132, "GH200": 132, "B200": 148,
    "GB200": 148, "RTX-5090": 170, "RTX-PRO-6000-Blackwell": 188,
}  # fmt: skip
#: Resident threads per SM by compute capability (CUDA C Programming Guide, "Technical
#: Specifications per Compute Capability").
THREADS_PER_SM = {(7, 0): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536, (8, 9): 1536,
                  (9, 0): 2048, (10, 0): 2048, (12, 0): 1536}  # fmt: skip
#: No ``--gpu``: an A100 (memfit's default device is a data-center Ampere GPU).
DEFAULT_DEVICE = ReduceDevice(n_sms=108, max_threads_per_sm=2048)

_DEVICE: contextvars.ContextVar[ReduceDevice | None] = contextvars.ContextVar(
    "memfit_reduce_device", default=DEFAULT_DEVICE
)


def device_for(gpu: Any) -> ReduceDevice | None:
    """The reduction geometry of a catalog GPU; None where the rule does not apply (ROCm)."""
    if gpu is None:
        return DEFAULT_DEVICE
    if getattr(gpu, "vendor", "nvidia") != "nvidia":
        return None
    cc = getattr(gpu, "compute_capability", None)
    threads = THREADS_PER_SM.get(tuple(cc), 2048) if cc else 2048
    n_sms = SM_COUNT.get(getattr(gpu, "name", ""), DEFAULT_DEVICE.n_sms)
    hopper = cc is not None and len(cc) > 0 and int(cc[0]) == 9
    return ReduceDevice(n_sms=n_sms, max_threads_per_sm=threads, hopper=hopper)


@contextmanager
def reduce_device(gpu: Any) -> Iterator[None]:
    """Within this context, :func:`current_device` is ``gpu``'s geometry (for both engines)."""
    token = _DEVICE.set(device_for(gpu))
    try:
        yield
    finally:
        _DEVICE.reset(token)


def current_device() -> ReduceDevice | None:
    return _DEVICE.get()


@dataclass(frozen=True, kw_only=True)
class ReduceConfig:
    """The parts of ``ReduceConfig`` that size the staging memory."""

    acc_bytes: int
    num_outputs: int
    block_x: int
    output_vec_size: int
    grid_x: int
    ctas_per_output: int
    block_x_reduce: bool

    @property
    def global_memory_bytes(self) -> int:
        """``global_memory_size()``: 0 unless inputs are split across blocks."""
        if self.ctas_per_output <= 1:
            return 0
        size = self.acc_bytes * self.num_outputs * self.ctas_per_output
        if not self.block_x_reduce:
            size *= self.block_x * self.output_vec_size
        return size

    @property
    def semaphore_bytes(self) -> int:
        return 4 * self.grid_x if self.ctas_per_output > 1 else 0


def _iter_dims(
    shape: Sequence[int], reduce_dims: Sequence[int], strides: Sequence[int] | None
) -> list[tuple[int, int, bool]]:
    """(size, input stride in elements, reduced) per TensorIterator dimension: size-1 dimensions
    dropped, reduced ones first, each group fastest-first, neighbours that are contiguous in both
    operands coalesced (``reorder_dimensions``, ``coalesce_dimensions``). ``strides``: the
    input's (None: contiguous)."""
    nd = len(shape)
    red = {d % nd for d in reduce_dims} if nd else set()
    if strides is None:
        contiguous, s = [0] * nd, 1
        for d in range(nd - 1, -1, -1):
            contiguous[d] = s
            s *= shape[d]
        strides = contiguous
    dims = [(shape[d], strides[d], d in red) for d in range(nd) if shape[d] != 1]
    dims.sort(key=lambda t: (not t[2], t[1]))  # reduced first, each group fastest-first
    out: list[tuple[int, int, bool]] = []
    for size, stride, reduced in dims:
        if out and out[-1][2] == reduced and out[-1][0] * out[-1][1] == stride:
            prev = out.pop()
            out.append((prev[0] * size, prev[1], reduced))
        else:
            out.append((size, stride, reduced))
    return out


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _output_vec_size(dims: list[tuple[int, int, bool]], n_reduce: int) -> int:
    """``get_output_vec_size``: 4, halved until the first output dimension's size and the other
    dimensions' input strides divide by it (the data pointer is taken as aligned)."""
    vec = 4
    checks = [dims[n_reduce][0]] + [st for i, (_, st, _) in enumerate(dims) if i != n_reduce]
    for n in checks:
        while n % vec:
            vec //= 2
    return vec


def reduce_config(
    shape: Sequence[int],
    reduce_dims: Sequence[int],
    *,
    acc_bytes: int,
    device: ReduceDevice,
    strides: Sequence[int] | None = None,
) -> ReduceConfig | None:
    """``setReduceConfig`` for reducing a tensor of ``shape`` (``strides`` in elements; None:
    contiguous) over ``reduce_dims`` (None: nothing to reduce, or a case not modelled)."""
    numel = 1
    for n in shape:
        numel *= n
    if numel == 0 or numel > MAX_32BIT_NUMEL:
        return None
    dims = _iter_dims(shape, reduce_dims, strides)
    if not dims:
        return None
    n_reduce = sum(1 for d in dims if d[2])
    num_outputs = 1
    for size, _, reduced in dims:
        if not reduced:
            num_outputs *= size
    inputs_per_output = numel // num_outputs
    fastest = n_reduce == len(dims) or dims[0][1] < dims[n_reduce][1]
    dim0, dim1 = (inputs_per_output, num_outputs) if fastest else (num_outputs, inputs_per_output)
    fastest_stride = dims[0][1] if fastest else dims[n_reduce][1]
    vec = 1
    if fastest_stride == 1:
        if fastest and dim0 >= 128 and n_reduce == 1:
            dim0 //= VT0  # vectorize along input
        elif not fastest:
            vec = _output_vec_size(dims, n_reduce)  # vectorize along output
            dim0 //= vec
    max_threads = MAX_NUM_THREADS // vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_w = min(d0, WARP_SIZE)
    block_h = min(d1, max_threads // block_w)
    block_w = min(d0, max_threads // block_h)
    step_in, step_out = 1, 1
    if fastest:
        step_in *= block_w  # input_mult[0]: split the input across lanes
    else:
        step_out *= block_w
    values = _div_up(inputs_per_output, step_in)
    split_warps = values >= min(block_h * 16, MAX_VALUES_PER_THREAD)
    if split_warps:
        step_in *= block_h
    else:
        step_out *= block_h
    grid_x = _div_up(num_outputs // vec, step_out)
    target = device.n_sms * (device.max_threads_per_sm // (block_w * block_h))
    values = _div_up(inputs_per_output, step_in)
    ctas = 1
    if split_warps and values >= MAX_VALUES_PER_THREAD and grid_x <= target:
        ctas = max(
            min(_div_up(target, grid_x), _div_up(values, MIN_VALUES_PER_THREAD)),
            _div_up(values, MAX_VALUES_PER_THREAD),
        )
    return ReduceConfig(
        acc_bytes=acc_bytes,
        num_outputs=num_outputs,
        block_x=block_w,
        output_vec_size=vec,
        grid_x=grid_x,
        ctas_per_output=ctas,
        block_x_reduce=fastest,
    )


def reduce_staging_bytes(
    shape: Sequence[int],
    reduce_dims: Sequence[int],
    *,
    acc_bytes: int = 4,
    device: ReduceDevice | None = None,
    strides: Sequence[int] | None = None,
) -> tuple[int, int]:
    """(buffer, semaphores) request sizes in bytes that ``gpu_reduce_kernel`` allocates while
    reducing ``shape`` over ``reduce_dims`` with an accumulator of ``acc_bytes`` (4: fp32, what
    half, bf16 and fp32 sums accumulate in); (0, 0) when it allocates nothing. ``device``: the
    current one (:func:`reduce_device`) when not given."""
    dev = current_device() if device is None else device
    if dev is None:
        return (0, 0)
    cfg = reduce_config(shape, reduce_dims, acc_bytes=acc_bytes, device=dev, strides=strides)
    if cfg is None or cfg.global_memory_bytes == 0:
        return (0, 0)
    return (cfg.global_memory_bytes, cfg.semaphore_bytes)


def rounded(n_bytes: int) -> int:
    """A request as the caching allocator sizes it (multiples of 512 B)."""
    return _div_up(n_bytes, BLOCK_ROUND_BYTES) * BLOCK_ROUND_BYTES if n_bytes else 0


__all__ = [
    "DEFAULT_DEVICE",
    "ReduceConfig",
    "ReduceDevice",
    "current_device",
    "device_for",
    "reduce_config",
    "reduce_device",
    "reduce_staging_bytes",
    "rounded",
]
