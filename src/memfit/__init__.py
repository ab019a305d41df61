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
    SpecError,
    TraceError,
    UnknownGPUError,
    UnknownModelError,
)
from memfit.estimate import estimate
from memfit.estimate.result import COMPONENTS, FitVerdict, MemoryEstimate, ModuleBytes, PhasePeak
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
    "ModuleBytes",
    "PhasePeak",
    "SpecError",
    "TraceError",
    "UnknownGPUError",
    "UnknownModelError",
    "WorkloadSpec",
    "__version__",
    "estimate",
    "trace_step",
]


def trace_step(*args: Any, **kwargs: Any) -> MemoryEstimate:
    """Trace the user's own step function on fake tensors (``memfit.estimate.trace.user_step``)."""
    from memfit.estimate.trace.user_step import trace_step as _trace_step

    return _trace_step(*args, **kwargs)
