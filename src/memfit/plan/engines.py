"""The estimators the planner and the solver call: a fast one to search, a precise one to confirm.

An estimator is any ``Callable[[WorkloadSpec], MemoryEstimate]`` (tests inject their own). The
default searches with the analytic engine (closed forms, milliseconds) when it is installed and
confirms the plans it shows with the trace engine (fake-tensor execution, seconds); without the
analytic engine it searches with the trace engine and needs no confirmation.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.estimate.result import MemoryEstimate
from memfit.spec import WorkloadSpec

Estimator = Callable[[WorkloadSpec], MemoryEstimate]


def workload_key(w: WorkloadSpec) -> str:
    return json.dumps(w.normalized(), sort_keys=True, default=str)


class CachedEstimator:
    """Memoises an estimator by workload and counts the calls that reached it."""

    def __init__(self, fn: Estimator, name: str) -> None:
        self.fn = fn
        self.name = name
        self.n_calls = 0
        self._cache: dict[str, MemoryEstimate] = {}

    def __call__(self, w: WorkloadSpec) -> MemoryEstimate:
        key = workload_key(w)
        if key not in self._cache:
            self.n_calls += 1
            self._cache[key] = self.fn(w)
        return self._cache[key]


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
        return EnginePair(search=engine("analytic"), confirm=engine("trace") if trace_ok else None)
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
