"""The estimators the planner and the solver call: a fast one to search, a precise one to confirm.

An estimator is any ``Callable[[WorkloadSpec], MemoryEstimate]`` (tests inject their own). Which
engines the defaults are is the engine policy's choice
(:meth:`memfit.estimate.policy.EnginePolicy.search_engines`, the policy set by ``--engine``):
the analytic engine (closed forms, milliseconds) searches and the trace engine (fake-tensor
execution, seconds) confirms (plan: ``confirm="auto"``, memfit.plan.search); for a model
without an analytic program the derived engine (the trace's bytes, replayed) searches and needs
no confirmation; without either the trace engine searches.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memfit import progress
from memfit.errors import MemfitError
from memfit.estimate.policy import (
    EnginePolicy,
    FirstEstimate,
    active,
    fast_answer,
    run_engine,
    with_reason,
)
from memfit.estimate.policy import Estimator as Estimator  # the planner's name for it
from memfit.estimate.result import MemoryEstimate
from memfit.spec import WorkloadSpec

BatchEstimator = Callable[[Sequence[WorkloadSpec]], list[MemoryEstimate]]


def workload_key(w: WorkloadSpec) -> str:
    """A stable key of a workload (``repr`` of the frozen spec: every field, in order)."""
    return repr(w)


class CachedEstimator:
    """Memoises an estimator by workload (answers and errors alike) and counts the workloads that
    reached it. ``batch``: an optional ``Callable[[Sequence[WorkloadSpec]], list[MemoryEstimate]]``
    that estimates many workloads at once (the analytic engine's ``estimate_many`` shares its
    simulations among workloads that differ only in batch size); :meth:`prefetch` uses it.
    ``guide``: an optional cheap, inexact estimator a search may probe with before it certifies
    its answer with this one (:func:`memfit.plan.solve.largest_guided`); :meth:`probe` calls it
    and ``n_guided`` counts those calls (``n_calls`` counts this engine's own estimates)."""

    def __init__(
        self,
        fn: Estimator,
        name: str,
        *,
        batch: BatchEstimator | None = None,
        guide: Estimator | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.batch = batch
        self.guide = guide
        #: an optional cheap route to the search's first answer, where that answer alone
        #: settles the search (:meth:`memfit.estimate.policy.EnginePolicy.search_first`)
        self.first: FirstEstimate | None = None
        self.n_guided = 0
        self.n_calls = 0
        self.n_batches = 0
        self.elapsed_s = 0.0
        self._cache: dict[str, MemoryEstimate | MemfitError] = {}

    def __call__(self, w: WorkloadSpec) -> MemoryEstimate:
        key = workload_key(w)
        if key not in self._cache:
            self.n_calls += 1
            progress.report(f"{self.name} engine: estimate {self.n_calls}")
            started = time.perf_counter()
            try:
                self._cache[key] = self.fn(w)
            except MemfitError as exc:
                self._cache[key] = exc
            finally:
                self.elapsed_s += time.perf_counter() - started
        return _unwrap(self._cache[key])

    def known(self, w: WorkloadSpec) -> bool:
        """Whether ``w`` was estimated already (its answer or error kept)."""
        return workload_key(w) in self._cache

    def probe(self, w: WorkloadSpec) -> MemoryEstimate:
        """The guide's estimate of ``w`` (not cached: it may change as exact answers arrive);
        this engine's own answer where it has no guide, where the guide cannot estimate ``w``,
        or where ``w`` was already estimated exactly."""
        key = workload_key(w)
        if self.guide is None or key in self._cache:
            return self(w)
        started = time.perf_counter()
        try:
            est = self.guide(w)
        except MemfitError:
            return self(w)
        finally:
            self.elapsed_s += time.perf_counter() - started
        self.n_guided += 1
        return est

    def seed(self, w: WorkloadSpec, est: MemoryEstimate) -> None:
        """Keep ``est`` as this engine's answer for ``w`` (an answer it gave by another route:
        :attr:`first`), counted as one of its estimates."""
        key = workload_key(w)
        if key not in self._cache:
            self.n_calls += 1
            self._cache[key] = est

    def prefetch(self, workloads: Sequence[WorkloadSpec], *, batched: bool = False) -> None:
        """Estimate the ``workloads`` not cached yet in one batch call (one at a time without a
        batch function, or when the batch call fails: each workload then gets its own answer).
        ``batched``: through the batch function even for one workload (answers as the call
        for all of them gives: a stack's smallest split before its others, issue 32)."""
        todo: dict[str, WorkloadSpec] = {}
        for w in workloads:
            key = workload_key(w)
            if key not in self._cache:
                todo.setdefault(key, w)
        if not todo:
            return
        if self.batch is None or (len(todo) == 1 and not batched):
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

    def n_traced(self) -> tuple[int, int]:
        """(trace-engine answers among this estimator's, those read from the trace cache)."""
        traced = [v for v in self._cache.values() if isinstance(v, MemoryEstimate)]
        traced = [v for v in traced if v.engine == "trace"]
        return len(traced), sum(1 for v in traced if v.trace.get("cached"))

    def _try(self, w: WorkloadSpec) -> None:
        with contextlib.suppress(MemfitError):  # cached: raised again when asked for
            self(w)


def _unwrap(value: MemoryEstimate | MemfitError) -> MemoryEstimate:
    if isinstance(value, MemfitError):
        raise value
    return value


@dataclass(frozen=True, kw_only=True)
class EnginePair:
    search: CachedEstimator
    confirm: CachedEstimator | None  # None: the search engine is already the precise one
    reason: str | None = None  # why these engines (the policy's rule); None when injected
    #: the search engine's answer at the top of its validated error band (the analytic
    #: engine's reserved bytes at the top of its job class's band, or of the wide measured
    #: ratio range where the grid has no band for the class; its allocated band in the
    #: range): where that still fits, the trace cannot change the verdict and
    #: ``confirm="auto"`` leaves the plan unconfirmed. None: no band known (the plans shown
    #: are confirmed).
    band: Estimator | None = None
    #: the answer ``memfit estimate`` shows first for a job (:func:`memfit.estimate.policy.
    #: fast_answer`: the analytic engine's, never above its job class's band), None where the
    #: grid does not validate the job: a plan the search engine leaves tight is judged with it
    #: (one verdict with ``memfit estimate``). None: no fast answer (the search engine's stands).
    fast: Callable[[WorkloadSpec], MemoryEstimate | None] | None = None


def default_engines(source: Any, gpu: Any, policy: EnginePolicy | None = None) -> EnginePair:
    """The ``policy``'s engines for a search (default: the active one, see
    :func:`memfit.estimate.policy.use_engine`): the analytic one batched over workloads that
    differ only in batch size where the model has a config.json (``estimate_many``)."""
    policy = policy or active()
    chosen = policy.search_engines(source)

    def engine(name: str) -> CachedEstimator:
        fn = policy.search_estimator(source, gpu, name, chosen.reason)
        return CachedEstimator(fn, name)

    search = engine(chosen.search)
    if chosen.search == "derived":
        search.guide = policy.search_guide(source, gpu, chosen.reason)
        search.first = policy.search_first(source, gpu, chosen.reason)
    if chosen.search == "analytic" and source.config is not None:
        from memfit.estimate.analytic import estimate_many

        search.batch = lambda ws: [
            with_reason(e, chosen.reason) for e in estimate_many(source, ws, gpu=gpu)
        ]
    confirm = None if chosen.confirm is None else engine(chosen.confirm)
    band: Estimator | None = None
    fast: Callable[[WorkloadSpec], MemoryEstimate | None] | None = None
    if chosen.search == "analytic" and confirm is not None:

        def at_band_top(w: WorkloadSpec) -> MemoryEstimate:
            return run_engine("analytic", source, w, gpu, reserved_end="band")

        def fast_first(w: WorkloadSpec) -> MemoryEstimate | None:
            answered = fast_answer(source, w, gpu)
            return None if answered is None else answered[0]

        band, fast = at_band_top, fast_first
    return EnginePair(search=search, confirm=confirm, reason=chosen.reason, band=band, fast=fast)


def _wrap(fn: Estimator, name: str) -> CachedEstimator:
    return fn if isinstance(fn, CachedEstimator) else CachedEstimator(fn, name)


def resolve_engines(
    source: Any, gpu: Any, estimator: Estimator | None, confirm: Estimator | None
) -> EnginePair:
    """The injected estimators where given, the defaults otherwise."""
    given_confirm = None if confirm is None else _wrap(confirm, "confirm")
    if estimator is None:
        default = default_engines(source, gpu)
        return EnginePair(
            search=default.search,
            confirm=given_confirm or default.confirm,
            reason=default.reason,
            band=default.band,
            fast=default.fast,
        )
    return EnginePair(search=_wrap(estimator, "injected"), confirm=given_confirm)
