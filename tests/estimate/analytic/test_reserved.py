"""The analytic reserved model's constants are the fit the calibration grid reports."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from memfit.estimate.analytic.reserved import RESERVED_RATIO, reserved_bytes

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmarks" / "results" / "analytic_vs_trace.md"


def _grid_rows() -> list[tuple[str, float]]:
    section = RESULTS.read_text(encoding="utf-8").split("## Reserved bytes", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d+\.\d{3}", cells[2]):
            rows.append((cells[1], float(cells[2])))
    return rows


def test_reserved_ratios_are_the_fit_of_the_published_grid() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from analytic_vs_trace import reserved_fit, single_gpu
    finally:
        sys.path.pop(0)
    rows = _grid_rows()
    assert sum(single_gpu(w) for w, _ in rows) >= 40
    assert reserved_fit(rows) == RESERVED_RATIO


def test_reserved_bytes_scale_the_peak_with_the_fitted_range() -> None:
    r = reserved_bytes(10**9, training=True)
    mid, low, high = RESERVED_RATIO["train"]
    assert r.bytes == int(1e9 * mid) and r.range == (int(1e9 * low), int(1e9 * high))
    assert low <= mid <= high
