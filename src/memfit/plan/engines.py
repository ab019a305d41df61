"""The estimators the planner and the solver call: a fast one to search, a precise one to confirm.

An estimator is any ``Callable[[WorkloadSpec], MemoryEstimate]`` (tests inject their own). The
default searches with the analytic engine (closed forms, milliseconds) when it is installed and
confirms the plans it shows with the trace engine (fake-tensor execution, seconds); without the
analytic engine it searches with the trace engine and needs no confirmation.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.errors import MemfitError
from memfit.estimate.result import MemoryEstimate
from memfit.spec import WorkloadSpec

Estimator = Callable[[WorkloadSpec], MemoryEstimate]
BatchEstimator = Callable[[Sequence[WorkloadSpec]], list[MemoryEstimate]]


def workload_key(w: WorkloadSpec) -> str:
    """A stable key of a workload (``repr`` of the frozen spec: every field, in order)."""
    return repr(w)


class CachedEstimator:
    """Memoises an estimator by workload (answers and errors alike) and counts the workloads that
    reached it. ``batch``: an optional ``Callable[[Sequence[WorkloadSpec]], list[MemoryEstimate]]``
    that estimates many workloads at once (the analytic engine's ``estimate_many`` shares its
    simulations among workloads that differ only in batch size); :meth:`prefetch` uses it."""

    def __init__(self, fn: Estimator, name: str, *, batch: BatchEstimator | None = None) -> None:
        self.fn = fn
        self.name = name
        self.batch = batch
        self.n_calls = 0
        self.n_batches = 0
        self.elapsed_s = 0.0
        self._cache: dict[str, MemoryEstimate | MemfitError] = {}

    def __call__(self, w: WorkloadSpec) -> MemoryEstimate:
        key = workload_key(w)
        if key not in self._cache:
            self.n_calls += 1
            started = time.perf_counter()
            try:
                self._cache[key] = self.fn(w)
            except MemfitError as exc:
                self._cache[key] = exc
            finally:
                self.elapsed_s += time.perf_counter() - started
        return _unwrap(self._cache[key])

    def prefetch(self, workloads: Sequence[WorkloadSpec]) -> None:
        """Estimate the ``workloads`` not cached yet in one batch call (one at a time without a
        batch function, or when the batch call fails: each workload then gets its own answer)."""
        todo: dict[str, WorkloadSpec] = {}
        for w in workloads:
            key = workload_key(w)
            if key not in self._cache:
                todo.setdefault(key, w)
        if not todo:
            return
        if self.batch is None or len(todo) == 1:
            for w in todo.values():
                self._try(w)
            return
        started = time.perf_counter()
        try:
            results = self.batch(list(todo.values()))
        except MemfitError:
            results = None
        finally:
            self.elapsed_s += time.perf_counter() - started
        if results is None:
            for w in todo.values():
                self._try(w)
            return
        self.n_batches += 1
        self.n_calls += len(todo)
        self._cache.update(zip(todo, results, strict=True))

    def _try(self, w: WorkloadSpec) -> None:
        with contextlib.suppress(MemfitError):  # cached: raised again when asked for
            self(w)


def _unwrap(value: MemoryEstimate | MemfitError) -> MemoryEstimate:
    if isinstance(value, MemfitError):
        raise value
    return value


def analytic_available() -> bool:
    """Whether the analytic engine (``memfit.estimate.analytic.estimate_analytic``) is installed."""
    try:
        module = importlib.import_module("memfit.estimate.analytic")
    except ImportError:
        return False
    return hasattr(module, "estimate_analytic")


@dataclass(frozen=True, kw_only=True)
class EnginePair:
    search: CachedEstimator
    confirm: CachedEstimator | None  # None: the search engine is already the precise one


def default_engines(source: Any, gpu: Any) -> EnginePair:
    """Analytic to search and trace to confirm, or trace alone without the analytic engine."""
    from memfit.estimate import _trace_stack_missing, estimate

    def engine(name: str) -> CachedEstimator:
        return CachedEstimator(lambda w: estimate(source, w, gpu=gpu, engine=name), name)

    trace_ok = source.origin == "factory" or _trace_stack_missing(source) is None
    if analytic_available():
        from memfit.estimate.analytic import estimate_many

        search = engine("analytic")
        if source.config is not None:
            search.batch = lambda ws: estimate_many(source, ws, gpu=gpu)
        return EnginePair(search=search, confirm=engine("trace") if trace_ok else None)
    return EnginePair(search=engine("trace"), confirm=None)


def _wrap(fn: Estimator, name: str) -> CachedEstimator:
    return fn if isinstance(fn, CachedEstimator) else CachedEstimator(fn, name)


def resolve_engines(
    source: Any, gpu: Any, estimator: Estimator | None, confirm: Estimator | None
) -> EnginePair:
    """The injected estimators where given, the defaults otherwise."""
    given_confirm = None if confirm is None else _wrap(confirm, "confirm")
    if estimator is None:
        default = default_engines(source, gpu)
        return EnginePair(search=default.search, confirm=given_confirm or default.confirm)
    return EnginePair(search=_wrap(estimator, "injected"), confirm=given_confirm)
