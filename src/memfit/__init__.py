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
    NotModelledError,
    SnapshotError,
    SpecError,
    TraceError,
    UnknownGPUError,
    UnknownModelError,
)
from memfit.estimate import estimate
from memfit.estimate.result import COMPONENTS, FitVerdict, MemoryEstimate, ModuleBytes, PhasePeak
from memfit.models.model_spec import ModelSpec
from memfit.monitor import Monitor, diagnose, oom_guard  # torch is imported when one starts
from memfit.spec import WorkloadSpec
from memfit.version import __version__

__all__ = [
    "COMPONENTS",
    "DoesNotFitError",
    "FitVerdict",
    "HubUnavailableError",
    "MemfitError",
    "MemoryEstimate",
    "MissingDependencyError",
    "ModelConfigError",
    "ModelSpec",
    "Monitor",
    "ModuleBytes",
    "NotModelledError",
    "PhasePeak",
    "SnapshotError",
    "SpecError",
    "TraceError",
    "UnknownGPUError",
    "UnknownModelError",
    "WorkloadSpec",
    "__version__",
    "analyze_snapshot",
    "apply_plan_",
    "bench",
    "build_optimizer",
    "diagnose",
    "doctor",
    "estimate",
    "find_batch_size",
    "fit",
    "oom_guard",
    "plan",
    "quality",
    "render_html_report",
    "trace_step",
    "upgrade_verdict",
]


def trace_step(*args: Any, **kwargs: Any) -> MemoryEstimate:
    """Trace the user's own step function on fake tensors (``memfit.estimate.trace.user_step``)."""
    from memfit.estimate.trace.user_step import trace_step as _trace_step

    return _trace_step(*args, **kwargs)


def apply_plan_(model: Any, plan: Any, **kwargs: Any) -> Any:
    """Make ``model`` run ``plan`` (a Plan, PlanOption or WorkloadSpec) with the ecosystem's
    libraries; returns the model to train (``memfit.apply.model.apply_plan_``)."""
    from memfit.apply.model import apply_plan_ as _apply

    return _apply(model, plan, **kwargs)


def build_optimizer(model: Any, plan: Any, **kwargs: Any) -> Any:
    """The plan's optimizer over the model's trainable parameters (``memfit.apply.optimizers``)."""
    from memfit.apply.optimizers import build_optimizer as _build

    return _build(model, plan, **kwargs)


def find_batch_size(step_fn: Any, **kwargs: Any) -> Any:
    """The largest batch that really runs, starting from memfit's estimate and confirmed with
    real steps at the worst-case sequence length (``memfit.apply.batch_size``)."""
    from memfit.apply.batch_size import find_batch_size as _find

    return _find(step_fn, **kwargs)


# Imported here (torch-free, like memfit.plan below) so that importing memfit.bench.runner later
# does not rebind ``memfit.bench`` from the function to the package.
import memfit.bench as _bench_package  # noqa: E402


def bench(model: str = "opt-125m", **kwargs: Any) -> Any:
    """Run a real small model as the baseline, with each technique and with the combined plan;
    measured peak vs memfit's estimate, speed and quality (``memfit.bench.bench``)."""
    return _bench_package.bench(model, **kwargs)


def quality(model: str = "minilm", **kwargs: Any) -> Any:
    """Quality gate: a quantized copy of ``model`` vs the original on packaged text — KL, top-1,
    cosine, pass/fail (``memfit.bench.gate``)."""
    return _bench_package.quality(model, **kwargs)


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


def plan(model: Any, request: Any = None, *, allow_code: bool = False, **kwargs: Any) -> Any:
    """The fastest technique combination that fits a GPU (``memfit.plan.plan``); request fields
    may be given as keywords: ``plan("llama-3.1-8b", gpu="L4", seq_len=4096, global_batch=16)``.
    ``allow_code=True``: a ``pkg.mod:fn`` MODEL may be imported and called (as for the others)."""
    with _code_allowed(allow_code):
        return _plan_package.plan(model, request, **kwargs)


def fit(model: Any, workload: WorkloadSpec, *, allow_code: bool = False, **kwargs: Any) -> Any:
    """The largest batch / sequence / concurrency that fits (``memfit.plan.fit``)."""
    with _code_allowed(allow_code, workload=workload):
        return _plan_package.fit(model, workload, **kwargs)


def upgrade_verdict(model: Any, *, allow_code: bool = False, **kwargs: Any) -> Any:
    """The "when should you upgrade" checklist as a verdict (``memfit.plan.upgrade_verdict``)."""
    with _code_allowed(allow_code):
        return _plan_package.upgrade_verdict(model, **kwargs)


def doctor(model: Any, workload: WorkloadSpec, *, allow_code: bool = False, **kwargs: Any) -> Any:
    """A described job checked for the seven common memory mistakes (``memfit.plan.doctor``)."""
    with _code_allowed(allow_code, workload=workload):
        return _plan_package.doctor(model, workload, **kwargs)


def _code_allowed(allow_code: Any, **arguments: Any) -> Any:
    """The arguments checked, then the context in which ``pkg.mod:fn`` MODELs may resolve."""
    from memfit.models.source import allowing_code
    from memfit.spec.arguments import check_arguments

    check_arguments(allow_code=allow_code, **arguments)
    if arguments.get("workload", True) is None:
        raise SpecError("workload (None) must be a WorkloadSpec: pass memfit.WorkloadSpec(...)")
    import contextlib

    return allowing_code(True) if allow_code else contextlib.nullcontext()
