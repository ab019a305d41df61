"""Reserved bytes from allocated bytes: a calibrated ratio for the caching allocator's overhead.

The trace engine replays every allocation through a model of PyTorch's caching allocator; the
analytic engine has no allocation sequence, only the peak, so it scales the peak by the median
ratio ``peak_reserved / peak_allocated`` the trace engine reports over the calibration grid of
``benchmarks/analytic_vs_trace.py`` (its results file lists each ratio and the error this causes),
with the grid's spread as the range.

Where the verdict is settled without a trace (memfit.estimate.fastpath), the band is the job
class's own (:func:`class_band`): ``benchmarks/reserved_bands.py`` fits, per fast-path grid job
(full fine-tune bf16-true / bf16-mixed, LoRA, checkpointing, LoRA + checkpointing, inference),
a line ``ratio x allocated + fixed`` over every row of that class, into the generated table
``reserved_bands.py``. Classes the grid does not cover keep the wide range.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.estimate.analytic.reserved_bands import BANDS
from memfit.estimate.pipeline import ReservedRule
from memfit.hardware.cuda_allocator import LARGE_BUFFER_BYTES, SMALL_BUFFER_BYTES
from memfit.units import format_bytes

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

#: The least an inference job reserves, and what its range's top adds to the ratio: the caching
#: allocator's smallest segments, one of the large pool (``kLargeBuffer``, 20 MiB: the segment a
#: 1-10 MiB request is carved from) and one of the small pool (``kSmallBuffer``, 2 MiB: requests
#: up to 1 MiB), PyTorch's c10/cuda/CUDACachingAllocator.cpp (memfit.estimate.allocator.caching
#: models them). A forward pass allocates in both pools, so a job whose allocated bytes are a
#: few MiB still reserves 22 MiB (every tiny inference row of the fast-path grid: trace reserved
#: = 2.31-2.37 x allocated), and one partly used segment of each pool is granularity the ratio
#: (fitted to job-sized cases) does not carry: t5-small cut to 2 layers at 32 x 512 reserves
#: 1.360 x (docs/accuracy.md, "Inference on the default engine"). Training keeps its rule.
MIN_SEGMENTS_BYTES = LARGE_BUFFER_BYTES + SMALL_BUFFER_BYTES

#: An inference job's reserved bytes where the analytic engine knows its parameters' share of
#: the peak (``held``): ``held x held_ratio + (allocated - held) x ratio + MIN_SEGMENTS_BYTES``.
#: The weights are allocated once at load and never freed, so only their sizes' rounding into
#: the allocator's segments costs (a few %); the rest (KV cache, activations, temporaries) is
#: what the caching allocator fragments; the 22 MiB are one partly used segment of each pool,
#: present once whatever the job's size. A ratio of the whole peak cannot be right at every
#: depth: a 2-layer cut of phi-4 reserves 1.17 x (its weights 63 % of the peak), a
#: full-depth 7B 1.02 x. Fitted by ``benchmarks/infer_reserved.py --fit`` (its docstring) to
#: every row of ``benchmarks/results/infer_reserved.jsonl`` (the trace's replay: 20 serving-size
#: jobs of qwen3-0.6b, llama-3.2-1b, llama-3.1-8b, mistral-7b-v0.1 at full depth and cut to
#: 2-14 layers, batches 1-32, prompts 512-8192, 16-256 new tokens; and the
#: fast-path grid's 60 ``infer`` / ``infer_long`` rows) and the 2 inference cases of
#: ``benchmarks/results/gpu_h200_measurements.jsonl`` (a real H200: llama-3.2-1b reserves
#: 1.119 x there, the trace 1.056 x): ``shown`` puts every row at >= 98 % of its measured
#: reserved bytes (the answer ``estimate`` shows), ``top`` over every row (the band a verdict
#: settles on); tests/estimate/analytic/test_infer_reserved.py refits and compares.
#: (held_ratio, ratio) each.
INFER_RESERVED = {"shown": (1.005, 1.447), "top": (1.026, 1.475)}
#: How many rows the fit rests on, how many of them >= 1 GiB, and which set the top's ratio.
INFER_BAND_ROWS = (82, 31, "qwen3-0.6b (depth full, 1 x 512 + 16)")


@dataclass(frozen=True)
class Reserved:
    bytes: int
    ratio: float
    range: tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class ClassBand:
    """One job class's reserved band, fitted to the fast-path grid's rows of that class by
    ``benchmarks/reserved_bands.py`` (:data:`BANDS`): the trace's reserved bytes lie at most
    ``ratio`` x the analytic allocated bytes + ``fixed_bytes`` on every row of the class."""

    job: str
    ratio: float
    fixed_bytes: int
    low_ratio: float
    n_rows: int
    n_large_rows: int
    worst: str
    #: inference (:data:`INFER_RESERVED`): the ratio of the parameters' bytes, which ``ratio``
    #: then scales the rest of the peak beyond; None: ``ratio`` scales the whole peak.
    held_ratio: float | None = None

    def top_bytes(self, allocated_bytes: int, held_bytes: int = 0) -> int:
        if self.held_ratio is None:
            return int(allocated_bytes * self.ratio) + self.fixed_bytes
        held = min(held_bytes, allocated_bytes)
        rest = int((allocated_bytes - held) * self.ratio)
        return held + int(held * (self.held_ratio - 1)) + rest + self.fixed_bytes

    def describe(self) -> str:
        """One line: ``job class 'lora' (27 fast-path grid rows, ...): reserved <= allocated x
        1.0431 + 23.81 MiB``."""
        if self.held_ratio is not None:
            return (
                f"job class {self.job!r} ({self.n_rows} measured inference rows, "
                f"{self.n_large_rows} of them >= 1 GiB; widest: {self.worst}): reserved <= "
                f"parameters x {self.held_ratio:.3f} + the rest of the peak x {self.ratio:.3f} + "
                f"{format_bytes(self.fixed_bytes)}"
            )
        return (
            f"job class {self.job!r} ({self.n_rows} fast-path grid rows, {self.n_large_rows} of "
            f"them >= 1 GiB; widest: {self.worst}): reserved <= allocated x {self.ratio:.4f} + "
            f"{format_bytes(self.fixed_bytes)}"
        )


def class_band(job: str | None) -> ClassBand | None:
    """The reserved band of the grid job ``job`` (``memfit.estimate.fastpath.grid_job``); None
    where the grid has no band for it (the wide :data:`RESERVED_RATIO` band applies)."""
    if job == "infer":  # its own fit (INFER_RESERVED), not the grid's short decodes
        held_ratio, ratio = INFER_RESERVED["top"]
        n_rows, n_large, worst = INFER_BAND_ROWS
        return ClassBand(job=job, ratio=ratio, fixed_bytes=MIN_SEGMENTS_BYTES, low_ratio=1.0,
                         n_rows=n_rows, n_large_rows=n_large, worst=worst,
                         held_ratio=held_ratio)  # fmt: skip
    row = BANDS.get(job or "")
    if row is None or job is None:
        return None
    return ClassBand(
        job=job,
        ratio=float(row["ratio"]),
        fixed_bytes=int(row["fixed_bytes"]),
        low_ratio=float(row["low_ratio"]),
        n_rows=int(row["n_rows"]),
        n_large_rows=int(row["n_large_rows"]),
        worst=str(row["worst"]),
    )


#: Which point of the ratio range an estimate's reserved bytes take: ``mid`` (the median: every
#: search, ``--engine analytic``), ``high`` (the top of the wide range: the default answer of a
#: checkpointed job under ``--engine auto``, memfit.estimate.fastpath) or ``band`` (the top of
#: the job class's band, :func:`class_band`, where the grid has one, else ``high``: the point
#: the trace's verdict is settled on, memfit.estimate.fastpath.verdict_settled).
RESERVED_ENDS = ("mid", "high", "band")


def reserved_rule(
    *, training: bool, end: str = "mid", job: str | None = None, held_bytes: int | None = None
) -> ReservedRule:
    """The rule the analytic engine hands the pipeline (``pipeline.assemble`` applies it).
    ``job``: the grid job class whose band ``end="band"`` takes (None: the wide band).
    ``held_bytes``: an inference job's parameters' bytes at its peak (None: not known), which
    its answer shown (``mid``) and its own band take (:data:`INFER_RESERVED`)."""
    mid, low, high = RESERVED_RATIO["train" if training else "infer"]
    if end not in RESERVED_ENDS:
        raise ValueError(f"end ({end!r}) must be one of {', '.join(RESERVED_ENDS)}")
    band = class_band(job) if end == "band" else None
    held_rule = not training and held_bytes is not None
    if held_rule and (end == "mid" or (band is not None and band.held_ratio is not None)):
        return infer_rule(int(held_bytes or 0), band=end == "band")
    if band is not None and band.held_ratio is not None:  # no parameters' share: the wide band
        band = None
        end = "high"
    if band is not None:
        fixed = (band.fixed_bytes, band.fixed_bytes)
        return ReservedRule(ratio=(band.ratio, band.low_ratio, band.ratio), fixed_bytes=fixed)
    if not training:  # the allocator's smallest segments: a floor, and granularity at the top
        at_point = 0 if end == "mid" else MIN_SEGMENTS_BYTES
        return ReservedRule(
            ratio=(mid if end == "mid" else high, low, high),
            fixed_bytes=(at_point, MIN_SEGMENTS_BYTES),
            floor_bytes=MIN_SEGMENTS_BYTES,
        )
    return ReservedRule(ratio=(mid if end == "mid" else high, low, high))


def infer_rule(held_bytes: int, *, band: bool) -> ReservedRule:
    """An inference job's rule (:data:`INFER_RESERVED`) for parameters of ``held_bytes``: the
    answer shown (``band=False``: the ``shown`` fit, its range's top the ``top`` fit) or the
    band's top (``band=True``). The held bytes' ratio rides in ``fixed_bytes`` (the pipeline's
    rule scales the rest of the peak)."""
    shown_held, shown = INFER_RESERVED["shown"]
    top_held, top = INFER_RESERVED["top"]
    at_top = MIN_SEGMENTS_BYTES + int(held_bytes * (top_held - 1))
    at_point = at_top if band else MIN_SEGMENTS_BYTES + int(held_bytes * (shown_held - 1))
    return ReservedRule(
        ratio=(top if band else shown, 1.0, top),
        fixed_bytes=(at_point, at_top),
        floor_bytes=MIN_SEGMENTS_BYTES,
        held_bytes=held_bytes,
    )


def reserved_bytes(peak_allocated_bytes: int, *, training: bool) -> Reserved:
    rule = reserved_rule(training=training)
    n_bytes, rng = rule.at(peak_allocated_bytes)
    assert rule.ratio is not None and rng is not None  # a ratio rule always has a range
    return Reserved(bytes=n_bytes, ratio=rule.ratio[0], range=rng)
