"""Estimate the peak GPU memory of a job: ``estimate(model, workload, gpu=...)``.

Engines: ``trace`` runs the model on fake tensors (needs torch, and transformers for HF configs);
``analytic`` evaluates closed forms from config.json (torch-free, milliseconds); ``auto`` uses
trace when torch can build the model and analytic otherwise, and the estimate says which.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

from memfit.errors import MemfitError, MissingDependencyError, SpecError, TraceError
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
        return _analytic(source, workload, gpu_record)
    if engine == "auto" and _trace_stack_missing(source) and source.origin != "factory":
        est = _analytic(source, workload, gpu_record)
        return _with_note(est, f"engine auto: {_trace_stack_missing(source)}; used analytic")
    _require_trace_stack(source)
    try:
        return _trace(source, workload, gpu_record, extrapolate)
    except TraceError as exc:
        if engine != "auto" or source.origin == "factory":
            raise
        try:
            est = _analytic(source, workload, gpu_record)
        except MemfitError:
            raise exc from None
        return _with_note(est, f"engine auto: the trace engine failed ({exc}); used analytic")


def _analytic(source: Any, workload: WorkloadSpec, gpu: Any) -> MemoryEstimate:
    from memfit.estimate.analytic import estimate_analytic

    return estimate_analytic(source, workload, gpu=gpu)


def _trace(source: Any, workload: WorkloadSpec, gpu: Any, extrapolate: bool | None) -> Any:
    if source.origin == "factory":
        from memfit.estimate.trace.factory import trace_factory

        return trace_factory(source.factory or "", workload, gpu=gpu)
    from memfit.estimate.trace.engine import trace_hf

    return trace_hf(
        source.config or {},
        workload,
        name=source.name,
        gpu=gpu,
        trust_remote_code=source.trust_remote_code,
        extrapolate=extrapolate,
    )


def _with_note(est: MemoryEstimate, note: str) -> MemoryEstimate:
    return dataclasses.replace(est, notes=[note, *est.notes])


def _gpu(gpu: Any) -> Any:
    if gpu is None or not isinstance(gpu, str):
        return gpu
    from memfit.hardware import get_gpu

    return get_gpu(gpu)


def _trace_stack_missing(source: Any) -> str | None:
    """Why the trace engine cannot run here (a missing package), or None."""
    needed = ["torch"] if source.origin == "factory" else ["torch", "transformers"]
    for pkg in needed:
        if importlib.util.find_spec(pkg) is None:
            return f"{pkg} is not installed"
    return None


def _require_trace_stack(source: Any) -> None:
    missing = _trace_stack_missing(source)
    if missing:
        raise MissingDependencyError(
            f"the trace engine needs torch and transformers, but {missing}: "
            "pip install 'memfit[trace]' (install torch for your CUDA version first), "
            "or use --engine analytic"
        )
