"""Which engine answers a job: one policy that every command takes (torch-free).

Two engines. ``trace`` is the precise one: it runs the model on fake tensors and needs torch (and
transformers for a config.json model). ``analytic`` is the fast one: closed forms, torch-free,
for the families and techniques it has programs for. :class:`EnginePolicy` holds every rule for
choosing between them, one method per kind of question:

- one answer (``memfit.estimate``, ``memfit estimate``): :meth:`EnginePolicy.estimate`. ``auto``
  traces; it answers with the analytic engine when the trace stack is missing or the trace fails,
  and says so in a first note. A factory model (``pkg.mod:fn``) is never sent to the analytic
  engine, which needs a config.json. A named engine never falls back.
- a search (``plan``, ``fit``): :meth:`EnginePolicy.search_engines`. The analytic engine searches,
  the trace engine confirms the plans shown, where it can run.
- a checklist (``upgrade``, ``doctor``): :meth:`EnginePolicy.analytic_first`. The analytic engine,
  and the trace engine for at most ``max_trace`` jobs the analytic engine refuses.

An engine's answer is one of three typed outcomes: a ``MemoryEstimate`` (which says whether the
job fits: ``MemoryEstimate.fits``), a :class:`~memfit.errors.NotModelledError` (this engine cannot
model the job; another engine may), or a :class:`~memfit.errors.SpecError` (the job itself is
wrong: no engine answers it). docs/decisions.md says how searches will use the distinction.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.errors import MemfitError, MissingDependencyError, SpecError, TraceError
from memfit.estimate.pipeline import with_notes
from memfit.estimate.result import MemoryEstimate
from memfit.spec import WorkloadSpec

#: The values of ``engine``: the policy's choice, or one engine without fallback.
ENGINES = ("auto", "trace", "analytic")

Estimator = Callable[[WorkloadSpec], MemoryEstimate]


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


def run_engine(
    name: str, source: Any, workload: WorkloadSpec, gpu: Any, *, extrapolate: bool | None = None
) -> MemoryEstimate:
    """``source`` (a ``ModelSource``) running ``workload`` on ``gpu`` (a catalog record or None),
    estimated by the engine ``name`` ("analytic" or "trace") alone."""
    if workload.num_beams > 1 or workload.cache_implementation != "dynamic":
        from memfit.estimate.generation import with_generation  # beams, StaticCache

        def inner(w: WorkloadSpec) -> MemoryEstimate:
            return run_engine(name, source, w, gpu, extrapolate=extrapolate)

        return with_generation(source, workload, inner)
    if name == "analytic":
        from memfit.estimate.analytic import estimate_analytic

        return estimate_analytic(source, workload, gpu=gpu)
    _require_trace_stack(source)
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


@dataclass(frozen=True, kw_only=True)
class EnginePolicy:
    """The engine choice of every command. ``engine``: "auto" (the policy's rules, see the module
    docstring), or "trace" / "analytic" (that engine alone, no fallback)."""

    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SpecError(f"engine ({self.engine!r}) must be one of {', '.join(ENGINES)}")

    def estimate(
        self, source: Any, workload: WorkloadSpec, gpu: Any, *, extrapolate: bool | None = None
    ) -> MemoryEstimate:
        """One answer for ``source`` running ``workload`` (``gpu``: a catalog record or None)."""
        if self.engine == "analytic":
            return run_engine("analytic", source, workload, gpu)
        missing = trace_stack_missing(source)
        if self.engine == "auto" and missing and source.origin != "factory":
            est = run_engine("analytic", source, workload, gpu)
            return with_notes(est, [f"engine auto: {missing}; used analytic"], first=True)
        try:
            return run_engine("trace", source, workload, gpu, extrapolate=extrapolate)
        except TraceError as exc:
            if self.engine != "auto" or source.origin == "factory":
                raise
            try:
                est = run_engine("analytic", source, workload, gpu)
            except MemfitError:
                raise exc from None
            note = f"engine auto: the trace engine failed ({exc}); used analytic"
            return with_notes(est, [note], first=True)

    def estimator(self, source: Any, gpu: Any) -> Estimator:
        """:meth:`estimate` as a function of the workload alone."""
        return lambda w: self.estimate(source, w, gpu)

    def search_engines(self, source: Any) -> tuple[str, str | None]:
        """(the engine that searches, the engine that confirms what the search shows or None).

        ``auto``: the analytic engine searches (milliseconds per estimate) and the trace engine
        confirms where its stack is installed. Where the analytic engine cannot model the model
        at all — a factory (``pkg.mod:fn``), a model_type without closed forms — or is not
        installed, the trace engine searches and nothing confirms: a search must not count
        "cannot model" as "does not fit". A named engine searches alone."""
        if self.engine != "auto":
            return self.engine, None
        trace_ok = source.origin == "factory" or trace_stack_missing(source) is None
        if analytic_available() and _analytic_models(source):
            return "analytic", "trace" if trace_ok else None
        if not trace_ok:
            return "analytic", None  # the analytic engine's refusal is the answer
        return "trace", None

    def analytic_first(self, source: Any, gpu: Any, *, max_trace: int) -> AnalyticFirst:
        """The checklist's estimator (``upgrade``, ``doctor``): see :class:`AnalyticFirst`. It is
        the ``auto`` rule; checklists take no ``--engine`` yet (a named engine's checklist would
        use :meth:`estimator`)."""
        return AnalyticFirst(source, gpu, max_trace=max_trace)


#: The default policy.
AUTO = EnginePolicy()


def _analytic_models(source: Any) -> bool:
    """Whether the analytic engine has closed forms for ``source``'s model (not a factory, a
    model_type it has a program for); the job's settings may still be refused one by one."""
    if source.origin == "factory" or source.config is None:
        return False
    from memfit.estimate.analytic import supports

    return bool(supports(source.config))


class AnalyticFirst:
    """Estimator: the analytic engine; a job it refuses goes to the trace engine, at most
    ``max_trace`` times (then the refusal is raised, and the caller counts the job as not
    estimated). ``rejected`` keeps every refusal's message, ``n_trace`` the trace runs.

    Any SpecError counts as a refusal today, a :class:`~memfit.errors.NotModelledError` or not:
    bad input then reaches the trace engine, which raises it with the same message (the shared
    checks of :mod:`memfit.estimate.pipeline`)."""

    def __init__(self, source: Any, gpu: Any, *, max_trace: int = 0) -> None:
        self.source, self.gpu, self.max_trace = source, gpu, max_trace
        self.n_trace = 0
        self.rejected: list[str] = []

    def __call__(self, w: WorkloadSpec) -> MemoryEstimate:
        try:
            return run_engine("analytic", self.source, w, self.gpu)
        except SpecError as exc:
            self.rejected.append(str(exc))
            if self.n_trace >= self.max_trace or trace_stack_missing(self.source) is not None:
                raise
        self.n_trace += 1
        return run_engine("trace", self.source, w, self.gpu)


__all__ = [
    "AUTO",
    "ENGINES",
    "AnalyticFirst",
    "EnginePolicy",
    "Estimator",
    "analytic_available",
    "run_engine",
    "trace_stack_missing",
]
