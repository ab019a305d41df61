"""Device memory a tensor trace does not see: the CUDA context and the cuBLAS workspaces.

Two different kinds, added in different places:

- **CUDA context** (driver state, loaded kernel images, the CUDA runtime's own heaps). It is
  outside the PyTorch allocator: ``nvidia-smi`` shows it, ``torch.cuda.memory_reserved`` does not.
  Add it to the device total only.
- **cuBLAS / cuBLASLt workspaces**. Since PyTorch allocates them through the caching allocator
  (``getNewWorkspace`` calls ``CUDACachingAllocator::get()->allocate``, in
  aten/src/ATen/cuda/CublasHandlePool.cpp), they count in ``memory_allocated`` and
  ``memory_reserved``: measured on an H200 (torch 2.11), the first bf16 matmul added exactly one
  32 MiB block to ``memory_allocated`` and the backward pass a second one. They are allocated at
  the first GEMM of each (handle, stream) and never freed. Feed ``workspace_allocations`` to the
  allocator replay as never-freed allocations rather than adding bytes to reserved: an 8.125 MiB
  workspace takes a 20 MiB segment that later 1-10 MiB tensors share.

Handles are per thread (a thread-local pool window in CublasHandlePool.cpp). A training step uses
two: the Python thread runs the forward and the optimizer, autograd's device thread runs the
backward. Inference uses one. Extra streams (communication overlap, user streams) add one
workspace per (handle, stream) and are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.hardware.catalog import ARCHS
from memfit.units import KiB, MiB

#: cuBLAS workspace per (handle, stream), PyTorch's default when CUBLAS_WORKSPACE_CONFIG is unset
#: (parseChosenWorkspaceSize in CublasHandlePool.cpp): ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB
#: = 8,519,680 B, but 32 MiB on compute capability 9.x, 10.x and 12.x (Hopper, Blackwell);
#: ROCm: 32 MiB, 128 MiB on gfx94x/gfx95x (MI300). The 32 MiB was measured on an H200.
CUBLAS_WORKSPACE_DEFAULT_BYTES = 2 * 4096 * KiB + 8 * 16 * KiB
CUBLAS_WORKSPACE_LARGE_BYTES = 32 * MiB
HIPBLAS_WORKSPACE_GFX94X_BYTES = 128 * MiB

#: cuBLASLt workspace per (handle, stream), used by addmm with a bias (nn.Linear with bias):
#: 1024 KiB (CUBLASLT_WORKSPACE_SIZE default, pytorch#73328); measured on an H200 with torch
#: 2.11 as a separate 1 MiB block. Newer PyTorch main shares the cuBLAS workspace instead
#: (TORCH_CUBLASLT_UNIFIED_WORKSPACE, on by default), which makes this 0. hipBLASLt on ROCm keeps
#: its own 76 MiB workspace.
CUBLASLT_WORKSPACE_BYTES = 1 * MiB
HIPBLASLT_WORKSPACE_BYTES = 76 * MiB

#: cuBLAS handles in use: training runs the backward on autograd's device thread (its own
#: handle, hence its own workspace, seen on the H200), inference runs on one thread.
N_CUBLAS_HANDLES = {"train": 2, "infer": 1}


#: Context growth from lazily loaded kernels (cuBLAS, attention, optimizer, loss kernels) between
#: CUDA init and the end of the first steps, measured on an H200 (torch 2.11, CUDA 13): nvidia-smi's
#: process usage minus ``max_memory_reserved`` was 742-758 MiB after two training steps and
#: 686-692 MiB after generate(), against 527 MiB after init (benchmarks/results/
#: gpu_h200_measurements.jsonl). Applied to every architecture: other GPUs were not measured.
LAZY_LOADING_GROWTH_BYTES = {"train": (758 - 527) * MiB, "infer": (692 - 527) * MiB}


@dataclass(frozen=True, kw_only=True)
class _ArchOverhead:
    context_bytes: int  # nvidia-smi usage of a process that only initialised CUDA + torch
    context_low_bytes: int
    context_high_bytes: int  # includes kernels loaded lazily during a first step
    cublas_workspace_bytes: int
    cublaslt_workspace_bytes: int
    source: str


_PTRBLCK = (
    "pytorch/pytorch#107667 (~300 MB context with lazy loading, CUDA >= 11.7; >1000 MB before) "
    "and #109888 (~400 MB)"
)

#: Rule-of-thumb CUDA context sizes (estimates: driver, CUDA version and lazy loading move them
#: by a few hundred MiB) and the workspace defaults per architecture. With lazy module loading
#: (CUDA_MODULE_LOADING=LAZY, PyTorch's default since CUDA 11.7) kernels load at first use, so
#: the context grows during the first step: on the H200 it went from 527 MiB after init to
#: 749 MiB after one bf16 matmul, linear and backward. ``context_high_bytes`` allows for that and
#: for larger libraries (flash attention, NCCL).
OVERHEAD_TABLE: dict[str, _ArchOverhead] = {
    "volta": _ArchOverhead(
        context_bytes=300 * MiB,
        context_low_bytes=250 * MiB,
        context_high_bytes=700 * MiB,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_DEFAULT_BYTES,
        cublaslt_workspace_bytes=CUBLASLT_WORKSPACE_BYTES,
        source=f"context: pytorch/pytorch#20532 (300-400 MB on V100, CUDA 10); {_PTRBLCK}",
    ),
    "turing": _ArchOverhead(
        context_bytes=300 * MiB,
        context_low_bytes=250 * MiB,
        context_high_bytes=700 * MiB,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_DEFAULT_BYTES,
        cublaslt_workspace_bytes=CUBLASLT_WORKSPACE_BYTES,
        source=f"context: assumed as Volta/Ampere; {_PTRBLCK}",
    ),
    "ampere": _ArchOverhead(
        context_bytes=350 * MiB,
        context_low_bytes=250 * MiB,
        context_high_bytes=768 * MiB,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_DEFAULT_BYTES,
        cublaslt_workspace_bytes=CUBLASLT_WORKSPACE_BYTES,
        source=(
            f"context: invoke-ai/InvokeAI#9413 (256 MiB, RTX 3090, torch 2.7.1+cu128); {_PTRBLCK}"
        ),
    ),
    "ada": _ArchOverhead(
        context_bytes=426 * MiB,
        context_low_bytes=300 * MiB,
        context_high_bytes=850 * MiB,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_DEFAULT_BYTES,
        cublaslt_workspace_bytes=CUBLASLT_WORKSPACE_BYTES,
        source="context: unslothai/unsloth-zoo#1053 (426 MiB, RTX 6000 Ada, torch 2.10+cu130)",
    ),
    "hopper": _ArchOverhead(
        context_bytes=527 * MiB,
        context_low_bytes=400 * MiB,
        context_high_bytes=1024 * MiB,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_LARGE_BYTES,
        cublaslt_workspace_bytes=CUBLASLT_WORKSPACE_BYTES,
        source=(
            "measured on an H200 (driver 580.159.04, CUDA 13.0, torch 2.11): 527 MiB after "
            "init, 749 MiB after a first matmul + backward; workspaces 32 MiB + 1 MiB per handle"
        ),
    ),
    "blackwell": _ArchOverhead(
        context_bytes=527 * MiB,
        context_low_bytes=400 * MiB,
        context_high_bytes=1200 * MiB,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_LARGE_BYTES,
        cublaslt_workspace_bytes=CUBLASLT_WORKSPACE_BYTES,
        source="context: not measured; assumed as Hopper with a wider range",
    ),
    "cdna3": _ArchOverhead(
        context_bytes=512 * MiB,
        context_low_bytes=256 * MiB,
        context_high_bytes=1024 * MiB,
        cublas_workspace_bytes=HIPBLAS_WORKSPACE_GFX94X_BYTES,
        cublaslt_workspace_bytes=HIPBLASLT_WORKSPACE_BYTES,
        source=(
            "ROCm: context not measured (a guess); hipBLAS 128 MiB on gfx94x and hipBLASLt "
            "76 MiB per CublasHandlePool.cpp"
        ),
    ),
    "cdna4": _ArchOverhead(
        context_bytes=512 * MiB,
        context_low_bytes=256 * MiB,
        context_high_bytes=1024 * MiB,
        cublas_workspace_bytes=HIPBLAS_WORKSPACE_GFX94X_BYTES,
        cublaslt_workspace_bytes=HIPBLASLT_WORKSPACE_BYTES,
        source="ROCm gfx950: not measured; assumed as CDNA3 (the same ROCm runtime and BLAS)",
    ),
}

#: ``device_overhead(None, ...)`` uses this architecture: the common Ampere data-center case.
DEFAULT_ARCH = "ampere"


@dataclass(frozen=True, kw_only=True)
class DeviceOverhead:
    """Memory outside the traced tensors, for one process on one GPU.

    ``total_bytes`` = context + every workspace. The workspaces live in the caching allocator
    (``workspaces_in_allocator``): add them to reserved through ``workspace_allocations``, and
    only ``outside_allocator_bytes`` on top of reserved.
    """

    cuda_context_bytes: int
    cuda_context_low_bytes: int
    cuda_context_high_bytes: int
    cublas_workspace_bytes: int  # per (handle, stream)
    n_cublas_handles: int
    source: str
    cublaslt_workspace_bytes: int = 0  # per (handle, stream); 0 when shared with cuBLAS
    workspaces_in_allocator: bool = True

    @property
    def workspace_bytes(self) -> int:
        """All cuBLAS and cuBLASLt workspaces together."""
        return self.n_cublas_handles * (self.cublas_workspace_bytes + self.cublaslt_workspace_bytes)

    @property
    def total_bytes(self) -> int:
        return self.cuda_context_bytes + self.workspace_bytes

    @property
    def outside_allocator_bytes(self) -> int:
        """What ``nvidia-smi`` shows on top of ``memory_reserved``."""
        if self.workspaces_in_allocator:
            return self.cuda_context_bytes
        return self.total_bytes

    @property
    def workspace_allocations(self) -> tuple[int, ...]:
        """Request sizes of the workspaces, to replay as never-freed caching-allocator blocks."""
        per_handle = [self.cublas_workspace_bytes]
        if self.cublaslt_workspace_bytes:
            per_handle.append(self.cublaslt_workspace_bytes)
        return tuple(per_handle * self.n_cublas_handles)


def device_overhead(arch: str | None, *, training: bool) -> DeviceOverhead:
    """Context and workspace estimate for ``arch`` (see ``ARCHS``); None: a generic Ampere GPU."""
    key = DEFAULT_ARCH if arch is None else arch.strip().lower()
    row = OVERHEAD_TABLE.get(key)
    if row is None:
        raise SpecError(
            f"unknown GPU architecture {arch!r}: use one of {', '.join(ARCHS)}, "
            "or None for a generic Ampere-like default"
        )
    return DeviceOverhead(
        cuda_context_bytes=row.context_bytes
        + LAZY_LOADING_GROWTH_BYTES["train" if training else "infer"],
        cuda_context_low_bytes=row.context_low_bytes,
        cuda_context_high_bytes=row.context_high_bytes,
        cublas_workspace_bytes=row.cublas_workspace_bytes,
        cublaslt_workspace_bytes=row.cublaslt_workspace_bytes,
        n_cublas_handles=N_CUBLAS_HANDLES["train" if training else "infer"],
        source=row.source,
    )
