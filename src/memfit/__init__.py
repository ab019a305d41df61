"""memfit: predict, plan and watch the GPU memory of large-model training and inference.

``import memfit`` does not import torch; the trace engine imports it when it runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import typing
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
from memfit.version import __version__

#: The public names whose modules load on first use (PEP 562 ``__getattr__`` below), so that
#: ``import memfit`` and every ``memfit.x`` module the command line imports do not load the
#: engines, the planner and the monitor up front (issue 32: the CLI imported ~240 modules, 0.4 s,
#: before answering ``memfit models``). Name -> the module that defines it.
_LAZY = {
    **dict.fromkeys(
        ("COMPONENTS", "FitVerdict", "MemoryEstimate", "ModuleBytes", "PhasePeak"),
        "memfit.estimate.result",
    ),
    "ModelSpec": "memfit.models.model_spec",
    **dict.fromkeys(("Monitor", "diagnose", "oom_guard"), "memfit.monitor"),  # torch: when run
    **dict.fromkeys(
        (
            "DiffusionJob",
            "DiffusionTrainJob",
            "EstimateOptions",
            "Job",
            "LlamaCppJob",
            "MediaSpec",
            "SeqDist",
            "SeqRun",
            "SglangConfig",
            "VllmConfig",
            "WorkloadSpec",
        ),
        "memfit.spec",
    ),  # fmt: skip
    "ModelRef": "memfit.api",
    "PlanRequest": "memfit.plan.request",
}


def __getattr__(name: str) -> Any:
    """A public name of :data:`_LAZY`, imported now and kept; a memfit module not imported yet
    (``memfit.units``), as ``import memfit`` used to bind them all."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"memfit.{name}") is not None:
        return importlib.import_module(f"memfit.{name}")
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _PublicModule(types.ModuleType):
    """``memfit`` itself: its functions ``estimate``, ``plan`` and ``bench`` keep their names when
    the packages of the same names are imported later (the import system binds a subpackage on
    its parent; ``import memfit`` no longer imports those packages first)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("estimate", "plan", "bench") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _PublicModule

# Types only. The torch layers' functions (find_batch_size, apply_plan_, build_optimizer, bench,
# quality, trace_step) come with their own signatures, not a copy; at run time the wrappers below
# import them when called (``import memfit`` does not import torch). There the user's model is a
# torch.nn.Module and a step function a Callable[..., Any]: the user's code takes and returns
# what it likes.
if typing.TYPE_CHECKING:
    import os
    from pathlib import Path

    from memfit.api import ModelRef as ModelRef
    from memfit.api import SeqRunAnswer
    from memfit.apply.batch_size import find_batch_size as find_batch_size
    from memfit.apply.model import apply_plan_ as apply_plan_
    from memfit.apply.optimizers import build_optimizer as build_optimizer
    from memfit.bench.gate import quality as quality
    from memfit.bench.runner import bench as bench
    from memfit.estimate.diffusion.pipeline import PipelineEstimate
    from memfit.estimate.diffusion.train import TrainEstimate
    from memfit.estimate.llamacpp import LlamaCppEstimate
    from memfit.estimate.result import COMPONENTS as COMPONENTS
    from memfit.estimate.result import FitVerdict as FitVerdict
    from memfit.estimate.result import MemoryEstimate as MemoryEstimate
    from memfit.estimate.result import ModuleBytes as ModuleBytes
    from memfit.estimate.result import PhasePeak as PhasePeak
    from memfit.estimate.trace.user_step import trace_step as trace_step
    from memfit.hardware.gpu import GPU
    from memfit.models.model_spec import ModelSpec as ModelSpec
    from memfit.monitor import Monitor as Monitor
    from memfit.monitor import diagnose as diagnose
    from memfit.monitor import oom_guard as oom_guard
    from memfit.monitor.reader import RunData
    from memfit.plan.diffusion_fit import PipelineFit
    from memfit.plan.diffusion_infer import PipelinePlans
    from memfit.plan.diffusion_train import TrainFit, TrainPlan
    from memfit.plan.doctor_findings import DoctorReport
    from memfit.plan.request import PlanRequest as PlanRequest
    from memfit.plan.search import Plan
    from memfit.plan.seq_fit import SeqFitResult, SeqPlanResult
    from memfit.plan.solve import FitResult
    from memfit.plan.upgrade import UpgradeVerdict
    from memfit.serving.sglang import SglangStartup
    from memfit.serving.solve import ServingOption
    from memfit.serving.startup import VllmStartup
    from memfit.snapshot.analyze import SnapshotAnalysis
    from memfit.spec import DiffusionJob as DiffusionJob
    from memfit.spec import DiffusionTrainJob as DiffusionTrainJob
    from memfit.spec import EstimateOptions as EstimateOptions
    from memfit.spec import Job as Job
    from memfit.spec import LlamaCppJob as LlamaCppJob
    from memfit.spec import MediaSpec as MediaSpec
    from memfit.spec import SeqDist as SeqDist
    from memfit.spec import SeqRun as SeqRun
    from memfit.spec import SglangConfig as SglangConfig
    from memfit.spec import VllmConfig as VllmConfig
    from memfit.spec import WorkloadSpec as WorkloadSpec

__all__ = [
    "Job",
    "ModelRef",
    "COMPONENTS",
    "DiffusionJob",
    "DiffusionTrainJob",
    "DoesNotFitError",
    "EstimateOptions",
    "FitVerdict",
    "HubUnavailableError",
    "MemfitError",
    "MediaSpec",
    "MemoryEstimate",
    "MissingDependencyError",
    "ModelConfigError",
    "ModelSpec",
    "Monitor",
    "ModuleBytes",
    "NotModelledError",
    "PhasePeak",
    "PlanRequest",
    "SeqDist",
    "SeqRun",
    "SglangConfig",
    "SnapshotError",
    "SpecError",
    "TraceError",
    "UnknownGPUError",
    "UnknownModelError",
    "VllmConfig",
    "WorkloadSpec",
    "LlamaCppJob",
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


# Imported here (torch-free, like memfit.plan below) so that importing memfit.bench.runner later
# does not rebind ``memfit.bench`` from the function to the package.
import memfit.bench as _bench_package  # noqa: E402

if not typing.TYPE_CHECKING:  # at run time: the same functions, imported when called (as before)

    def trace_step(*args: Any, **kwargs: Any) -> Any:
        """Trace the user's own step function on fake tensors
        (``memfit.estimate.trace.user_step``)."""
        from memfit.estimate.trace.user_step import trace_step as _trace_step

        return _trace_step(*args, **kwargs)

    def apply_plan_(model: Any, plan: Any, **kwargs: Any) -> Any:
        """Make ``model`` run ``plan`` (a Plan, PlanOption or WorkloadSpec) with the ecosystem's
        libraries; returns the model to train (``memfit.apply.model.apply_plan_``)."""
        from memfit.apply.model import apply_plan_ as _apply

        return _apply(model, plan, **kwargs)

    def build_optimizer(model: Any, plan: Any, **kwargs: Any) -> Any:
        """The plan's optimizer over the model's trainable parameters
        (``memfit.apply.optimizers``)."""
        from memfit.apply.optimizers import build_optimizer as _build

        return _build(model, plan, **kwargs)

    def find_batch_size(step_fn: Any, **kwargs: Any) -> Any:
        """The largest batch that really runs, starting from memfit's estimate and confirmed with
        real steps at the worst-case sequence length (``memfit.apply.batch_size``)."""
        from memfit.apply.batch_size import find_batch_size as _find

        return _find(step_fn, **kwargs)

    def bench(model: str = "opt-125m", **kwargs: Any) -> Any:
        """Run a real small model as the baseline, with each technique and with the combined
        plan; measured peak vs memfit's estimate, speed and quality (``memfit.bench.bench``)."""
        return _bench_package.bench(model, **kwargs)

    def quality(model: str = "minilm", **kwargs: Any) -> Any:
        """Quality gate: a quantized copy of ``model`` vs the original on packaged text — KL,
        top-1, cosine, pass/fail (``memfit.bench.gate``)."""
        return _bench_package.quality(model, **kwargs)


def analyze_snapshot(
    path: str | Path, *, top: int = 10, stream: bool | None = None
) -> SnapshotAnalysis:
    """Summarise a CUDA memory snapshot pickle safely (``memfit.snapshot.analyze``)."""
    from memfit.snapshot.analyze import analyze_snapshot as _analyze

    return _analyze(path, top=top, stream=stream)


def render_html_report(
    log_path: str | Path | RunData,
    out_path: str | Path,
    estimate: str | os.PathLike[str] | dict[str, Any] | MemoryEstimate | None = None,
) -> Path:
    """Write the self-contained HTML report of a run log (``memfit.report.html``); ``estimate``:
    a ``memfit estimate --json`` file, its dict, or a MemoryEstimate (``dict[str, Any]``: the
    JSON's values are of many types)."""
    from memfit.report.html import render_html_report as _render

    return _render(log_path, out_path, estimate=estimate)


def _routes() -> Any:
    """:mod:`memfit.api`, the one door, imported when a verb first runs (every engine's and the
    planner's modules: ~0.3 s that ``import memfit`` does not pay)."""
    import memfit.api

    return memfit.api


#: The keywords the verbs took before EstimateOptions, with their defaults.
_OLD_OPTIONS = {"engine": "auto", "trust_remote_code": False, "extrapolate": None}


@typing.overload
def estimate(
    model: ModelRef,
    workload: WorkloadSpec | None = None,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> MemoryEstimate: ...
@typing.overload
def estimate(
    model: ModelRef,
    workload: SeqRun,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> SeqRunAnswer: ...
@typing.overload
def estimate(
    model: ModelRef,
    workload: DiffusionJob,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> PipelineEstimate: ...
@typing.overload
def estimate(
    model: ModelRef,
    workload: DiffusionTrainJob,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> TrainEstimate: ...
@typing.overload
def estimate(
    model: ModelRef,
    workload: VllmConfig,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> VllmStartup: ...
@typing.overload
def estimate(
    model: ModelRef,
    workload: SglangConfig,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> SglangStartup: ...
@typing.overload
def estimate(
    model: ModelRef,
    workload: LlamaCppJob,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> LlamaCppEstimate: ...
def estimate(
    model: ModelRef,
    workload: Job | None = None,
    *,
    gpu: str | GPU | None = None,
    engine: str = "auto",
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
) -> (
    MemoryEstimate | SeqRunAnswer | PipelineEstimate | TrainEstimate | VllmStartup
    | SglangStartup | LlamaCppEstimate
):  # fmt: skip
    """The memory of ``workload``, any job of :mod:`memfit.spec` (default: a bf16 AdamW training
    step, batch 1, seq 512): a :class:`WorkloadSpec` gives a :class:`MemoryEstimate`; the other
    kinds their own records (``memfit.api``). ``options`` (an :class:`EstimateOptions`), or its
    fields as keywords: ``engine``, ``trust_remote_code``, ``extrapolate`` (None traces models up
    to 48 layers whole, deeper ones in part), ``allow_code`` (a ``pkg.mod:fn`` MODEL may be
    imported and called)."""
    old: dict[str, Any] = {
        "engine": engine,
        "trust_remote_code": trust_remote_code,
        "extrapolate": extrapolate,
    }
    opts = _options(options, allow_code, workload=workload, gpu=gpu, **old)
    return _routes().estimate(model, workload, gpu=gpu, options=opts)


# plan / fit **kwargs: the planner's fields (PlanRequest's; a job kind's: concurrency, solve,
# gpu_memory_bytes...), of several types; the route checks them.
@typing.overload
def plan(
    model: ModelRef,
    request: PlanRequest | None = None,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> Plan: ...
@typing.overload
def plan(
    model: ModelRef,
    request: SeqRun,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> SeqPlanResult: ...
@typing.overload
def plan(
    model: ModelRef,
    request: DiffusionTrainJob,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> TrainPlan: ...
@typing.overload
def plan(
    model: ModelRef,
    request: DiffusionJob,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> PipelinePlans: ...
@typing.overload
def plan(
    model: ModelRef,
    request: VllmConfig,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> list[ServingOption]: ...
def plan(
    model: ModelRef,
    request: Job | PlanRequest | None = None,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> Plan | SeqPlanResult | TrainPlan | PipelinePlans | list[ServingOption]:
    """The fastest technique combination that fits a GPU (``memfit.plan.plan``); request fields
    may be given as keywords: ``plan("llama-3.1-8b", gpu="L4", seq_len=4096, global_batch=16)``.
    ``request`` may be any job of :mod:`memfit.spec` with a planner (``memfit.api``).
    ``allow_code=True``: a ``pkg.mod:fn`` MODEL may be imported and called (as for the others)."""
    job: Any = request  # any kind; the route answers with that kind's record
    return _routes().plan(model, job, options=_options(options, allow_code), **kwargs)


@typing.overload
def fit(
    model: ModelRef,
    workload: WorkloadSpec,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> FitResult: ...
@typing.overload
def fit(
    model: ModelRef,
    workload: SeqRun,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> SeqFitResult: ...
@typing.overload
def fit(
    model: ModelRef,
    workload: DiffusionTrainJob,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> TrainFit: ...
@typing.overload
def fit(
    model: ModelRef,
    workload: DiffusionJob,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> PipelineFit: ...
@typing.overload
def fit(
    model: ModelRef,
    workload: VllmConfig,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> tuple[int, VllmStartup | None]: ...
@typing.overload
def fit(
    model: ModelRef,
    workload: SglangConfig,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> tuple[int, SglangStartup | None]: ...
@typing.overload
def fit(
    model: ModelRef,
    workload: LlamaCppJob,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> tuple[int, LlamaCppEstimate]: ...
def fit(
    model: ModelRef,
    workload: Job,
    *,
    allow_code: bool = False,
    options: EstimateOptions | None = None,
    **kwargs: Any,
) -> (
    FitResult | SeqFitResult | TrainFit | PipelineFit | tuple[int, VllmStartup | None]
    | tuple[int, SglangStartup | None] | tuple[int, LlamaCppEstimate]
):  # fmt: skip
    """The largest batch / sequence / concurrency that fits (``memfit.plan.fit``; the other job
    kinds: ``memfit.api``)."""
    opts = _options(options, allow_code, workload=workload, required=True)
    job: Any = workload  # any kind; the route answers with that kind's record
    return _routes().fit(model, job, options=opts, **kwargs)


# upgrade_verdict / doctor **kwargs: memfit.plan.upgrade_verdict's / doctor's keywords, typed there.
def upgrade_verdict(model: ModelRef, *, allow_code: bool = False, **kwargs: Any) -> UpgradeVerdict:
    """The "when should you upgrade" checklist as a verdict (``memfit.plan.upgrade_verdict``)."""
    from memfit.plan import upgrade_verdict as _upgrade_verdict

    with _code_allowed(allow_code):
        return _upgrade_verdict(model, **kwargs)


def doctor(
    model: ModelRef, workload: WorkloadSpec, *, allow_code: bool = False, **kwargs: Any
) -> DoctorReport:
    """A described job checked for the seven common memory mistakes (``memfit.plan.doctor``)."""
    from memfit.plan import doctor as _doctor

    with _code_allowed(allow_code, workload=workload):
        return _doctor(model, workload, **kwargs)


def _options(
    options: Any,
    allow_code: Any,
    *,
    workload: Any = True,
    required: bool = False,
    **old: Any,
) -> EstimateOptions:
    """The options of a call: ``options``, or the old keywords (checked as before, every problem
    together); both given is refused."""

    given = {k: v for k, v in old.items() if k in _OLD_OPTIONS and v != _OLD_OPTIONS[k]}
    if options is not None:
        if given or allow_code is not False:
            names = ", ".join([*given, *(["allow_code"] if allow_code is not False else [])])
            raise SpecError(f"{names}: give them in options ({options!r}), not beside it")
        return options  # type: ignore[no-any-return]
    api = _routes()
    job_kinds = tuple(api.ROUTES)
    arguments = {k: v for k, v in old.items() if k != "engine"}
    if workload is not True and not isinstance(workload, job_kinds):
        arguments["workload"] = workload
    api.check_arguments(allow_code=allow_code, **arguments)
    if required and workload is None:
        raise SpecError("workload (None) must be a WorkloadSpec: pass memfit.WorkloadSpec(...)")
    return api.EstimateOptions(
        engine=old.get("engine", "auto"),
        trust_remote_code=old.get("trust_remote_code", False),
        extrapolate=old.get("extrapolate"),
        allow_code=allow_code,
    )


def _code_allowed(allow_code: Any, **arguments: Any) -> Any:
    """The arguments checked, then the context in which ``pkg.mod:fn`` MODELs may resolve."""

    api = _routes()
    api.check_arguments(allow_code=allow_code, **arguments)
    if arguments.get("workload", True) is None:
        raise SpecError("workload (None) must be a WorkloadSpec: pass memfit.WorkloadSpec(...)")
    return api.using_options(api.EstimateOptions(allow_code=allow_code))
