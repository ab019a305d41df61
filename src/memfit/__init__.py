"""memfit: predict, plan and watch the GPU memory of large-model training and inference.

``import memfit`` does not import torch; the trace engine imports it when it runs.
"""

from __future__ import annotations

from typing import Any

from memfit.errors import (
    DoesNotFitError,
    HubUnavailableError,
    MemfitError,
    MissingDependencyError,
    ModelConfigError,
    SnapshotError,
    SpecError,
    TraceError,
    UnknownGPUError,
    UnknownModelError,
)
from memfit.estimate import estimate
from memfit.estimate.result import COMPONENTS, FitVerdict, MemoryEstimate, ModuleBytes, PhasePeak
from memfit.monitor import Monitor, diagnose, oom_guard  # torch is imported when one starts
from memfit.spec import WorkloadSpec

__version__ = "0.1.0"

__all__ = [
    "COMPONENTS",
    "DoesNotFitError",
    "FitVerdict",
    "HubUnavailableError",
    "MemfitError",
    "MemoryEstimate",
    "MissingDependencyError",
    "ModelConfigError",
    "Monitor",
    "ModuleBytes",
    "PhasePeak",
    "SnapshotError",
    "SpecError",
    "TraceError",
    "UnknownGPUError",
    "UnknownModelError",
    "WorkloadSpec",
    "__version__",
    "analyze_snapshot",
    "diagnose",
    "estimate",
    "fit",
    "oom_guard",
    "plan",
    "render_html_report",
    "trace_step",
]


def trace_step(*args: Any, **kwargs: Any) -> MemoryEstimate:
    """Trace the user's own step function on fake tensors (``memfit.estimate.trace.user_step``)."""
    from memfit.estimate.trace.user_step import trace_step as _trace_step

    return _trace_step(*args, **kwargs)


def analyze_snapshot(path: Any, *, top: int = 10, stream: bool | None = None) -> Any:
    """Summarise a CUDA memory snapshot pickle safely (``memfit.snapshot.analyze``)."""
    from memfit.snapshot.analyze import analyze_snapshot as _analyze

    return _analyze(path, top=top, stream=stream)


def render_html_report(log_path: Any, out_path: Any, estimate: Any = None) -> Any:
    """Write the self-contained HTML report of a run log (``memfit.report.html``)."""
    from memfit.report.html import render_html_report as _render

    return _render(log_path, out_path, estimate=estimate)


# The memfit.plan package is imported here (it is torch-free) so that the function below, not the
# package, is what ``memfit.plan`` names: importing a submodule later would rebind the attribute.
import memfit.plan as _plan_package  # noqa: E402


def plan(model: Any, request: Any = None, **kwargs: Any) -> Any:
    """The fastest technique combination that fits a GPU (``memfit.plan.plan``); request fields
    may be given as keywords: ``plan("llama-3.1-8b", gpu="L4", seq_len=4096, global_batch=16)``."""
    return _plan_package.plan(model, request, **kwargs)


def fit(model: Any, workload: WorkloadSpec, **kwargs: Any) -> Any:
    """The largest batch / sequence / concurrency that fits (``memfit.plan.fit``)."""
    return _plan_package.fit(model, workload, **kwargs)
