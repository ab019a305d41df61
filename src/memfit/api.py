"""The one door (torch-free): :func:`estimate`, :func:`fit` and :func:`plan` of any job.

Each verb dispatches on the job's type (:data:`ROUTES`); the engines behind it import torch only
when they run. How the job is answered is an :class:`~memfit.spec.options.EstimateOptions`,
applied once (:func:`memfit.estimate.options.using_options`).

:data:`ROUTES` (job type -> estimate, fit, plan):

- ``WorkloadSpec`` (a text step): ``memfit.estimate.estimate``; ``memfit.plan.fit``; plan:
  NotModelledError (a search takes a ``PlanRequest``).
- ``PlanRequest`` (what the planner searches): estimate / fit: NotModelledError (one job is a
  ``WorkloadSpec``); ``memfit.plan.plan``.
- ``SeqRun`` (a variable-length run): the estimate at the longest step, then
  ``estimate.seqrun.run.estimate_seq_run`` (a :class:`SeqRunAnswer`);
  ``plan.seq_fit.fit_seq_dist``; ``plan.seq_fit.plan_seq_dist``.
- ``DiffusionJob`` (a pipeline call): ``estimate.diffusion.pipelines.estimate_pipeline``;
  ``plan.diffusion_fit.fit_pipeline`` (batch, resolution); ``plan.diffusion_infer.plan_pipeline``.
- ``DiffusionTrainJob`` (a diffusers training script): ``estimate.diffusion.train_fast.
  estimate_training_fast``; ``plan.diffusion_train.fit_training``; ``plan_training``.
- ``VllmConfig`` (``vllm serve``): ``serving.simulate_startup``; ``serving.solve.
  solve_concurrency`` / ``solve_max_model_len``; ``serving.solve.plan_serving``.
- ``SglangConfig`` (``sglang.launch_server``): ``serving.sglang.simulate_sglang``;
  ``serving.sglang_fit.solve_sglang`` (context length, running requests); plan: NotModelledError.
- ``LlamaCppJob`` (``llama-server`` / Ollama): ``serving.llamacpp.estimate_llamacpp``; fit: the
  largest ``-ngl`` or ``-c`` (``serving.llamacpp.largest_ngl`` / ``largest_ctx``); plan:
  NotModelledError naming fit.

A (job, verb) with no planner raises :class:`~memfit.errors.NotModelledError` naming the kind
and the next step; a value that is no job is a :class:`~memfit.errors.SpecError`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import estimate_with, settled_for
from memfit.estimate.diffusion.route import estimate_pipeline  # derived or a cache hit: no torch
from memfit.estimate.llamacpp import estimate_llamacpp, largest_ctx, largest_ngl
from memfit.estimate.options import using_options
from memfit.estimate.verdict import judge_point
from memfit.hardware import get_gpu
from memfit.models import ModelSource, resolve_model
from memfit.models.gguf import resolve_gguf
from memfit.models.pipelines import find_pipeline, pipeline_dir
from memfit.plan import fit as fit_step
from memfit.plan import plan as search
from memfit.plan.budget import DEFAULT_HEADROOM, Budget
from memfit.plan.diffusion_code import job_flags
from memfit.plan.diffusion_fit import fit_pipeline
from memfit.plan.diffusion_infer import plan_pipeline
from memfit.plan.diffusion_train import fit_training, plan_training
from memfit.plan.request import PlanRequest
from memfit.progress import report
from memfit.serving import simulate_startup
from memfit.serving.command import hub_id
from memfit.serving.sglang import simulate_sglang
from memfit.serving.sglang_fit import solve_sglang
from memfit.serving.solve import plan_serving, solve_concurrency, solve_max_model_len
from memfit.serving.vision import served_spec
from memfit.spec import (
    DiffusionJob,
    DiffusionTrainJob,
    EstimateOptions,
    Job,
    LlamaCppJob,
    SeqRun,
    SglangConfig,
    VllmConfig,
    WorkloadSpec,
)
from memfit.spec.arguments import check_arguments  # noqa: F401 - memfit's facades call it here

if TYPE_CHECKING:  # the diffusion records live in torch modules: types only
    from memfit.estimate.diffusion.pipeline import PipelineEstimate
    from memfit.estimate.diffusion.train import TrainEstimate
    from memfit.estimate.llamacpp import LlamaCppEstimate
    from memfit.estimate.result import MemoryEstimate
    from memfit.estimate.seqrun.run import SeqRunEstimate
    from memfit.hardware.gpu import GPU
    from memfit.models.model_spec import ModelSpec
    from memfit.plan.diffusion_fit import PipelineFit
    from memfit.plan.diffusion_infer import PipelinePlans
    from memfit.plan.diffusion_train import TrainFit, TrainPlan
    from memfit.plan.search import Plan
    from memfit.plan.seq_fit import SeqFitResult, SeqPlanResult
    from memfit.plan.solve import FitResult
    from memfit.serving.sglang import SglangStartup
    from memfit.serving.solve import ServingOption
    from memfit.serving.startup import VllmStartup

#: MODEL: a bundled name, a config.json path or model dir, a hub id, ``package.module:function``
#: (with ``allow_code``), or a model already resolved.
ModelRef = str | os.PathLike[str] | ModelSource
#: A GPU: a catalog name (``memfit gpus``) or its record.

VERBS = ("estimate", "fit", "plan")


@overload
def estimate(
    model: ModelRef,
    job: WorkloadSpec | None = None,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> MemoryEstimate: ...
@overload
def estimate(
    model: ModelRef,
    job: SeqRun,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> SeqRunAnswer: ...
@overload
def estimate(
    model: ModelRef,
    job: DiffusionJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> PipelineEstimate: ...
@overload
def estimate(
    model: ModelRef,
    job: DiffusionTrainJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> TrainEstimate: ...
@overload
def estimate(
    model: ModelRef,
    job: VllmConfig,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> VllmStartup: ...
@overload
def estimate(
    model: ModelRef,
    job: SglangConfig,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> SglangStartup: ...
@overload
def estimate(
    model: ModelRef,
    job: LlamaCppJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> LlamaCppEstimate: ...
def estimate(
    model: ModelRef,
    job: Job | None = None,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
) -> (
    MemoryEstimate | SeqRunAnswer | PipelineEstimate | TrainEstimate | VllmStartup
    | SglangStartup | LlamaCppEstimate
):  # fmt: skip
    """The memory of ``job`` (default: a bf16 AdamW training step, batch 1, seq 512) on
    ``model``; ``gpu`` (a catalog name or record) adds the verdict where the job has one. The
    answer's type follows the job's (the overloads above); each reads as an
    :class:`~memfit.estimate.answer.Answer` (a SeqRun's: its ``run``)."""
    return _dispatch("estimate", model, WorkloadSpec() if job is None else job, gpu, options, {})


@overload
def fit(
    model: ModelRef,
    job: WorkloadSpec,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> FitResult: ...
@overload
def fit(
    model: ModelRef,
    job: SeqRun,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> SeqFitResult: ...
@overload
def fit(
    model: ModelRef,
    job: DiffusionJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> PipelineFit: ...
@overload
def fit(
    model: ModelRef,
    job: DiffusionTrainJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> TrainFit: ...
@overload
def fit(
    model: ModelRef,
    job: VllmConfig,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> tuple[int, VllmStartup | None]: ...
@overload
def fit(
    model: ModelRef,
    job: SglangConfig,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> tuple[int, SglangStartup | None]: ...
@overload
def fit(
    model: ModelRef,
    job: LlamaCppJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> tuple[int, LlamaCppEstimate]: ...
def fit(
    model: ModelRef,
    job: Job,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **solve: Any,
) -> (
    FitResult
    | SeqFitResult
    | TrainFit
    | PipelineFit
    | tuple[int, VllmStartup | None]
    | tuple[int, SglangStartup | None]
    | tuple[int, LlamaCppEstimate]
):
    """The largest batch / length / resolution / concurrency of ``job`` that fits; ``solve``:
    what to solve and the budget (``solve="batch"``, ``gpu_memory_bytes``, ``headroom``). The
    answer's type follows the job's (the overloads above; a DiffusionJob solves ``batch`` or
    ``resolution``)."""
    return _dispatch("fit", model, job, gpu, options, solve)


@overload
def plan(
    model: ModelRef,
    job: PlanRequest | None = None,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **request: Any,
) -> Plan: ...
@overload
def plan(
    model: ModelRef,
    job: SeqRun,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **request: Any,
) -> SeqPlanResult: ...
@overload
def plan(
    model: ModelRef,
    job: DiffusionJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **request: Any,
) -> PipelinePlans: ...
@overload
def plan(
    model: ModelRef,
    job: DiffusionTrainJob,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **request: Any,
) -> TrainPlan: ...
@overload
def plan(
    model: ModelRef,
    job: VllmConfig,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **request: Any,
) -> list[ServingOption]: ...
def plan(
    model: ModelRef,
    job: Job | PlanRequest | None = None,
    *,
    gpu: str | GPU | None = None,
    options: EstimateOptions | None = None,
    **request: Any,
) -> Plan | SeqPlanResult | TrainPlan | PipelinePlans | list[ServingOption]:
    """The techniques that make ``job`` fit; ``request``: the planner's fields (for a text
    model, :class:`~memfit.plan.PlanRequest` fields; for a serving job, ``concurrency``). The
    answer's type follows the job's (the overloads above; a fixed WorkloadSpec has no planner:
    NotModelledError; a DiffusionJob's: ``gpu_memory_bytes``, ``headroom``, ``n_plans``)."""
    return _dispatch("plan", model, PlanRequest() if job is None else job, gpu, options, request)


def _dispatch(
    verb: str, model: Any, job: Any, gpu: Any, options: Any, extra: dict[str, Any]
) -> Any:
    if options is not None and not isinstance(options, EstimateOptions):
        raise SpecError(
            f"options ({options!r}) must be an EstimateOptions: pass "
            "memfit.spec.EstimateOptions(engine=..., allow_code=...)"
        )
    opts = options or EstimateOptions()
    route = route_of(job, verb)
    with using_options(opts):
        return route(model, job, gpu=gpu, options=opts, **extra)


def route_of(job: Any, verb: str) -> Callable[..., Any]:
    """The function that answers ``verb`` for ``job``; NotModelledError when none does."""
    kind = next((k for k in ROUTES if isinstance(job, k)), None)
    if kind is None:
        names = ", ".join(k.__name__ for k in ROUTES)
        raise SpecError(f"job ({job!r}) must be one of {names} (memfit.spec)")
    answer = ROUTES[kind][VERBS.index(verb)]
    if isinstance(answer, str):
        raise NotModelledError(answer, engine=verb)
    return answer


def _gpu(gpu: Any) -> Any:
    return get_gpu(gpu) if isinstance(gpu, str) else gpu


def _source(model: Any, options: EstimateOptions) -> Any:
    if isinstance(model, ModelSource):
        return model
    return resolve_model(model, trust_remote_code=options.trust_remote_code)


# -- text: one step, a search ------------------------------------------------------------------
def _estimate_text(model: Any, job: WorkloadSpec, *, gpu: Any, options: EstimateOptions) -> Any:
    return estimate_with(model, job, gpu=gpu, options=options)


def _fit_text(model: Any, job: WorkloadSpec, *, gpu: Any, options: Any, **solve: Any) -> Any:
    source = _source(model, options)
    gpu_rec = _gpu(gpu)
    job, note = settled_for(job, source, gpu_rec)
    result = fit_step(source, job, **({"gpu": gpu_rec} if gpu_rec is not None else {}), **solve)
    if note is not None and job.mode == "train":
        result.notes.append(note)
    return result


def _plan_text(model: Any, job: PlanRequest, *, gpu: Any, options: Any, **request: Any) -> Any:
    return search(model, job, **({"gpu": gpu} if gpu is not None else {}), **request)


# -- a variable-length run -----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SeqRunAnswer:
    """A variable-length run: the estimate of its longest step and the run replayed (with a GPU,
    capped at what its memory leaves after the CUDA context). With a GPU, ``run.fits`` is THE
    verdict of the run (:func:`memfit.estimate.verdict.judge_point` of ``run.need_bytes`` on the
    estimate's budget): what ``estimate --seq-dist`` prints and exits with."""

    estimate: MemoryEstimate
    run: SeqRunEstimate


def _estimate_seq(model: Any, job: SeqRun, *, gpu: Any, options: EstimateOptions) -> Any:
    source = _source(model, options)
    est = _estimate_text(
        source, dataclasses.replace(job.workload, seq_len=job.longest_step), gpu=gpu,
        options=options,
    )  # fmt: skip
    overhead_bytes = est.device_used_bytes - est.peak_reserved_bytes
    capacity = None if est.fits is None else est.fits.capacity_bytes - overhead_bytes
    from memfit.estimate.seqrun.run import estimate_seq_run  # numpy: only a --seq-dist run needs it

    run = estimate_seq_run(
        source, job.workload, job.dist, job.steps, gpu=_gpu(gpu) if gpu else None,
        capacity_bytes=capacity, progress=report,
    )  # fmt: skip
    run = dataclasses.replace(run, overhead_bytes=overhead_bytes)  # CUDA context and the like
    if est.fits is not None:  # THE verdict rule, on the estimate's budget (the replay: no range)
        run = dataclasses.replace(
            run,
            fits=judge_point(run.need_bytes, est.fits.capacity_bytes, est.fits.headroom_bytes),
        )
    return SeqRunAnswer(estimate=est, run=run)


def _fit_seq(
    model: Any, job: SeqRun, *, gpu: Any, options: EstimateOptions, solve: str = "batch",
    gpu_memory_bytes: int | None = None, headroom: float | None = None,
) -> Any:  # fmt: skip
    if solve != "batch":
        raise NotModelledError(
            f"fit of a SeqRun solves batch, not {solve!r}: the distribution gives the lengths; "
            "solve a fixed shape with a WorkloadSpec instead",
            engine="fit",
        )
    from memfit.plan.seq_fit import fit_seq_dist  # numpy: only a --seq-dist run needs it

    return fit_seq_dist(
        _source(model, options), job.workload, job.dist, job.steps,
        gpu=_gpu(gpu) if gpu else None, gpu_memory_bytes=gpu_memory_bytes,
        headroom=DEFAULT_HEADROOM if headroom is None else headroom, progress=report,
    )  # fmt: skip


def _plan_seq(
    model: Any, job: SeqRun, *, gpu: Any, options: EstimateOptions,
    gpu_memory_bytes: int | None = None, request: PlanRequest | None = None, **fields: Any,
) -> Any:  # fmt: skip
    asked = dataclasses.replace(request or PlanRequest(), **fields)
    from memfit.plan.seq_fit import plan_seq_dist  # numpy: only a --seq-dist run needs it

    return plan_seq_dist(
        _source(model, options), asked, job.dist, job.steps, gpu=gpu,
        gpu_memory_bytes=gpu_memory_bytes, progress=report,
    )  # fmt: skip


# -- diffusion -----------------------------------------------------------------------------------
def _pipeline_root(model: Any) -> Any:
    root = pipeline_dir(str(model))
    if root is None:
        raise SpecError(
            f"model ({model!r}) is not a diffusion pipeline: a bundled pipeline (`memfit "
            "models`), its hub id, or a directory with a model_index.json"
        )
    return root


def _estimate_pipeline(model: Any, job: DiffusionJob, *, gpu: Any, options: Any) -> Any:
    return estimate_pipeline(_pipeline_root(model), job, name=str(model), gpu=_gpu(gpu))


def pipeline_estimator(model: Any) -> Callable[[DiffusionJob], Any]:
    """``estimate(job)``: the PipelineEstimate of one call of ``model`` (no verdict: the
    planner judges it on its budget), each announced on the progress line."""

    root = _pipeline_root(model)

    def run(job: DiffusionJob) -> Any:
        report(f"sizing {model}: {job_flags(job)} ...")
        return estimate_pipeline(root, job, name=str(model))

    return run


def _pipeline_budget(verb: str, rec: Any, gpu_memory_bytes: int | None,
                     headroom: float | None) -> Any:  # fmt: skip
    if rec is None and gpu_memory_bytes is None:
        raise SpecError(f"{verb} of a DiffusionJob needs gpu=NAME or gpu_memory_bytes")
    return Budget.of(rec, memory_bytes=gpu_memory_bytes,
                     headroom=DEFAULT_HEADROOM if headroom is None else headroom)  # fmt: skip


def _fit_pipeline(
    model: Any, job: DiffusionJob, *, gpu: Any, options: Any, solve: str = "batch",
    gpu_memory_bytes: int | None = None, headroom: float | None = None,
) -> Any:  # fmt: skip
    rec = _gpu(gpu)
    budget = _pipeline_budget("fit", rec, gpu_memory_bytes, headroom)
    return fit_pipeline(pipeline_estimator(model), job, solve=solve, budget=budget,
                        arch=rec.arch if rec else None)  # fmt: skip


def _plan_pipeline(
    model: Any, job: DiffusionJob, *, gpu: Any, options: Any,
    gpu_memory_bytes: int | None = None, headroom: float | None = None, n_plans: int = 8,
) -> Any:  # fmt: skip
    rec = _gpu(gpu)
    budget = _pipeline_budget("plan", rec, gpu_memory_bytes, headroom)
    return plan_pipeline(pipeline_estimator(model), job, budget=budget,
                         arch=rec.arch if rec else None, n_plans=n_plans)  # fmt: skip


def train_tracer(
    model: ModelRef,
    gpu: GPU | None,
    *,
    before: Callable[[DiffusionTrainJob], None] | None = None,
) -> Callable[[DiffusionTrainJob], TrainEstimate]:
    """``trace(job)``: the estimate of one diffusion training job of ``model`` on ``gpu`` (a
    record or None); ``before(job)`` is called before each trace (the CLI's progress line)."""
    from memfit.estimate.diffusion.train_fast import estimate_training_fast

    root = _pipeline_root(model)

    def trace(job: DiffusionTrainJob) -> TrainEstimate:
        if before is not None:
            before(job)
        else:  # seconds a job: the progress line (memfit.progress) says which
            report(f"tracing the training step of {model}: {job.flags()} ...")
        return estimate_training_fast(root, job, name=str(model), gpu=gpu)

    return trace


def _estimate_train(model: Any, job: DiffusionTrainJob, *, gpu: Any, options: Any) -> Any:
    return train_tracer(model, _gpu(gpu))(job)


def _train_budget(gpu: Any, gpu_memory_bytes: int | None, headroom: float | None) -> Any:
    if gpu is None and gpu_memory_bytes is None:
        raise SpecError("a diffusion training fit / plan needs gpu=NAME or gpu_memory_bytes")
    return Budget.of(
        gpu, memory_bytes=gpu_memory_bytes,
        headroom=DEFAULT_HEADROOM if headroom is None else headroom,
    )  # fmt: skip


def _fit_train(
    model: Any, job: DiffusionTrainJob, *, gpu: Any, options: Any, solve: str = "batch",
    gpu_memory_bytes: int | None = None, headroom: float | None = None,
) -> Any:  # fmt: skip
    rec = _gpu(gpu)
    budget = _train_budget(rec, gpu_memory_bytes, headroom)
    return fit_training(train_tracer(model, rec), job, solve=solve, budget=budget,
                        arch=rec.arch if rec else None)  # fmt: skip


def _plan_train(
    model: Any, job: DiffusionTrainJob, *, gpu: Any, options: Any,
    gpu_memory_bytes: int | None = None, headroom: float | None = None,
) -> Any:  # fmt: skip
    from memfit.estimate.diffusion.pipeline import read_tree

    rec = _gpu(gpu)
    budget = _train_budget(rec, gpu_memory_bytes, headroom)
    pipeline = str(read_tree(_pipeline_root(model))[0]["_class_name"])
    return plan_training(train_tracer(model, rec), job, pipeline=pipeline, budget=budget,
                         arch=rec.arch if rec else None)  # fmt: skip


# -- serving -------------------------------------------------------------------------------------
def serving_spec(model: ModelRef, options: EstimateOptions | None = None) -> ModelSpec:
    """The :class:`~memfit.models.ModelSpec` vLLM serves (a config.json model, not a factory);
    a diffusion pipeline is a NotModelledError (vLLM serves no diffusers pipeline)."""
    if isinstance(model, str) and find_pipeline(model) is not None:
        raise NotModelledError(
            f"vLLM serving of the diffusion pipeline {model!r} is not modelled: vLLM serves "
            "language models, not diffusers pipelines",
            engine="vllm",
        )
    source = _source(model, options or EstimateOptions())
    if source.spec is None:
        raise SpecError(f"memfit vllm needs a config.json model, not a factory ({model!r})")
    if isinstance(model, str):  # a bundled text tower of a multimodal checkpoint: the whole model
        return served_spec(source.spec, hub_id(model))
    return source.spec


def _serving_gpu(gpu: Any, verb: str) -> Any:
    if gpu is None:
        raise SpecError(f"{verb} of a VllmConfig needs gpu=NAME (vLLM's budget is a GPU's total)")
    return _gpu(gpu)


def _estimate_serving(model: Any, job: VllmConfig, *, gpu: Any, options: Any) -> Any:
    rec = _serving_gpu(gpu, "estimate")
    return simulate_startup(serving_spec(model, options), rec, job)


def _fit_serving(
    model: Any, job: VllmConfig, *, gpu: Any, options: Any, solve: str = "concurrency",
    concurrency: int = 1,
) -> Any:  # fmt: skip
    """(value, VllmStartup or None): ``solve_concurrency`` at ``job.max_model_len`` or
    ``solve_max_model_len`` holding ``concurrency`` requests."""

    rec = _serving_gpu(gpu, "fit")
    spec = serving_spec(model, options)
    if solve == "concurrency":
        return solve_concurrency(spec, rec, job)
    if solve == "max-model-len":
        return solve_max_model_len(spec, rec, job, concurrency=concurrency)
    raise SpecError(f"solve ({solve!r}) for a VllmConfig must be concurrency or max-model-len")


def _plan_serving(
    model: Any, job: VllmConfig, *, gpu: Any, options: Any, concurrency: int = 1,
    max_gpus: int | None = None, allow_quant: bool = True,
) -> Any:  # fmt: skip
    if job.max_model_len is None:
        raise SpecError("plan of a VllmConfig needs its max_model_len: the tokens of a request")
    return plan_serving(
        serving_spec(model, options), str(model), concurrency=concurrency,
        max_model_len=job.max_model_len, gpus=None if gpu is None else [_gpu(gpu)],
        max_gpus=max_gpus, allow_quant=allow_quant, base=job,
    )  # fmt: skip


# -- SGLang serving ----------------------------------------------------------------------------
def _estimate_sglang(model: Any, job: SglangConfig, *, gpu: Any, options: Any) -> Any:
    if gpu is None:
        raise SpecError("estimate of an SglangConfig needs gpu=NAME (SGLang sizes by the GPU)")
    return simulate_sglang(serving_spec(model, options), _gpu(gpu), job)


def _fit_sglang(
    model: Any, job: SglangConfig, *, gpu: Any, options: Any, solve: str = "context-length"
) -> Any:
    """(value, SglangStartup or None): the largest context length, or the most concurrent
    requests of ``job.context_length`` tokens, that start."""
    if gpu is None:
        raise SpecError("fit of an SglangConfig needs gpu=NAME (SGLang sizes by the GPU)")
    return solve_sglang(serving_spec(model, options), _gpu(gpu), job, solve=solve)


# -- llama.cpp -----------------------------------------------------------------------------------
def _llamacpp_gpu(gpu: Any, verb: str) -> Any:
    if gpu is None and verb == "fit":
        raise SpecError("fit of a LlamaCppJob needs gpu=NAME (what -ngl / -c must fit)")
    return None if gpu is None else _gpu(gpu)


def _estimate_llamacpp(model: Any, job: LlamaCppJob, *, gpu: Any, options: Any) -> Any:
    return estimate_llamacpp(resolve_gguf(model, job.file_type), job,
                             _llamacpp_gpu(gpu, "estimate"))  # fmt: skip


def _fit_llamacpp(
    model: Any, job: LlamaCppJob, *, gpu: Any, options: Any, solve: str = "n-gpu-layers",
) -> Any:  # fmt: skip
    """(value, LlamaCppEstimate at that value): the largest -ngl at ``job.ctx_size``, or the
    largest -c at ``job.n_gpu_layers``."""
    rec = _llamacpp_gpu(gpu, "fit")
    gguf = resolve_gguf(model, job.file_type)
    if solve == "n-gpu-layers":
        value = largest_ngl(gguf, job, rec)
        best = dataclasses.replace(job, n_gpu_layers=value)
    elif solve == "ctx-size":
        value = largest_ctx(gguf, job, rec)
        best = dataclasses.replace(job, ctx_size=value or 256)
    else:
        raise SpecError(f"solve ({solve!r}) for a LlamaCppJob must be n-gpu-layers or ctx-size")
    return value, estimate_llamacpp(gguf, best, rec)


#: (job type) -> (estimate, fit, plan): the function that answers, or why none does and what
#: to do instead (a NotModelledError's message).
ROUTES: dict[type, tuple[Callable[..., Any] | str, ...]] = {
    WorkloadSpec: (
        _estimate_text,
        _fit_text,
        "plan does not take a fixed WorkloadSpec: it searches the techniques, so pass what to "
        "search as a memfit.plan.PlanRequest (or its fields as keywords: plan(model, gpu=..., "
        "seq_len=..., global_batch=...)); estimate or fit this workload as it is",
    ),
    PlanRequest: (
        "estimate does not take a PlanRequest (what to search): describe one job as a "
        "WorkloadSpec, or plan this request",
        "fit does not take a PlanRequest: describe the job as a WorkloadSpec and fit it with "
        "solve='batch' | 'seq' | 'concurrency', or plan this request",
        _plan_text,
    ),
    SeqRun: (_estimate_seq, _fit_seq, _plan_seq),
    DiffusionJob: (
        _estimate_pipeline,
        _fit_pipeline,
        _plan_pipeline,
    ),
    DiffusionTrainJob: (_estimate_train, _fit_train, _plan_train),
    VllmConfig: (_estimate_serving, _fit_serving, _plan_serving),
    SglangConfig: (
        _estimate_sglang,
        _fit_sglang,
        "plan of an SglangConfig is not modelled: SGLang's configurations are not searched yet; "
        "fit it (solve='context-length' or 'max-running-requests') on each GPU you consider, or "
        "plan the same server as a VllmConfig (memfit plan --runtime vllm)",
    ),
    LlamaCppJob: (
        _estimate_llamacpp,
        _fit_llamacpp,
        "plan does not take a LlamaCppJob yet: llama.cpp's knobs are -ngl and -c, so fit it "
        "(memfit.fit(model, job, gpu=..., solve='n-gpu-layers' | 'ctx-size'), or `memfit "
        "llama-server MODEL --gpu NAME`, which prints the largest -ngl and -c that fit)",
    ),
}
