"""A predicted snapshot next to a measured one (``memfit snapshot MEASURED --predicted PRED``).

Both files are read by the same safe reader and summarised by the same analysis
(:func:`memfit.snapshot.analyze_snapshot`); the comparison is of what both can say: the trace's
peak allocated and reserved bytes, the state when the snapshot was taken, the number of
allocations and of ``cudaMalloc`` segments. The error is (predicted - measured) / measured, the
sign convention of docs/accuracy.md (negative: the prediction is short).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.snapshot.analyze import SnapshotAnalysis, analyze_snapshot


@dataclass(frozen=True, kw_only=True)
class ComparedMetric:
    name: str
    predicted: int | None
    measured: int | None

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when either is unknown or measured is 0."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "predicted": self.predicted,
            "measured": self.measured,
            "error": self.error,
        }


@dataclass(frozen=True, kw_only=True)
class SnapshotComparison:
    predicted: SnapshotAnalysis
    measured: SnapshotAnalysis
    metrics: list[ComparedMetric]

    def to_json(self) -> dict[str, Any]:
        return {
            "metrics": [m.to_json() for m in self.metrics],
            "predicted": self.predicted.to_json(),
            "measured": self.measured.to_json(),
        }


def _device_metrics(a: SnapshotAnalysis) -> dict[str, int | None]:
    d = a.devices[0] if a.devices else None
    return {
        "trace peak allocated bytes": d.peak_allocated_bytes if d else None,
        "trace peak reserved bytes": d.peak_reserved_bytes if d else None,
        "allocated bytes at the snapshot": a.allocated_bytes,
        "reserved bytes at the snapshot": a.reserved_bytes,
        "allocations in the trace": d.actions.get("alloc", 0) if d else None,
        "segments allocated in the trace": d.actions.get("segment_alloc", 0) if d else None,
    }


def compare_snapshots(
    predicted: str | Path, measured: str | Path, *, top: int = 10
) -> SnapshotComparison:
    """Analyse both snapshots and line up what both can say."""
    pred, meas = analyze_snapshot(predicted, top=top), analyze_snapshot(measured, top=top)
    p, m = _device_metrics(pred), _device_metrics(meas)
    metrics = [ComparedMetric(name=k, predicted=p[k], measured=m[k]) for k in p]
    return SnapshotComparison(predicted=pred, measured=meas, metrics=metrics)
