"""Which engine answers a job: the one rule every command takes (torch-free).

Three engines:

- ``analytic``: hand-written closed forms (torch-free, milliseconds) for the model families and
  techniques it has programs for (:func:`memfit.estimate.analytic.supports`).
- ``derived``: the trace engine's own bytes at any batch size from three or four traces of the
  job, solved into exact per-allocation lines and replayed torch-free
  (:mod:`memfit.estimate.derived`); cached on disk, so a second run costs no trace. Any
  config.json model the trace engine builds on one GPU.
- ``trace``: runs the model on fake tensors (needs torch, and transformers for a config.json
  model); the precise one, seconds per estimate.

**The rule** (``engine="auto"``): the fastest engine that models the job answers it.

- A search (``plan``, ``fit``, ``upgrade``, ``doctor``): the analytic engine where the model's
  type has a program (the trace engine then confirms; docs/engines.md); else the derived engine;
  else the trace engine. A job an engine refuses (NotModelledError) goes to the next one — never
  "does not fit".
- One answer (``estimate``): the fastest engine that models the job exactly — the analytic
  engine where the fast-path grid validates it for the model type, the job's settings and the
  installed library versions (:mod:`memfit.estimate.fastpath`: reserved bytes at the median or
  the top of its measured range, never above the top of its job class's band), else the
  derived form where one for this job is cached, else the trace engine (one trace costs less
  than deriving a form), else the analytic engine when the trace stack is missing or the trace
  fails. The trace confirms an analytic answer on request (``--confirm``,
  :func:`confirming`) and where its validated band could change the verdict on the GPU asked
  (:func:`memfit.estimate.fastpath.verdict_settled`); ``MemoryEstimate.confirmed`` says which.

A named engine (``--engine analytic|derived|trace``) answers alone, or says why it cannot. Every
estimate says which engine answered and why (``MemoryEstimate.engine_reason``).

The command line sets the policy for the commands it runs with :func:`use_engine`; library
callers pass ``engine=`` to :func:`memfit.estimate` or use the same context manager. Progress of
anything slow goes through :mod:`memfit.progress` (a callback), never a print.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from memfit import progress
from memfit.errors import (
    MemfitError,
    MissingDependencyError,
    NotModelledError,
    SpecError,
    TraceError,
)
from memfit.estimate import fastpath, fsdp1, fsdp1_save, zero3_load
from memfit.estimate.parallel import estimate_parallel
from memfit.estimate.pipeline import with_notes
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace.refusals import refusal as trace_refusal
from memfit.spec import WorkloadSpec
from memfit.spec.options import ENGINES
from memfit.spec.parallel_rules import is_parallel_job

Estimator = Callable[[WorkloadSpec], MemoryEstimate]
#: A search's first answer where it settles the search alone (``settles``), else None.
FirstEstimate = Callable[[WorkloadSpec, Callable[[MemoryEstimate], bool]], MemoryEstimate | None]


def trace_stack_missing(source: Any) -> str | None:
    """Why the trace engine cannot run here (a missing package), or None."""
    needed = ["torch"] if source.origin == "factory" else ["torch", "transformers"]
    for pkg in needed:
        if importlib.util.find_spec(pkg) is None:
            return f"{pkg} is not installed"
    return None


def analytic_available() -> bool:
    """Whether the analytic engine (``memfit.estimate.analytic.estimate_analytic``) is installed."""
    try:
        module = importlib.import_module("memfit.estimate.analytic")
    except ImportError:
        return False
    return hasattr(module, "estimate_analytic")


#: The note of a ``--compile`` job answered as its eager twin (``MemoryEstimate.notes``).
COMPILE_AS_EAGER = (
    "--compile not modelled here ({why}); answered for eager autograd, an upper bound: "
    "torch.compile keeps 0.69-1.0 of the activations eager autograd keeps in the layers where "
    "memfit measured it (benchmarks/results/compile_saved.md)"
)

#: The note of a ``--compile`` job whose analytic answer was tight and whose eager twin, answered
#: by a precise engine, has the lower upper end (:func:`compile_answer`).
COMPILE_EAGER_BOUND = (
    "--compile: answered by the eager step's {engine} estimate, an upper bound on the compiled "
    "job (torch.compile keeps 0.69-1.0 of the activations eager autograd keeps where memfit "
    "measured it, benchmarks/results/compile_saved.md), whose range ends lower than the "
    "analytic engine's for the compiled step ({compiled}: tight on {gpu})"
)


def _upper(est: MemoryEstimate) -> int:
    return est.ranges.get("device_used_bytes", (0, est.device_used_bytes))[1]


def compile_answer(
    compiled: Callable[[], MemoryEstimate], eager: Callable[[], MemoryEstimate]
) -> MemoryEstimate:
    """The ``auto`` answer of a ``--compile`` job (one GPU): the analytic engine's compiled step
    (``compiled``), which alone models what AOTAutograd saves; where it cannot, the eager step
    (``eager``: the precise route of the same job without compile) with a note, an upper bound.
    Where the compiled answer is tight (its band reaches past the limit), the eager step's
    precise answer bounds it from above: the one whose range ends lower is the answer, so a
    compiled job that runs is not called tight because only the fast engine can model it."""
    try:
        est = compiled()
    except NotModelledError as exc:
        return with_notes(eager(), [COMPILE_AS_EAGER.format(why=exc)], first=True)
    if est.fits is None or est.fits.verdict != "tight":
        return est
    bound = eager()
    if _upper(bound) >= _upper(est):
        return est
    note = COMPILE_EAGER_BOUND.format(
        engine=bound.engine, compiled=_bytes_pair(est), gpu=est.fits.gpu
    )
    return with_notes(bound, [note], first=True)


def _analytic_compiled(source: Any, workload: WorkloadSpec, gpu: Any) -> MemoryEstimate:
    """The analytic engine's answer for a ``--compile`` job (the one engine that models it)."""
    est = run_engine("analytic", source, workload, gpu)
    return with_reason(est, "auto: --compile is modelled by the analytic engine only")


#: Why the trace and derived engines refuse ``--compile`` (they run or replay eager autograd).
COMPILE_REFUSAL = (
    "compile: the {engine} engine runs eager autograd (what torch.compile saves for backward "
    "is not what eager saves); the analytic engine models it (--engine analytic)"
)


def run_engine(
    name: str,
    source: Any,
    workload: WorkloadSpec,
    gpu: Any,
    *,
    extrapolate: bool | None = None,
    reserved_end: str = "mid",
) -> MemoryEstimate:
    """``source`` (a ``ModelSource``) running ``workload`` on ``gpu`` (a catalog record or None),
    estimated by the engine ``name`` ("analytic", "derived" or "trace") alone. A job with
    pipeline, context or expert parallelism (pp / cp / ep > 1) is answered by the parallel
    closed form whichever engine is named (no engine models those ranks on one GPU); the
    estimate says so (``engine_reason``). ``reserved_end``: the analytic engine's point of its
    reserved ratio range (``reserved.RESERVED_ENDS``: mid, high, band)."""
    est = _run_step_engine(
        name, source, workload, gpu, extrapolate=extrapolate, reserved_end=reserved_end
    )
    # a ZeRO3-QLoRA job peaks where DeepSpeed moves the whole model to each GPU
    return zero3_load.with_zero3_load(est, source, workload, gpu)


def _run_step_engine(
    name: str,
    source: Any,
    workload: WorkloadSpec,
    gpu: Any,
    *,
    extrapolate: bool | None = None,
    reserved_end: str = "mid",
) -> MemoryEstimate:
    """The training step (or serving) of :func:`run_engine`, without the engine-init phase."""
    if workload.fsdp_version == 1:  # FSDP2's answer + FSDP1's flat-parameter gradients
        twin = fsdp1.fsdp2_twin(workload)
        est = run_engine(
            name, source, twin, gpu, extrapolate=extrapolate, reserved_end=reserved_end
        )
        est = fsdp1.with_fsdp1(est, source, workload, gpu)
        # the checkpoint it writes (SHARDED_STATE_DICT: every rank's chunk cloned on the GPU)
        return fsdp1_save.with_checkpoint_save(est, source, workload, gpu)
    if is_parallel_job(workload):
        return estimate_parallel(source, workload, gpu=gpu)
    if workload.num_beams > 1 or workload.cache_implementation != "dynamic":
        from memfit.estimate.generation import with_generation  # beams, StaticCache

        def inner(w: WorkloadSpec) -> MemoryEstimate:
            return run_engine(name, source, w, gpu, extrapolate=extrapolate)

        return with_generation(source, workload, inner)
    if workload.compile and name in ("derived", "trace"):
        raise NotModelledError(COMPILE_REFUSAL.format(engine=name), engine=name)
    if name == "analytic":
        from memfit.estimate.analytic import estimate_analytic

        return estimate_analytic(source, workload, gpu=gpu, reserved_end=reserved_end)
    if name == "derived":
        from memfit.estimate.derived import estimate_derived

        return estimate_derived(source, workload, gpu=gpu, progress=progress.report)
    refused = trace_refusal(workload) if source.origin != "factory" else None
    if refused is not None:  # known from the workload: no torch import, no model build
        raise refused
    _require_trace_stack(source)
    from memfit.estimate.trace_cache import cached_trace  # answers kept on disk

    def trace() -> MemoryEstimate:
        return _trace(source, workload, gpu, extrapolate)

    return cached_trace(source, workload, gpu, trace, extrapolate=extrapolate)


def _trace(
    source: Any, workload: WorkloadSpec, gpu: Any, extrapolate: bool | None
) -> MemoryEstimate:
    """The trace engine's run of ``source`` (a factory or a config.json model)."""
    progress.report(f"tracing {source.name} (batch {workload.batch_size}, seq {workload.seq_len})")
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


def _require_trace_stack(source: Any) -> None:
    missing = trace_stack_missing(source)
    if missing:
        raise MissingDependencyError(
            f"the trace engine needs torch and transformers, but {missing}: "
            "pip install 'memfit[trace]' (install torch for your CUDA version first), "
            "or use --engine analytic"
        )


def _confirmed(est: MemoryEstimate) -> MemoryEstimate:
    """``est`` marked as the trace engine's bytes where it is (trace or derived), else as an
    unconfirmed fast answer (the analytic engine, when the trace cannot run or failed)."""
    return dataclasses.replace(est, confirmed=est.engine in ("trace", "derived"))


def _confirm_why(est: MemoryEstimate) -> str | None:
    """Why the trace confirms the fast answer ``est`` (None: it does not): ``--confirm``, or a
    verdict the analytic engine's validated band could change."""
    if confirming():
        return "--confirm"
    if est.fits is None or est.fits.verdict is None:
        return None
    if fastpath.verdict_settled(est, est.fits.capacity_bytes, est.fits.verdict):
        return None
    band = (est.trace or {}).get("reserved_band") or "not recorded"
    return (
        f"the verdict ({est.fits.verdict}) lies within the analytic engine's validated band of "
        f"{est.fits.gpu}'s capacity; reserved band: {band}"
    )


def _verdicts_differ(shown: MemoryEstimate, band: MemoryEstimate) -> str | None:
    """Why the trace confirms where the answer shown (its reserved bytes at the median or the
    wide top) and the top of the job class's band reach different verdicts (None: the same):
    the band settles its own verdict, not the one shown, and the trace decides between them.
    The answer shown is never above the band's top (``fastpath.shown_answer``), so a verdict
    the band settles is the answer's too: this guard fires only beside an unsettled band."""
    if shown.fits is None or band.fits is None or shown.fits.verdict == band.fits.verdict:
        return None
    return (
        f"the answer shown ({shown.fits.verdict}) and the top of the job class's reserved band "
        f"({band.fits.verdict}) differ on {shown.fits.gpu}"
    )


def _bytes_pair(est: MemoryEstimate) -> str:
    gib = 2**30
    return (
        f"peak allocated {est.peak_allocated_bytes / gib:.2f} GiB, reserved "
        f"{est.peak_reserved_bytes / gib:.2f} GiB"
    )


def fast_answer(
    source: Any, workload: WorkloadSpec, gpu: Any
) -> tuple[MemoryEstimate, MemoryEstimate] | None:
    """The analytic engine's first answer of a default estimate where the fast-path grid
    validates the job (None elsewhere, or where the analytic engine refuses a setting), and the
    same job at the top of its job class's band (whether the trace could change the verdict):
    the answer is reserved at :func:`fastpath.shown_reserved_end`, never above the band's top
    (:func:`fastpath.shown_answer`, one verdict). ``memfit estimate`` shows it and the planner
    judges a plan the search engine leaves tight with it (memfit.plan.search), so a plan's
    verdict is the one ``memfit estimate`` gives its job."""
    if not _analytic_models(source) or fastpath.not_validated(source.config, workload) is not None:
        return None
    try:
        end = fastpath.shown_reserved_end(workload)
        shown = run_engine("analytic", source, workload, gpu, reserved_end=end)
        # the verdict is settled only if the top of the job class's band settles it
        band = run_engine("analytic", source, workload, gpu, reserved_end="band")
    except MemfitError:  # a setting the analytic engine refuses: the precise route says so
        return None
    est, capped = fastpath.shown_answer(shown, band)
    est = with_reason(est, fastpath.validated_reason(source.config, workload, capped=capped))
    return est, band


def with_reason(est: MemoryEstimate, reason: str) -> MemoryEstimate:
    """``est`` saying why its engine answered (kept when already said)."""
    if est.engine_reason:
        return est
    return dataclasses.replace(est, engine_reason=reason)


def _model_type(source: Any) -> str:
    if source.origin == "factory":
        return "a factory model"
    return f"model_type {str((source.config or {}).get('model_type') or '?')!r}"


def _analytic_models(source: Any) -> bool:
    """Whether the analytic engine has closed forms for ``source``'s model (not a factory, a
    model_type it has a program for); the job's settings may still be refused one by one."""
    if source.origin == "factory" or source.config is None or not analytic_available():
        return False
    from memfit.estimate.analytic import supports

    return bool(supports(source.config))


def _traceable(source: Any) -> bool:
    """Whether the trace engine can run ``source`` here (a factory, or the trace stack)."""
    return source.origin == "factory" or trace_stack_missing(source) is None


def _derived_may_model(source: Any) -> bool:
    """Whether the derived engine can model ``source``'s jobs at all (a config.json model
    without remote code, with the trace stack to build forms)."""
    return (
        source.origin != "factory"
        and source.config is not None
        and not source.trust_remote_code
        and trace_stack_missing(source) is None
    )


@dataclass(frozen=True, kw_only=True)
class SearchEngines:
    """A search's engines: ``search`` estimates every candidate, ``confirm`` (or None) re-checks
    the plans shown; ``reason`` says why, in one line."""

    search: str
    confirm: str | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class EnginePolicy:
    """The engine choice of every command. ``engine``: "auto" (the rule in the module
    docstring), or "analytic" / "derived" / "trace" (that engine alone, no fallback)."""

    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SpecError(
                f"engine ({self.engine!r}) must be one of {', '.join(ENGINES)}: --engine auto "
                "lets memfit choose"
            )

    # ------------------------------------------------------------------ one answer
    def estimate(
        self, source: Any, workload: WorkloadSpec, gpu: Any, *, extrapolate: bool | None = None
    ) -> MemoryEstimate:
        """One answer for ``source`` running ``workload`` (``gpu``: a catalog record or None)."""
        if self.engine != "auto":
            est = run_engine(self.engine, source, workload, gpu, extrapolate=extrapolate)
            return with_reason(est, f"--engine {self.engine}")
        if workload.compile and not is_parallel_job(workload):
            # compile only changes what a block saves for backward: where its saved set is not
            # measured, or the compiled answer is tight, the eager job's precise answer is the
            # upper bound (measured compiled / eager: 0.69-1.0 of a layer's activations,
            # compile_saved.md)
            eager_job = dataclasses.replace(workload, compile=False)
            return compile_answer(
                lambda: _analytic_compiled(source, workload, gpu),
                lambda: self.estimate(source, eager_job, gpu, extrapolate=extrapolate),
            )
        fast = self._validated_fast(source, workload, gpu, extrapolate)
        if fast is not None:
            return fast
        return _confirmed(self._precise(source, workload, gpu, extrapolate))

    def _validated_fast(
        self, source: Any, workload: WorkloadSpec, gpu: Any, extrapolate: bool | None
    ) -> MemoryEstimate | None:
        """The analytic engine's default answer where the fast-path grid validates it (None
        elsewhere), confirmed by the trace where asked or where its band could change the
        verdict (module docstring)."""
        if extrapolate is not None:
            return None
        answered = fast_answer(source, workload, gpu)
        if answered is None:
            return None
        est, band = answered
        why = _confirm_why(band) or _verdicts_differ(est, band)
        if why is None or trace_stack_missing(source) is not None:
            return dataclasses.replace(est, confirmed=False)
        precise = self._precise(source, workload, gpu, extrapolate)
        note = (
            f"confirmed by the {precise.engine} engine ({why}): the analytic answer was "
            f"{_bytes_pair(est)}; the {precise.engine} engine's {_bytes_pair(precise)}"
        )
        reason = f"auto: the analytic answer confirmed by the trace ({why})"
        return dataclasses.replace(
            with_notes(precise, [note], first=True), engine_reason=reason, confirmed=True
        )

    def _precise(
        self, source: Any, workload: WorkloadSpec, gpu: Any, extrapolate: bool | None
    ) -> MemoryEstimate:
        """The precise route of one answer: a cached derived form, else the trace, else (no
        trace stack, or the trace failed) the analytic engine."""
        if extrapolate is None and _derived_may_model(source):
            from memfit.estimate.derived import is_cached

            if is_cached(source, workload):
                est = run_engine("derived", source, workload, gpu)
                return with_reason(est, "auto: a derived form of this job is cached (the trace "
                                   "engine's bytes without a trace)")  # fmt: skip
        missing = trace_stack_missing(source)
        if missing and source.origin != "factory":
            est = run_engine("analytic", source, workload, gpu)
            est = with_notes(est, [f"engine auto: {missing}; used analytic"], first=True)
            return with_reason(est, f"auto: the trace engine cannot run ({missing})")
        try:
            est = run_engine("trace", source, workload, gpu, extrapolate=extrapolate)
            return with_reason(est, "auto: one answer is traced (the precise engine)")
        except NotModelledError as refused:
            # a setting only the analytic engine models (a fused / chunked loss, checkpoints in
            # host RAM): the next engine answers (module docstring)
            if source.origin == "factory" or not _analytic_models(source):
                raise
            est = run_engine("analytic", source, workload, gpu)
            est = with_notes(est, [f"engine auto: the trace engine refuses ({refused})"])
            return with_reason(est, "auto: the analytic engine models what the trace refuses")
        except TraceError as exc:
            if source.origin == "factory":
                raise
            try:
                est = run_engine("analytic", source, workload, gpu)
            except MemfitError:
                raise exc from None
            note = f"engine auto: the trace engine failed ({exc}); used analytic"
            est = with_notes(est, [note], first=True)
            return with_reason(est, "auto: the trace failed, the analytic engine models the job")

    def estimator(self, source: Any, gpu: Any) -> Estimator:
        """:meth:`estimate` as a function of the workload alone."""
        return lambda w: self.estimate(source, w, gpu)

    # ------------------------------------------------------------------ searches
    def search_engines(self, source: Any) -> SearchEngines:
        """The engines of a search (``plan``, ``fit``) over ``source``'s jobs."""
        if self.engine != "auto":
            return SearchEngines(search=self.engine, confirm=None, reason=f"--engine {self.engine}")
        trace_ok = source.origin == "factory" or trace_stack_missing(source) is None
        if _analytic_models(source):
            return SearchEngines(
                search="analytic",
                confirm="trace" if trace_ok else None,
                reason=f"auto: {_model_type(source)} has a hand-written analytic program"
                + ("; the trace engine confirms" if trace_ok else ""),
            )
        if _derived_may_model(source):
            return SearchEngines(
                search="derived",
                confirm=None,
                reason=f"auto: {_model_type(source)} has no hand-written program; the derived "
                "engine gives the trace engine's bytes (per technique stack: a few layers traced "
                "and grown to full depth, or 3-4 full traces; cached), "
                "the trace engine answers the jobs it cannot model",
            )
        if not trace_ok:
            return SearchEngines(
                search="analytic",
                confirm=None,
                reason=f"auto: the trace engine cannot run ({trace_stack_missing(source)})",
            )
        return SearchEngines(
            search="trace", confirm=None, reason=f"auto: {_model_type(source)} is traced"
        )

    def search_estimator(self, source: Any, gpu: Any, name: str, reason: str) -> Estimator:
        """The estimator of engine ``name`` in a search: under ``auto`` the derived engine hands
        a job it cannot model to the trace engine; a named engine answers alone."""
        if name == "derived" and self.engine == "auto":
            return Chain(source, gpu, ("derived", "trace"), reason=reason, compile_auto=True)
        return Chain(source, gpu, (name,), reason=reason, compile_auto=self.engine == "auto")

    def search_guide(self, source: Any, gpu: Any, reason: str) -> Estimator:
        """The derived engine's cheap probe for a search (``guide_derived``: exact live bytes,
        reserved bytes scaled from an exact replay); the search certifies its answer with the
        search estimator itself."""

        def guide(w: WorkloadSpec) -> MemoryEstimate:
            from memfit.estimate.derived import guide_derived

            if w.num_beams > 1 or w.cache_implementation != "dynamic":
                raise NotModelledError("no guide for beams or a static cache", engine="derived")
            if w.compile:
                raise NotModelledError(COMPILE_REFUSAL.format(engine="derived"), engine="derived")

            est = zero3_load.with_zero3_load(guide_derived(source, w, gpu=gpu), source, w, gpu)
            return with_reason(est, reason)

        return guide

    def search_first(self, source: Any, gpu: Any, reason: str) -> FirstEstimate:
        """The derived engine's first answer of a search at batch size 1 without its whole
        form, where that answer alone ``settles`` the search (``estimate_first``: the bytes the
        form gives at batch 1); None where it does not (the search estimator then answers)."""

        def first(w: WorkloadSpec, settles: Callable[[MemoryEstimate], bool]) -> Any:
            from memfit.estimate.derived import estimate_first

            if w.num_beams > 1 or w.cache_implementation != "dynamic" or w.compile:
                return None
            try:
                est = estimate_first(
                    source,
                    w,
                    gpu=gpu,
                    # judged with a ZeRO3-QLoRA job's engine-init phase, as the answer is
                    settles=lambda e: settles(zero3_load.with_zero3_load(e, source, w, gpu)),
                    progress=progress.report,
                )
            except MemfitError:  # the search estimator meets it again and says so
                return None
            if est is None:
                return None
            return with_reason(zero3_load.with_zero3_load(est, source, w, gpu), reason)

        return first

    def analytic_first(self, source: Any, gpu: Any, *, max_trace: int) -> AnalyticFirst:
        """The checklist's estimator (``upgrade``, ``doctor``): see :class:`AnalyticFirst`. The
        ``auto`` policy object defers to the one set by :func:`use_engine`."""
        chosen = active() if self.engine == "auto" else self
        return AnalyticFirst(source, gpu, max_trace=max_trace, engine=chosen.engine)


#: The default policy.
AUTO = EnginePolicy()

_ACTIVE: contextvars.ContextVar[EnginePolicy | None] = contextvars.ContextVar(
    "memfit_engine_policy", default=None
)


def active() -> EnginePolicy:
    """The policy set by :func:`use_engine`, else :data:`AUTO`."""
    return _ACTIVE.get() or AUTO


_CONFIRM: contextvars.ContextVar[bool] = contextvars.ContextVar("memfit_confirm", default=False)


def confirming() -> bool:
    """Whether the trace confirms every fast answer (``--confirm``, :func:`use_confirm`)."""
    return _CONFIRM.get()


@contextlib.contextmanager
def use_confirm(confirm: bool = True) -> Iterator[None]:
    """Inside the block, the trace confirms every analytic default answer (``--confirm``)."""
    token = _CONFIRM.set(confirm)
    try:
        yield
    finally:
        _CONFIRM.reset(token)


@contextlib.contextmanager
def use_engine(engine: str) -> Iterator[EnginePolicy]:
    """Run the searches and checklists inside with ``engine`` (what ``--engine`` sets)."""
    policy = EnginePolicy(engine=engine)
    token = _ACTIVE.set(policy)
    try:
        yield policy
    finally:
        _ACTIVE.reset(token)


class Chain:
    """Estimator: the engines in ``order``; one that cannot model the job (NotModelledError)
    hands it to the next. Each estimate carries ``reason`` and, after a hand-over, why."""

    def __init__(
        self,
        source: Any,
        gpu: Any,
        order: tuple[str, ...],
        *,
        reason: str,
        compile_auto: bool = False,
    ) -> None:
        self.source, self.gpu, self.order, self.reason = source, gpu, order, reason
        #: under ``auto``, a ``--compile`` job these eager engines cannot model is answered as
        #: :func:`compile_answer` does (the analytic compiled step, bounded by these engines'
        #: answer for the eager step): a search's confirmation of a compiled job
        self.compile_auto = compile_auto

    def __call__(self, w: WorkloadSpec) -> MemoryEstimate:
        if (
            self.compile_auto
            and w.compile
            and not is_parallel_job(w)
            and any(n in ("derived", "trace") for n in self.order)
        ):
            return compile_answer(
                lambda: _analytic_compiled(self.source, w, self.gpu),
                lambda: self._chain(dataclasses.replace(w, compile=False)),
            )
        return self._chain(w)

    def _chain(self, w: WorkloadSpec) -> MemoryEstimate:
        refusals: list[str] = []
        for i, name in enumerate(self.order):
            last = i == len(self.order) - 1
            try:
                est = run_engine(name, self.source, w, self.gpu)
            except NotModelledError as exc:
                if last:
                    raise
                refusals.append(f"{name}: {exc}")
                continue
            reason = self.reason if not refusals else f"auto: {'; '.join(refusals)}"
            return with_reason(est, reason)
        raise AssertionError("unreachable: the last engine raises or answers")


class AnalyticFirst:
    """Estimator of the checklists: under ``auto`` the analytic engine (the trace for every job
    under ``--confirm``, :func:`confirming`); a job it refuses goes to
    the derived engine and then the trace engine, at most ``max_trace`` times for jobs that need
    a trace (a cached derived form needs none; then the refusal is raised, and the caller
    counts the job as not estimated). ``rejected`` keeps every refusal's message, ``n_trace``
    the fallbacks that traced. A named ``engine`` answers alone.

    Any SpecError counts as a refusal today, a :class:`~memfit.errors.NotModelledError` or not:
    bad input then reaches the trace engine, which raises it with the same message (the shared
    checks of :mod:`memfit.estimate.pipeline`)."""

    def __init__(self, source: Any, gpu: Any, *, max_trace: int = 0, engine: str = "auto") -> None:
        self.source, self.gpu, self.max_trace, self.engine = source, gpu, max_trace, engine
        self.n_trace = 0
        self.rejected: list[str] = []

    def __call__(self, w: WorkloadSpec) -> MemoryEstimate:
        if self.engine != "auto":
            return with_reason(run_engine(self.engine, self.source, w, self.gpu),
                               f"--engine {self.engine}")  # fmt: skip
        if confirming() and _traceable(self.source):  # --confirm: every answer the trace's
            est = run_engine("trace", self.source, w, self.gpu)
            return dataclasses.replace(with_reason(est, "auto: --confirm: traced"), confirmed=True)
        try:
            est = run_engine("analytic", self.source, w, self.gpu)
            return with_reason(est, f"auto: {_model_type(self.source)} has an analytic program")
        except SpecError as exc:
            self.rejected.append(str(exc))
            cached = self._derived_cached(w)
            if not cached and (
                self.n_trace >= self.max_trace or trace_stack_missing(self.source) is not None
            ):
                raise
        why = f"auto: the analytic engine cannot model it ({self.rejected[-1]})"
        if _derived_may_model(self.source):
            try:
                est = run_engine("derived", self.source, w, self.gpu)
            except NotModelledError as exc:
                why += f"; the derived engine neither ({exc})"
            else:
                self.n_trace += 0 if cached else 1
                return with_reason(est, why + "; derived from the trace")
        self.n_trace += 1
        return with_reason(run_engine("trace", self.source, w, self.gpu), why + "; traced")

    def _derived_cached(self, w: WorkloadSpec) -> bool:
        if not _derived_may_model(self.source):
            return False
        from memfit.estimate.derived import is_cached

        return is_cached(self.source, w)


__all__ = [
    "AUTO",
    "AnalyticFirst",
    "Chain",
    "EnginePolicy",
    "Estimator",
    "FirstEstimate",
    "SearchEngines",
    "active",
    "analytic_available",
    "fast_answer",
    "confirming",
    "run_engine",
    "trace_stack_missing",
    "use_confirm",
    "use_engine",
    "with_reason",
]
