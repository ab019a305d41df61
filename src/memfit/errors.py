"""The memfit exception tree. Every message says what is wrong, the value, and what to do next.

::

    MemfitError
    ├── SpecError(ValueError)        an input breaks a rule (field, value, rule)
    │   └── NotModelledError             an engine cannot model this job; another engine may
    ├── UnknownModelError(LookupError)   a MODEL argument that no source recognises
    │   └── HubUnavailableError          a hub id while offline / hub unreachable
    ├── ModelConfigError             a config.json / safetensors header that cannot be read
    ├── UnknownGPUError(LookupError)     a GPU name not in the catalog (carries close matches)
    ├── TraceError                   the model could not be executed on fake tensors
    ├── MissingDependencyError(ImportError)  an optional package (torch, transformers…) is absent
    ├── SnapshotError                a CUDA memory snapshot that is unreadable or not a snapshot
    └── DoesNotFitError              raised on request by ``raise_if_not_fit()``
"""

from __future__ import annotations


class MemfitError(Exception):
    """Base class of every error memfit raises on purpose."""


class SpecError(MemfitError, ValueError):
    """An input value breaks a rule. Several problems may be reported at once (``problems``)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]

    @classmethod
    def from_problems(cls, problems: list[str]) -> SpecError:
        if len(problems) == 1:
            return cls(problems[0], problems)
        return cls(f"{len(problems)} problems: " + "; ".join(problems), problems)


class NotModelledError(SpecError):
    """An engine has no route for this job (a model family, task or technique combination it does
    not model): not a property of the job, which another engine may answer. ``engine`` names the
    engine that refused. A ``SpecError`` so that code written before the distinction (which
    treated the refusal as bad input) keeps working; catch this one first to tell them apart."""

    def __init__(self, message: str, *, engine: str) -> None:
        super().__init__(message)
        self.engine = engine


class UnknownModelError(MemfitError, LookupError):
    """A MODEL argument that is not a bundled name, a path, a hub id or a module:factory."""


class HubUnavailableError(UnknownModelError):
    """A hub id was given but the hub cannot be reached and no cached config exists."""


class ModelConfigError(MemfitError):
    """A config.json or safetensors header exists but is malformed or incomplete."""


class UnknownGPUError(MemfitError, LookupError):
    """A GPU name not in the catalog; ``close_matches`` lists the nearest names."""

    def __init__(self, message: str, close_matches: list[str] | None = None) -> None:
        super().__init__(message)
        self.close_matches = close_matches or []


class TraceError(MemfitError):
    """The model or step could not be executed on fake tensors."""


class MissingDependencyError(MemfitError, ImportError):
    """An optional dependency is not installed (the message gives the pip command)."""


class DoesNotFitError(MemfitError):
    """The workload does not fit the requested GPU (raised only on request)."""


class SnapshotError(MemfitError):
    """A CUDA memory snapshot file that cannot be read, is not a snapshot, or names a class."""
