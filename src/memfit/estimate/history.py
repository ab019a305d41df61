"""The trace engine's allocation histories, kept while a caller records them (``memfit estimate
... --snapshot``, the web page's predicted snapshot).

While :func:`recording` is active, the trace engine hands each fake-tensor run's history to
:func:`keep`: the ``("a", key, n_bytes)`` / ``("f", key, 0)`` events its StorageTracker counted,
who owned each storage (module, component, phase), and the cuBLAS/cuBLASLt workspaces the
engine's allocator replay puts first. :mod:`memfit.snapshot.predicted` turns a kept history into
a snapshot file; the hook lives here, below both, so the engine records without importing the
snapshot writer. Torch-free (the engine that calls :func:`keep` imports torch itself).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RecordedTrace:
    """One fake-tensor run's allocation history, as the trace engine saw it."""

    events: list[tuple[str, int, int]]
    #: key -> (module, component label, phase it was born in)
    owners: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    workspace_sizes: list[int] = field(default_factory=list)

    @property
    def n_allocations(self) -> int:
        return sum(1 for e in self.events if e[0] == "a")


_RECORDING: ContextVar[list[RecordedTrace] | None] = ContextVar("memfit_history", default=None)


def is_recording() -> bool:
    """Whether a :func:`recording` is active here (an answer kept without its history, such as
    the trace cache's, would leave it empty)."""
    return _RECORDING.get() is not None


@contextmanager
def recording() -> Iterator[list[RecordedTrace]]:
    """Collect the histories of the trace-engine runs inside the block (in this context)."""
    traces: list[RecordedTrace] = []
    token = _RECORDING.set(traces)
    try:
        yield traces
    finally:
        _RECORDING.reset(token)


def keep(
    events: Sequence[tuple[str, int, int]], tracker: Any, workspace_sizes: Sequence[int]
) -> None:
    """Called by the trace engine after each run; does nothing unless :func:`recording`."""
    traces = _RECORDING.get()
    if traces is None:
        return
    owners: dict[int, tuple[str, str, str]] = {}
    for key, s in getattr(tracker, "storages", {}).items():
        owners[key] = (str(s.module), str(s.label or ""), str(s.phase))
    traces.append(
        RecordedTrace(events=list(events), owners=owners, workspace_sizes=list(workspace_sizes))
    )
