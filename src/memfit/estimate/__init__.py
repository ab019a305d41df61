"""Estimate the peak GPU memory of a job: ``estimate(model, workload, gpu=...)``.

Engines: ``trace`` runs the model on fake tensors (needs torch, and transformers for HF configs);
``analytic`` evaluates closed forms from config.json (torch-free, milliseconds); ``auto`` uses
trace when torch can build the model and analytic otherwise, and the estimate says which.
"""

from __future__ import annotations

from typing import Any

from memfit.errors import MissingDependencyError, SpecError
from memfit.estimate.result import COMPONENTS, MemoryEstimate
from memfit.spec import WorkloadSpec

ENGINES = ("auto", "trace", "analytic")

__all__ = ["COMPONENTS", "ENGINES", "MemoryEstimate", "estimate"]


def estimate(
    model: Any,
    workload: WorkloadSpec | None = None,
    *,
    gpu: str | Any = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
) -> MemoryEstimate:
    """Estimate ``model`` (a MODEL string — bundled name, path, hub id, ``pkg.mod:factory`` — or a
    ``ModelSource``) running ``workload`` (default: a bf16 AdamW training step, batch 1, seq 512).

    ``extrapolate``: None (default) traces every layer of models up to 48 layers and extrapolates
    deeper ones from a few layers; True/False force either."""
    from memfit.models import ModelSource, resolve_model

    if engine not in ENGINES:
        raise SpecError(f"engine ({engine!r}) must be one of {', '.join(ENGINES)}")
    workload = workload or WorkloadSpec()
    gpu_record = _gpu(gpu)
    source = (
        model
        if isinstance(model, ModelSource)
        else resolve_model(str(model), trust_remote_code=trust_remote_code)
    )
    if engine == "analytic":
        from memfit.estimate.analytic import estimate_analytic

        return estimate_analytic(source, workload, gpu=gpu_record)
    _require_trace_stack(source)
    if source.origin == "factory":
        from memfit.estimate.trace.factory import trace_factory

        return trace_factory(source.factory or "", workload, gpu=gpu_record)
    from memfit.estimate.trace.engine import trace_hf

    return trace_hf(
        source.config or {},
        workload,
        name=source.name,
        gpu=gpu_record,
        trust_remote_code=source.trust_remote_code,
        extrapolate=extrapolate,
    )


def _gpu(gpu: Any) -> Any:
    if gpu is None or not isinstance(gpu, str):
        return gpu
    from memfit.hardware import get_gpu

    return get_gpu(gpu)


def _require_trace_stack(source: Any) -> None:
    needed = ["torch"] if source.origin == "factory" else ["torch", "transformers"]
    for pkg in needed:
        try:
            __import__(pkg)
        except ImportError as exc:
            raise MissingDependencyError(
                f"the trace engine needs {pkg}, which is not installed: "
                "pip install 'memfit[trace]' (install torch for your CUDA version first)"
            ) from exc
