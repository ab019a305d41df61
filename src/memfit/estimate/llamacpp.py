"""The llama.cpp answer (torch-free): :class:`LlamaCppEstimate`, llama.cpp's buffers
(:mod:`memfit.serving.llamacpp`) judged on a GPU by the one rule
(:func:`~memfit.estimate.verdict.judge_point`: the buffers are exact sums, with no measured
error range), and the largest ``-ngl`` and ``-c`` whose verdict is ``fits``.

The busiest GPU is the one judged (with ``-ts`` / several GPUs, every GPU has the same capacity);
``device_used_bytes`` is its model, KV and compute buffers, ggml-cuda's pool, the CUDA context and
cuBLAS workspace.

The headroom kept free is llama.cpp's own (:func:`llamacpp_headroom_bytes`): when llama.cpp sizes
``-ngl`` / ``-c`` to a GPU (``--fit``, on by default since late 2025) it leaves
``fit_params_target`` = 1024 MiB of the device's free memory unplanned per GPU (common/common.h,
ggml-org/llama.cpp commit 001d906a; ``--fit-target`` changes it), on top of the buffers it
measures with the CUDA context already created: what kernels loaded later, the pool's growth, CUDA
graphs and the other processes on a desktop GPU take. memfit keeps the larger of that and its
default 5 %, so "fits" means what llama.cpp itself would plan on that GPU; a job inside the margin
is "tight". (A 6141 MiB laptop GPU on which a 7B Q4_K_M crashed at -c 4096 had 4.6 GiB of logged
buffers: docs/accuracy.md, "llama.cpp verdicts".)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memfit.estimate.verdict import Verdict, headroom_bytes, judge_point
from memfit.hardware.gpu import GPU
from memfit.models.gguf import GgufModel
from memfit.monotone import largest
from memfit.serving.llamacpp import CTX_PAD, DeviceBuffers, LlamaCppBuffers, llamacpp_buffers
from memfit.spec.llamacpp import LlamaCppJob
from memfit.units import MiB

__all__ = [
    "LLAMACPP_FIT_TARGET_BYTES", "LlamaCppEstimate", "estimate_llamacpp", "largest_ctx",
    "largest_ngl", "llamacpp_headroom_bytes",
]  # fmt: skip

#: llama.cpp's ``--fit-target`` default: the free memory it leaves unplanned per device when it
#: fits -ngl / -c to a GPU (common/common.h ``fit_params_target = 1024 * 1024*1024``,
#: ggml-org/llama.cpp commit 001d906a).
LLAMACPP_FIT_TARGET_BYTES = 1024 * MiB
FIT_TARGET_NOTE = (
    "headroom: 1 GiB kept free on each GPU, llama.cpp's own --fit margin (--fit-target 1024): "
    "'fits' is what llama.cpp itself would plan there"
)


def llamacpp_headroom_bytes(gpu: GPU) -> int:
    """The headroom a llama.cpp verdict keeps free on ``gpu``: llama.cpp's own fit margin, or
    memfit's default share of the capacity where that is larger (module docstring)."""
    return max(LLAMACPP_FIT_TARGET_BYTES, headroom_bytes(gpu.capacity_bytes))


@dataclass(frozen=True, kw_only=True)
class LlamaCppEstimate:
    """llama.cpp's start-up on a GPU: the buffers (every buffer figure reads through:
    ``e.n_ctx`` is ``e.buffers.n_ctx``), the verdict, the largest -ngl and -c that fit."""

    buffers: LlamaCppBuffers
    verdict: Verdict | None = None
    largest_n_gpu_layers: int | None = None
    largest_ctx_size: int | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.buffers, name)

    # -- the Answer protocol -------------------------------------------------------------------
    @property
    def busiest(self) -> DeviceBuffers:
        return self.buffers.busiest

    @property
    def peak_allocated_bytes(self) -> int:
        return self.busiest.buffers_bytes

    @property
    def peak_reserved_bytes(self) -> int | None:
        return None  # ggml allocates each buffer once, whole: no caching allocator to replay

    @property
    def device_used_bytes(self) -> int:
        return self.buffers.device_used_bytes

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        return {}

    @property
    def peak_components(self) -> dict[str, int]:
        d = self.busiest
        return {"model": d.model_bytes, "kv_cache": d.kv_bytes, "compute": d.compute_bytes,
                "cuda_pool": d.pool_bytes, "cuda_context": d.context_bytes}  # fmt: skip

    @property
    def notes(self) -> tuple[str, ...]:
        return self.buffers.notes

    @property
    def engine(self) -> str:
        return "llama.cpp"

    @property
    def engine_reason(self) -> str | None:
        return "llama.cpp's buffer accounting (memfit.serving.llamacpp) on the GGUF's tensors"

    @property
    def fits(self) -> bool:
        return self.verdict is not None and self.verdict.fits

    def to_json(self) -> dict[str, Any]:
        return {
            **self.buffers.to_json(),
            "largest_n_gpu_layers": self.largest_n_gpu_layers,
            "largest_ctx_size": self.largest_ctx_size,
            "verdict": None if self.verdict is None else self.verdict.to_json(),
        }


def estimate_llamacpp(model: GgufModel, job: LlamaCppJob, gpu: GPU | None, *,
                      solve: bool = True) -> LlamaCppEstimate:  # fmt: skip
    """The buffers of ``job`` and, on ``gpu``, the verdict; ``solve``: also the largest -ngl
    and -c that fit."""
    buffers = llamacpp_buffers(model, job, gpu)
    if gpu is None:
        return LlamaCppEstimate(buffers=buffers)
    headroom = llamacpp_headroom_bytes(gpu)
    verdict = judge_point(buffers.device_used_bytes, gpu.capacity_bytes, headroom)
    if headroom == LLAMACPP_FIT_TARGET_BYTES:
        buffers = replace(buffers, notes=(*buffers.notes, FIT_TARGET_NOTE))
    est = LlamaCppEstimate(buffers=buffers, verdict=verdict)
    if solve:
        est = replace(est, largest_n_gpu_layers=largest_ngl(model, job, gpu),
                      largest_ctx_size=largest_ctx(model, job, gpu))  # fmt: skip
    return est


def _fits(model: GgufModel, job: LlamaCppJob, gpu: GPU) -> bool:
    return estimate_llamacpp(model, job, gpu, solve=False).fits


def largest_ngl(model: GgufModel, job: LlamaCppJob, gpu: GPU) -> int:
    """The largest -ngl (0 .. n_layer + 1) whose start-up fits every GPU at this -c (memory
    grows with -ngl: a bisection)."""
    value, _ = largest(
        lambda n: True if _fits(model, replace(job, n_gpu_layers=n), gpu) else None,
        model.n_layer + 1,
    )
    return value


def largest_ctx(model: GgufModel, job: LlamaCppJob, gpu: GPU) -> int:
    """The largest -c (whole 256-cell steps per slot, up to the trained context) that fits at
    this -ngl; 0 when not even one step does."""
    slots = 1 if job.unified else job.slots
    step = CTX_PAD * slots
    steps, _ = largest(
        lambda n: True if _fits(model, replace(job, ctx_size=n * step), gpu) else None,
        max(model.n_ctx_train, step) // step,
    )
    return steps * step
