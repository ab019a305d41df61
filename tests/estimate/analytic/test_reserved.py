"""The analytic reserved model's constants are the fit the calibration grid reports."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from memfit.estimate.analytic.reserved import (
    MIN_SEGMENTS_BYTES,
    RESERVED_RATIO,
    reserved_bytes,
    reserved_rule,
)
from memfit.units import MiB

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


def test_an_inference_job_reserves_at_least_the_allocators_smallest_segments() -> None:
    """A forward pass allocates in both of the caching allocator's pools: one 20 MiB large-pool
    and one 2 MiB small-pool segment at the least (every tiny inference row of the fast-path
    grid reserves 22-24 MiB for ~9 MiB allocated), and the range's top adds them to the ratio."""
    assert 22 * MiB == MIN_SEGMENTS_BYTES
    mid, low, high = RESERVED_RATIO["infer"]
    tiny = reserved_bytes(9 * MiB, training=False)
    assert tiny.bytes == 22 * MiB
    assert tiny.range == (22 * MiB, int(9 * MiB * high) + 22 * MiB)
    big = reserved_bytes(10**10, training=False)
    assert big.bytes == int(1e10 * mid)  # the floor is nothing beside a job-sized peak
    assert big.range == (int(1e10 * low), int(1e10 * high) + 22 * MiB)
    top, _range = reserved_rule(training=False, end="high").at(10**10)
    assert top == int(1e10 * high) + 22 * MiB


def test_a_training_job_keeps_the_plain_ratio() -> None:
    mid, _low, _high = RESERVED_RATIO["train"]
    assert reserved_bytes(9 * MiB, training=True).bytes == int(9 * MiB * mid)
    assert reserved_rule(training=True).floor_bytes == 0
