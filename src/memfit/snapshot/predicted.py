"""A *predicted* memory snapshot: the trace engine's allocation history in
``torch.cuda.memory._dump_snapshot``'s format, so pytorch.org/memory_viz opens a prediction next to
a real recording (``memfit estimate ... --engine trace --snapshot FILE.pickle``).

While :func:`recording` is active, the trace engine hands each fake-tensor run's history to
:func:`keep`: the ``("a", key, n_bytes)`` / ``("f", key, 0)`` events its StorageTracker counted,
who owned each storage (module, component, phase), and the cuBLAS/cuBLASLt workspaces the
engine's allocator replay puts first. :func:`history_snapshot` replays them through memfit's
caching-allocator model (:func:`memfit.snapshot.generate.snapshot_from_events`) for addresses,
``segment_alloc`` / ``alloc`` / ``free_requested`` / ``free_completed`` actions and the segments
live at the end.

What it is not: a CUDA recording. Addresses come from the allocator model; times are event
numbers (microseconds = the event's index); frames are one synthetic frame per allocation naming
the owning module and component (no Python or C++ stack). The analytic engine runs no model and
has no history. Torch-free (the engine that calls :func:`keep` imports torch itself).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.errors import SpecError

#: The frame's file for memory_viz: says what made the entry.
PREDICTED_FILE = "memfit-predicted"


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


def _frames(owner: tuple[str, str, str] | None) -> list[dict[str, Any]]:
    if owner is None:
        return [{"filename": PREDICTED_FILE, "line": 0, "name": "(unattributed)"}]
    module, label, phase = owner
    name = f"{label} (born in {phase})" if label else f"born in {phase}"
    return [{"filename": f"{PREDICTED_FILE}:{module}", "line": 0, "name": name}]


def history_snapshot(trace: RecordedTrace) -> dict[str, Any]:
    """The snapshot dict of one recorded run, workspaces first (as the engine replays it)."""
    from memfit.snapshot.generate import snapshot_from_events

    workspace = [("a", -1 - i, n) for i, n in enumerate(trace.workspace_sizes)]
    events = workspace + trace.events
    meta: list[tuple[int, list[dict[str, Any]] | None]] = []
    for i, (kind, key, _) in enumerate(events):
        if kind != "a":
            meta.append((i, None))
        elif key < 0:
            meta.append((i, [{"filename": PREDICTED_FILE, "line": 0, "name": "cuBLAS workspace"}]))
        else:
            meta.append((i, _frames(trace.owners.get(key))))
    return snapshot_from_events(events, meta)


def pick(traces: list[RecordedTrace], engine: str) -> RecordedTrace:
    """The run a snapshot shows: the largest the engine made (with extrapolation it traced fewer
    layers than the model has, at two depths, and extrapolated; the deeper run is shown).
    A SpecError when there is none (the analytic engine answered, or nothing was traced)."""
    if engine != "trace" or not traces:
        raise SpecError(
            f"--snapshot needs an allocation history, and the {engine} engine answered, which "
            "runs no model and records none: pass --engine trace"
        )
    return max(traces, key=lambda t: t.n_allocations)


def write_history(trace: RecordedTrace, path: str | Path) -> Path:
    """Write the snapshot pickle (``pickle.dump`` as ``_dump_snapshot`` does)."""
    from memfit.snapshot.generate import write_pickle

    return write_pickle(history_snapshot(trace), path)
