"""CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``): read safely, summarise in text.

``analyze_snapshot(path)`` needs neither torch nor a GPU; see docs/snapshots.md.
"""

from __future__ import annotations

from memfit.snapshot.analyze import SnapshotAnalysis, analyze_snapshot
from memfit.snapshot.load import load_snapshot

__all__ = ["SnapshotAnalysis", "analyze_snapshot", "load_snapshot"]
