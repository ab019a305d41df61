"""A *predicted* memory snapshot: the trace engine's allocation history in
``torch.cuda.memory._dump_snapshot``'s format, so pytorch.org/memory_viz opens a prediction next to
a real recording (``memfit estimate ... --engine trace --snapshot FILE.pickle``).

While :func:`memfit.estimate.history.recording` is active, the trace engine keeps each
fake-tensor run's history (:class:`~memfit.estimate.history.RecordedTrace`): the
``("a", key, n_bytes)`` / ``("f", key, 0)`` events its StorageTracker counted, who owned each
storage (module, component, phase), and the cuBLAS/cuBLASLt workspaces the engine's allocator
replay puts first. :func:`history_snapshot` replays them through memfit's
caching-allocator model (:func:`memfit.snapshot.generate.snapshot_from_events`) for addresses,
``segment_alloc`` / ``alloc`` / ``free_requested`` / ``free_completed`` actions and the segments
live at the end.

What it is not: a CUDA recording. Addresses come from the allocator model; times are event
numbers (microseconds = the event's index); frames are one synthetic frame per allocation naming
the owning module and component (no Python or C++ stack). The analytic engine runs no model and
has no history. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.history import RecordedTrace

#: The frame's file for memory_viz: says what made the entry.
PREDICTED_FILE = "memfit-predicted"


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
