"""Reserved bytes from allocated bytes: a calibrated ratio for the caching allocator's overhead.

The trace engine replays every allocation through a model of PyTorch's caching allocator; the
analytic engine has no allocation sequence, only the peak, so it scales the peak by the median
ratio ``peak_reserved / peak_allocated`` the trace engine reports over the calibration grid of
``benchmarks/analytic_vs_trace.py`` (its results file lists each ratio and the error this causes),
with the grid's spread as the range.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.estimate.pipeline import ReservedRule

#: Median, lowest and highest ``peak_reserved_bytes / peak_allocated_bytes`` of the trace engine
#: over the single-GPU cases of the calibration grid (benchmarks/results/analytic_vs_trace.md,
#: 62 cases of 18 families; ``reserved_fit`` in benchmarks/analytic_vs_trace.py computes them
#: and tests/estimate/analytic/test_reserved.py checks they match the file), training and
#: inference. In-sample: the same file reports the error this leaves (median ~3-5 %, worst
#: ~20 %: fragmentation depends on the allocation order, which a closed form does not see).
RESERVED_RATIO = {
    "train": (1.066, 1.002, 1.278),
    "infer": (1.082, 1.0, 1.303),
}


@dataclass(frozen=True)
class Reserved:
    bytes: int
    ratio: float
    range: tuple[int, int]


#: Which point of the ratio range an estimate's reserved bytes take: ``mid`` (the median: every
#: search, ``--engine analytic``) or ``high`` (the top: the default answer of ``estimate`` under
#: ``--engine auto``, never far under the trace: memfit.estimate.fastpath).
RESERVED_ENDS = ("mid", "high")


def reserved_rule(*, training: bool, end: str = "mid") -> ReservedRule:
    """The rule the analytic engine hands the pipeline (``pipeline.assemble`` applies it)."""
    mid, low, high = RESERVED_RATIO["train" if training else "infer"]
    if end not in RESERVED_ENDS:
        raise ValueError(f"end ({end!r}) must be one of {', '.join(RESERVED_ENDS)}")
    return ReservedRule(ratio=(high if end == "high" else mid, low, high))


def reserved_bytes(peak_allocated_bytes: int, *, training: bool) -> Reserved:
    rule = reserved_rule(training=training)
    n_bytes, rng = rule.at(peak_allocated_bytes)
    assert rule.ratio is not None and rng is not None  # a ratio rule always has a range
    return Reserved(bytes=n_bytes, ratio=rule.ratio[0], range=rng)
