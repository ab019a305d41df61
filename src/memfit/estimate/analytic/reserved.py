"""Reserved bytes from allocated bytes: a calibrated ratio for the caching allocator's overhead.

The trace engine replays every allocation through a model of PyTorch's caching allocator; the
analytic engine has no allocation sequence, only the peak, so it scales the peak by the median
ratio ``peak_reserved / peak_allocated`` the trace engine reports over the calibration grid of
``benchmarks/analytic_vs_trace.py`` (its results file lists each ratio and the error this causes),
with the grid's spread as the range.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Median, lowest and highest ``peak_reserved_bytes / peak_allocated_bytes`` of the trace engine
#: over the calibration grid (benchmarks/results/analytic_vs_trace.md, 38 cases of 14 families),
#: training and inference. In-sample: the same grid reports the error this leaves (median ~3 %,
#: worst ~20 %: fragmentation depends on the allocation order, which a closed form does not see).
RESERVED_RATIO = {
    "train": (1.049, 1.002, 1.229),
    "infer": (1.046, 1.000, 1.303),
}


@dataclass(frozen=True)
class Reserved:
    bytes: int
    ratio: float
    range: tuple[int, int]


def reserved_bytes(peak_allocated_bytes: int, *, training: bool) -> Reserved:
    mid, low, high = RESERVED_RATIO["train" if training else "infer"]
    return Reserved(
        bytes=int(peak_allocated_bytes * mid),
        ratio=mid,
        range=(int(peak_allocated_bytes * low), int(peak_allocated_bytes * high)),
    )
