"""Estimate the peak GPU memory of a job: ``estimate(model, workload, gpu=...)``.

Engines: ``trace`` runs the model on fake tensors (needs torch, and transformers for HF configs);
``analytic`` evaluates closed forms from config.json (torch-free, milliseconds); ``auto`` uses
the analytic engine where the fast-path grid validates it for the job
(:mod:`memfit.estimate.fastpath`; the trace confirms it on request or near the capacity), else
a cached derived form or the trace, and the estimate says which and whether it was confirmed. The
choice is :class:`memfit.estimate.policy.EnginePolicy`'s; the checks before an engine runs and the
estimate's assembly after are :mod:`memfit.estimate.pipeline`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.estimate.result import COMPONENTS, MemoryEstimate
from memfit.hardware import get_gpu
from memfit.hardware.precision import FP16_COUNTERPART
from memfit.models import ModelSource, resolve_model, take_media
from memfit.models.media import describe_inputs
from memfit.spec import WorkloadSpec
from memfit.spec.arguments import check_arguments
from memfit.spec.options import ENGINES

__all__ = ["COMPONENTS", "ENGINES", "MemoryEstimate", "estimate", "estimate_with"]


def estimate(
    model: Any,
    workload: WorkloadSpec | None = None,
    *,
    gpu: str | Any = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
) -> MemoryEstimate:
    """Estimate ``model`` (a MODEL string — bundled name, path, hub id, or with
    ``allow_code=True`` a ``pkg.mod:factory`` — or a ``ModelSource``) running ``workload``
    (default: a bf16 AdamW training step, batch 1, seq 512).

    ``extrapolate``: None (default) traces every layer of models up to 48 layers and extrapolates
    deeper ones from a few layers; True/False force either. ``allow_code``: a ``pkg.mod:fn``
    MODEL is imported and called (runs that code); refused without it."""

    check_arguments(
        workload=workload,
        trust_remote_code=trust_remote_code,
        extrapolate=extrapolate,
        allow_code=allow_code,
        gpu=gpu,
    )
    from memfit.estimate.policy import EnginePolicy  # every fast engine: loaded when one runs

    policy = EnginePolicy(engine=engine)
    workload = workload or WorkloadSpec()
    gpu_record = _gpu(gpu)
    source = (
        take_media(model, workload.media)
        if isinstance(model, ModelSource)
        else resolve_model(
            model,
            trust_remote_code=trust_remote_code,
            allow_code=allow_code or None,
            media=workload.media,
        )
    )
    workload, precision_note = settled_for(workload, source, gpu_record)
    est = policy.estimate(source, workload, gpu_record, extrapolate=extrapolate)
    if precision_note is not None and workload.mode == "train":
        est = dataclasses.replace(est, notes=[*est.notes, precision_note])
    elif gpu_record is not None and not gpu_record.supports_bf16 and _bf16(workload.precision):
        fp16 = FP16_COUNTERPART.get(str(workload.precision), workload.precision)
        note = (
            f"precision {workload.precision} on {gpu_record.name}: this GPU has no bf16 tensor "
            f"cores; run {fp16} (the same bytes, fp16 with loss scaling) — bf16 kernels are "
            "emulated or refused there"
        )
        est = dataclasses.replace(est, notes=[*est.notes, note])
    return _with_inputs(est, source, workload)


def settled_for(workload: WorkloadSpec, source: Any, gpu: Any) -> tuple[WorkloadSpec, str | None]:
    """``workload`` with a defaulted precision settled for ``gpu`` (fp16 where it has no bf16)
    and ``source``'s checkpoint dtype, and the line saying which default applied (None: the
    precision was given): the job every surface (estimate, fit, doctor) judges."""
    return workload.settle_precision(
        bf16=bool(getattr(gpu, "supports_bf16", True)), checkpoint_dtype=checkpoint_dtype(source)
    )


def _bf16(precision: str | None) -> bool:
    return precision is not None and precision.startswith("bf16")


def checkpoint_dtype(source: Any) -> str | None:
    """The dtype ``source``'s checkpoint is stored in (config.json's ``dtype`` /
    ``torch_dtype``; for a multimodal model its text model's), None when it does not say."""
    spec = getattr(source, "spec", None)
    while spec is not None:
        if spec.dtype:
            return str(spec.dtype)
        spec = spec.text
    return None


def _with_inputs(est: MemoryEstimate, source: Any, workload: WorkloadSpec) -> MemoryEstimate:
    """An image / speech model's estimate says its workload in its own terms
    (``workload["inputs"]``: image size and patches, or audio seconds and windows)."""

    w = est.workload
    inputs = describe_inputs(source.config or {}, w["batch_size"], w["seq_len"], workload.media)
    if not inputs:
        return est
    return dataclasses.replace(est, workload={**w, "inputs": inputs})


def _gpu(gpu: Any) -> Any:
    if gpu is None or not isinstance(gpu, str):
        return gpu

    return get_gpu(gpu)


def estimate_with(model: Any, workload: WorkloadSpec, *, gpu: Any, options: Any) -> MemoryEstimate:
    """:func:`estimate` with an :class:`~memfit.spec.EstimateOptions`' fields (engine, remote
    code, extrapolation, factories): the one text route of ``memfit estimate`` and of
    :func:`memfit.api.estimate`."""
    return estimate(
        model,
        workload,
        gpu=gpu,
        engine=options.engine,
        trust_remote_code=options.trust_remote_code,
        extrapolate=options.extrapolate,
        allow_code=options.allow_code,
    )
