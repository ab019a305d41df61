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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

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


class InferFit(NamedTuple):
    """One fit of :data:`INFER_RESERVED`: the ratio of each part of an inference job's bytes."""

    #: the parameters (allocated once at load, never freed: only their sizes' rounding costs)
    held_ratio: float
    #: the rest of a phase's peak: activations, temporaries (the transients that fragment)
    ratio: float
    #: the live KV cache at the prefill's peak
    kv_ratio: float
    #: the prompt's cache blocks at the decode peak: holes the grown cache does not fit back into
    prompt_kv_ratio: float
    #: the grown cache at the decode peak (the last step's ``torch.cat``, new segments)
    grown_kv_ratio: float


@dataclass(frozen=True, kw_only=True)
class InferParts:
    """An inference job's bytes at its phases' peaks, as the analytic engine knows them:
    ``held_bytes`` (the parameters), the prefill's (or an encoder's forward's) peak and the KV
    cache in it (the prompt's), the decode's peak and the cache in it (grown to its last
    length; 0 without decode steps)."""

    held_bytes: int
    prefill_bytes: int
    prompt_kv_bytes: int = 0
    decode_bytes: int = 0
    grown_kv_bytes: int = 0
    #: the prefill's bytes but the parameters' as the caching allocator's replay of the
    #: program's own allocation order reserves them (``analytic/replay.py``; routed experts
    #: only); 0: not replayed
    replayed_bytes: int = 0

    @classmethod
    def of(cls, phases: Mapping[str, Mapping[str, int]]) -> InferParts:
        """The parts of an estimate's ``{phase: components}`` (``prefill`` or ``forward``, and
        ``decode``)."""
        totals = {name: sum(c.values()) for name, c in phases.items()}
        peak = max(totals, key=lambda name: totals[name])
        first = phases.get("prefill", phases.get("forward", phases[peak]))
        decode = phases.get("decode", {})
        return cls(
            held_bytes=int(phases[peak].get("parameters", 0)),
            prefill_bytes=sum(first.values()),
            prompt_kv_bytes=int(first.get("kv_cache", 0)),
            decode_bytes=sum(decode.values()),
            grown_kv_bytes=int(decode.get("kv_cache", 0)),
        )

    @property
    def peak_bytes(self) -> int:
        return max(self.prefill_bytes, self.decode_bytes)


#: An inference job's reserved bytes, from its parts (:class:`InferParts`; :func:`infer_bytes`):
#: the larger of the prefill's and the decode's
#:
#:     prefill: held x held_ratio + prompt KV x kv_ratio + (the rest of its peak) x ratio
#:     decode:  held x held_ratio + prompt KV x prompt_kv_ratio + grown KV x grown_kv_ratio
#:              + (the rest of its peak) x ratio
#:
#: plus :data:`MIN_SEGMENTS_BYTES`. The weights are allocated once at load and never freed, so
#: only their sizes' rounding into the allocator's segments costs (a few %); activations and
#: temporaries are what the caching allocator fragments; the KV cache is neither: its blocks
#: live from the prefill on (no more than their rounding at the prefill's peak), but
#: transformers' DynamicCache grows each layer's keys and values by ``torch.cat`` every decode
#: step (``DynamicLayer.update``, transformers 5.x ``cache_utils.py``: the new copy allocated
#: while the old one is alive, then the old freed), so every grown tensor needs a block larger
#: than the one it leaves, and the prompt's blocks stay behind as holes the grown cache does
#: not fit back into unless the prefill's freed activations were larger. The trace (which
#: replays 16 decode steps, then jumps the cache to its last length: trace/steps.py) reserves
#: 1.11 x on gpt2 at 150 x 768 + 256 (KV 51 % of the prefill's peak; its eager attention's
#: freed scores hold the grown cache) and 1.30 x on qwen3-0.6b at 128 x 256 + 256 (the grown
#: cache in fresh segments). A ratio of the whole non-weight peak (the previous rule, 1.447)
#: showed the first +29 %. Fitted by ``benchmarks/infer_reserved.py --fit`` (its docstring)
#: to every row of ``benchmarks/results/infer_reserved.jsonl`` (the trace's replay: 32
#: serving-size jobs of gpt2, qwen3-0.6b, llama-3.2-1b, llama-3.1-8b, mistral-7b-v0.1 at full
#: depth and cut to 2-14 layers, batches 1-256, prompts 128-8192, 16-2048 new tokens, 12 of
#: them KV-heavy; and the fast-path grid's 62 ``infer`` / ``infer_long`` rows: refitted by
#: helper "fp16rest" after the multi-query fix moved 7 of them and falcon-7b's two were added:
#: shown (1.03, 1.457, 1.0) -> (1.025, 1.46, 1.03), top unchanged) and the 2
#: inference cases of ``benchmarks/results/gpu_h200_measurements.jsonl`` (a real H200:
#: llama-3.2-1b reserves 1.119 x there, the trace 1.056 x): ``shown`` puts every row at
#: >= 98 % of its measured reserved bytes (the answer ``estimate`` shows), ``top`` over every
#: row (the band a verdict settles on); tests/estimate/analytic/test_infer_reserved.py refits
#: and compares.
INFER_RESERVED = {
    "shown": InferFit(1.025, 1.46, 1.03, 0.4, 1.19),
    "top": InferFit(1.05, 1.492, 1.01, 0.4, 1.22),
}
#: How many rows the fit rests on, how many of them >= 1 GiB, and which set the top's ratio.
INFER_BAND_ROWS = (96, 45, "llama1b-infer-gen (H200)")
#: A MoE model's prefill (:attr:`InferParts.replayed_bytes`, replayed where the program has
#: routed experts): the reserved bytes are at least the parameters x the fit's ``held_ratio``
#: + the replay's bytes x this ratio, the answer shown (``shown``) and the band's top
#: (``top``). The replay is the mechanism (each expert-path tensor a fresh segment, the
#: attention's and the dense MLP's blocks left cached), not a fit: on the fast-path grid's
#: rows of deepseek-v2-lite cut to 2, 3 and 4 layers (batches 5-32, prompts 64-256, 4-64 new
#: tokens; 9 rows) the parameters x 1.025 + the replay are +1.4 ... +2.3 % of the trace's
#: reserved bytes, and +0.9 ... +2.2 % on qwen3-30b-a3b's and mixtral-8x7b's (cut to 2
#: layers, batch 8 and 32), which the fit alone shows up to 17 % over; the replay's own bytes
#: lie within 52 MiB of the trace's reserved bytes less the parameters on those rows
#: (docs/accuracy.md, "DeepSeek-V2 inference on the fast path"). ``top``'s 4 % on the replay
#: (with the parameters at the fit's top 1.05) is a margin for allocation orders the rows do
#: not show, not fitted: the band's top is +4.1 ... +6.0 % over those rows.
REPLAYED_RATIO = {"shown": 1.0, "top": 1.04}


def infer_bytes(parts: InferParts, fit: InferFit, replayed_ratio: float = 1.0) -> int:
    """The reserved bytes :data:`INFER_RESERVED`'s ``fit`` gives ``parts``; with a replay
    (:attr:`InferParts.replayed_bytes`) at least the parameters' and the replay's bytes x
    ``replayed_ratio`` (:data:`REPLAYED_RATIO`)."""
    held = min(parts.held_bytes, parts.peak_bytes)
    out = _fitted_bytes(parts, fit, held)
    if parts.replayed_bytes:
        replayed = held + int(held * (fit.held_ratio - 1))
        out = max(out, replayed + int(parts.replayed_bytes * replayed_ratio))
    return out


def _fitted_bytes(parts: InferParts, fit: InferFit, held: int) -> int:
    base = held + int(held * (fit.held_ratio - 1)) + MIN_SEGMENTS_BYTES
    prompt = parts.prompt_kv_bytes
    rest = max(parts.prefill_bytes - held - prompt, 0)
    out = base + int(prompt * fit.kv_ratio) + int(rest * fit.ratio)
    if parts.decode_bytes:
        grown = parts.grown_kv_bytes
        rest = max(parts.decode_bytes - held - grown, 0)
        cache = int(prompt * fit.prompt_kv_ratio) + int(grown * fit.grown_kv_ratio)
        out = max(out, base + cache + int(rest * fit.ratio))
    return out


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
    #: then scales the rest of the peak beyond (the KV cache apart); None: ``ratio`` scales the
    #: whole peak.
    held_ratio: float | None = None

    def top_bytes(self, allocated_bytes: int, parts: InferParts | int = 0) -> int:
        """The band's top at a peak of ``allocated_bytes``; inference: of the job's ``parts``
        (or only its parameters' bytes: the rest of the peak all activations)."""
        if self.held_ratio is None:
            return int(allocated_bytes * self.ratio) + self.fixed_bytes
        return infer_rule(parts, band=True).at(allocated_bytes)[0]

    def describe(self) -> str:
        """One line: ``job class 'lora' (27 fast-path grid rows, ...): reserved <= allocated x
        1.0431 + 23.81 MiB``."""
        if self.held_ratio is not None:
            return (
                f"job class {self.job!r} ({self.n_rows} measured inference rows, "
                f"{self.n_large_rows} of them >= 1 GiB; widest: {self.worst}): reserved <= "
                f"{describe_infer(INFER_RESERVED['top'])}"
            )
        return (
            f"job class {self.job!r} ({self.n_rows} fast-path grid rows, {self.n_large_rows} of "
            f"them >= 1 GiB; widest: {self.worst}): reserved <= allocated x {self.ratio:.4f} + "
            f"{format_bytes(self.fixed_bytes)}"
        )


#: The grid jobs whose band is the inference fit (:data:`INFER_RESERVED`): bf16 inference and
#: fp16 inference (a T4 / V100's ``16-true``; helper "fp16infer": its grid rows, recorded by
#: ``benchmarks/infer_reserved.py --grid``, are judged by the fit as it is, not fitted to).
INFER_FIT_JOBS = ("infer", "infer_fp16")


def class_band(job: str | None) -> ClassBand | None:
    """The reserved band of the grid job ``job`` (``memfit.estimate.fastpath.grid_job``); None
    where the grid has no band for it (the wide :data:`RESERVED_RATIO` band applies)."""
    if job in INFER_FIT_JOBS:  # its own fit (INFER_RESERVED), not the grid's short decodes
        held_ratio, ratio = INFER_RESERVED["top"][:2]
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
    *,
    training: bool,
    end: str = "mid",
    job: str | None = None,
    held_bytes: int | None = None,
    infer: InferParts | None = None,
    stranded_bytes: int = 0,
) -> ReservedRule:
    """The rule the analytic engine hands the pipeline (``pipeline.assemble`` applies it).
    ``job``: the grid job class whose band ``end="band"`` takes (None: the wide band).
    ``infer``: an inference job's parts (:class:`InferParts`), or ``held_bytes``: only its
    parameters' bytes at its peak (the rest of the peak then counts as activations); None:
    not known. Its answer shown (``mid``) and its own band take them (:data:`INFER_RESERVED`).
    ``stranded_bytes``: a training step's segments reserved beyond the ratio, at every point
    of the range (FSDP2's root buffers, ``distributed.fsdp_stranded_bytes``; a job class's
    band is fitted to the rows less them, ``benchmarks/reserved_bands.py``)."""
    if infer is not None:
        held_bytes = infer.held_bytes
    mid, low, high = RESERVED_RATIO["train" if training else "infer"]
    if end not in RESERVED_ENDS:
        raise ValueError(f"end ({end!r}) must be one of {', '.join(RESERVED_ENDS)}")
    band = class_band(job) if end == "band" else None
    held_rule = not training and held_bytes is not None
    if held_rule and (end == "mid" or (band is not None and band.held_ratio is not None)):
        return infer_rule(infer or int(held_bytes or 0), band=end == "band")
    if band is not None and band.held_ratio is not None:  # no parameters' share: the wide band
        band = None
        end = "high"
    extra = stranded_bytes if training else 0
    if band is not None:
        fixed = (band.fixed_bytes + extra, band.fixed_bytes + extra)
        return ReservedRule(ratio=(band.ratio, band.low_ratio, band.ratio), fixed_bytes=fixed)
    if not training:  # the allocator's smallest segments: a floor, and granularity at the top
        at_point = 0 if end == "mid" else MIN_SEGMENTS_BYTES
        return ReservedRule(
            ratio=(mid if end == "mid" else high, low, high),
            fixed_bytes=(at_point, MIN_SEGMENTS_BYTES),
            floor_bytes=MIN_SEGMENTS_BYTES,
        )
    return ReservedRule(
        ratio=(mid if end == "mid" else high, low, high), fixed_bytes=(extra, extra)
    )


def infer_rule(parts: InferParts | int, *, band: bool) -> ReservedRule:
    """An inference job's rule (:data:`INFER_RESERVED`) for its ``parts`` (or only its
    parameters' bytes: the rest of the peak all activations, no KV cache apart): the answer
    shown (``band=False``: the ``shown`` fit, its range's top the ``top`` fit) or the band's top
    (``band=True``). The pipeline's rule scales the rest of the peak by the fit's ``ratio``;
    what the parameters' and the cache's own ratios make of the parts at their peak rides in
    ``fixed_bytes`` (:func:`infer_bytes` at the peak, exactly)."""
    shown, top = INFER_RESERVED["shown"], INFER_RESERVED["top"]
    held = parts if isinstance(parts, int) else parts.held_bytes

    def fixed(fit: InferFit) -> int:
        if isinstance(parts, int):
            return MIN_SEGMENTS_BYTES + int(held * (fit.held_ratio - 1))
        peak = parts.peak_bytes
        at = min(held, peak)
        replayed_ratio = REPLAYED_RATIO["top" if fit is top else "shown"]
        return infer_bytes(parts, fit, replayed_ratio) - at - int((peak - at) * fit.ratio)

    at_top = fixed(top)
    return ReservedRule(
        ratio=(top.ratio if band else shown.ratio, 1.0, top.ratio),
        fixed_bytes=(at_top if band else fixed(shown), at_top),
        floor_bytes=MIN_SEGMENTS_BYTES,
        held_bytes=held,
    )


def describe_infer(fit: InferFit) -> str:
    """The rule of ``fit`` in words (an estimate's note, the band's description)."""
    return (
        f"the larger of the prefill's (parameters x {fit.held_ratio:.3f} + its KV cache x "
        f"{fit.kv_ratio:.3f} + the rest of its peak x {fit.ratio:.3f}) and the decode's "
        f"(parameters x {fit.held_ratio:.3f} + the prompt's cache x {fit.prompt_kv_ratio:.3f} + "
        f"the grown cache x {fit.grown_kv_ratio:.3f} + the rest x {fit.ratio:.3f}), "
        f"+ {format_bytes(MIN_SEGMENTS_BYTES)}"
    )


def reserved_bytes(peak_allocated_bytes: int, *, training: bool) -> Reserved:
    rule = reserved_rule(training=training)
    n_bytes, rng = rule.at(peak_allocated_bytes)
    assert rule.ratio is not None and rng is not None  # a ratio rule always has a range
    return Reserved(bytes=n_bytes, ratio=rule.ratio[0], range=rng)
