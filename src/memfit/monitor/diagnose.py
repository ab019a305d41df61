"""Leak or cache? Read a run log's steps and say which, with the numbers.

- **leak**: allocated bytes at the end of each step grow linearly at steady state (a least-squares
  line over the steps after warm-up: slope in bytes/step, R², growth over the window). Typical
  cause: keeping tensors that hold the graph (``losses.append(loss)`` instead of ``loss.item()``).
- **fragmentation**: allocated is flat but reserved keeps growing (the allocator cannot reuse its
  free blocks for new request sizes).
- **cache**: allocated is flat and reserved has plateaued above it. PyTorch's caching allocator
  keeps freed blocks for reuse; ``nvidia-smi`` shows them as used. Not a leak.
- **stable**: allocated and reserved are flat and close.

Also reported: device-level memory above reserved (the CUDA context, NCCL buffers, other
processes on the GPU), which no allocator counter shows.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.monitor.log import RunData, read_log
from memfit.units import format_bytes

#: Thresholds of the verdicts (rules of thumb, chosen here; each is stated in the finding text).
#: Steps skipped as warm-up: the first steps create optimizer states, cuBLAS workspaces and
#: lazily-grown caches, so growth there is expected.
WARMUP_MIN_STEPS = 2
WARMUP_FRACTION = 0.1
#: Fewer steady steps than this cannot separate a trend from noise.
MIN_STEADY_STEPS = 5
#: A leak: the line explains most of the variation and the growth is not rounding noise.
LEAK_MIN_R2 = 0.8
LEAK_MIN_GROWTH_BYTES = 4096
LEAK_MIN_GROWTH_FRACTION = 0.01
#: Cache worth naming: reserved above allocated by this share of reserved at the last step.
CACHE_MIN_FRACTION = 0.05
#: The step-record keys the verdicts are computed from.
_TREND_KEYS = ("allocated_bytes", "reserved_bytes", "peak_reserved_bytes")


@dataclass(frozen=True, kw_only=True)
class Trend:
    """A least-squares line through one metric over the steady steps."""

    slope_bytes_per_step: float
    r2: float | None  # None when the metric is constant (nothing to explain)
    start_bytes: int
    end_bytes: int

    @property
    def growth_bytes(self) -> int:
        return self.end_bytes - self.start_bytes


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    verdict: str  # "leak" | "fragmentation" | "cache" | "stable" | "too_few_steps"
    summary: str
    n_steps: int
    steady_from_step: int | None
    allocated: Trend | None
    reserved: Trend | None
    cache_bytes: int | None
    device_used_bytes: int | None
    outside_allocator_bytes: int | None
    findings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("allocated", "reserved"):
            trend = getattr(self, name)
            if trend is not None:
                out[name]["growth_bytes"] = trend.growth_bytes
        return out


def fit_line(ys: list[int]) -> Trend:
    """Least squares of ``ys`` against 0, 1, 2, ...; R² = 1 - SS_res / SS_tot."""
    n = len(ys)
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(ys))
    slope = sxy / sxx if sxx else 0.0
    ss_tot = sum((y - mean_y) ** 2 for y in ys)
    ss_res = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in enumerate(ys))
    r2 = None if ss_tot == 0 else 1 - ss_res / ss_tot
    return Trend(slope_bytes_per_step=slope, r2=r2, start_bytes=ys[0], end_bytes=ys[-1])


def _is_growing(t: Trend) -> bool:
    floor = max(LEAK_MIN_GROWTH_BYTES, LEAK_MIN_GROWTH_FRACTION * t.start_bytes)
    return t.slope_bytes_per_step > 0 and (t.r2 or 0) >= LEAK_MIN_R2 and t.growth_bytes >= floor


def _device_used(run: RunData) -> int | None:
    """Peak of the process's own device use, else the device-level use (over every record)."""
    for key in ("process_used_bytes", "device_used_bytes"):
        values = [v for v in (run.peak(key, "step"), run.peak(key, "sample")) if v is not None]
        if values:
            return max(values)
    return None


#: Worst first: the verdict a merged multi-rank diagnosis leads with.
SEVERITY = ("leak", "fragmentation", "cache", "stable", "too_few_steps")


def diagnose_ranks(runs: list[RunData]) -> list[tuple[RunData, Diagnosis]]:
    """One diagnosis per rank log, worst verdict first (ties in file order)."""
    found = [(run, diagnose(run)) for run in runs]
    return sorted(found, key=lambda pair: SEVERITY.index(pair[1].verdict))


def diagnose(log_path: str | os.PathLike[str] | RunData) -> Diagnosis:
    """Leak, fragmentation, cache or stable, from a run log written by ``memfit.Monitor`` (its
    path, or the log already read by :func:`memfit.monitor.read_log`)."""
    run = log_path if isinstance(log_path, RunData) else read_log(log_path)
    # steps whose allocator counters are unknown (null) say nothing about a trend
    steps = [r for r in run.steps if all(r[key] is not None for key in _TREND_KEYS)]
    used = _device_used(run)
    # a long log keeps evenly spaced steps (reader.py): the count said is the file's
    n_steps = run.n_steps if len(run.steps) < run.n_steps else len(steps)
    warmup = max(WARMUP_MIN_STEPS, int(len(steps) * WARMUP_FRACTION))
    steady = steps[warmup:]
    if len(steady) < MIN_STEADY_STEPS:
        why = f"{len(steps)} steps logged; need {warmup + MIN_STEADY_STEPS} ({warmup} of warm-up)"
        if not steps:
            why += ": a `memfit monitor -- CMD` log has device samples only; put memfit.Monitor in "
            why += "the script for per-step allocator numbers"
        return Diagnosis(
            verdict="too_few_steps",
            summary=why,
            n_steps=n_steps,
            steady_from_step=None,
            allocated=None,
            reserved=None,
            cache_bytes=None,
            device_used_bytes=used,
            outside_allocator_bytes=None,
        )
    alloc = fit_line([r["allocated_bytes"] for r in steady])
    res = fit_line([r["reserved_bytes"] for r in steady])
    cache = steady[-1]["reserved_bytes"] - steady[-1]["allocated_bytes"]
    peak_reserved = max(r["peak_reserved_bytes"] for r in steps)
    outside = None if used is None else used - peak_reserved
    verdict, summary = _verdict(alloc, res, cache, len(steady), steady[0]["step"])
    findings = [summary]
    if outside is not None and outside > 0:
        findings.append(
            f"the device shows {format_bytes(outside)} more than the allocator's peak reserved "
            f"({format_bytes(used)} vs {format_bytes(peak_reserved)}): the CUDA context, NCCL "
            "buffers, libraries allocating outside PyTorch, or other processes on the GPU"
        )
    return Diagnosis(
        verdict=verdict,
        summary=summary,
        n_steps=n_steps,
        steady_from_step=steady[0]["step"],
        allocated=alloc,
        reserved=res,
        cache_bytes=cache,
        device_used_bytes=used,
        outside_allocator_bytes=outside,
        findings=findings,
    )


def _verdict(alloc: Trend, res: Trend, cache: int, n: int, first: int) -> tuple[str, str]:
    window = f"over {n} steps from step {first}"
    flat = (
        f"allocated is flat at {format_bytes(alloc.end_bytes)} "
        f"({alloc.slope_bytes_per_step:+.0f} B/step {window})"
    )
    r2 = "n/a" if alloc.r2 is None else f"{alloc.r2:.3f}"
    if _is_growing(alloc):
        return "leak", (
            f"leak: allocated grows {format_bytes(alloc.slope_bytes_per_step)}/step {window} "
            f"(R² {r2}, {format_bytes(alloc.start_bytes)} → {format_bytes(alloc.end_bytes)}): "
            "something keeps tensors alive from step to step, often a loss or output kept with "
            "its graph (store loss.item() or loss.detach())"
        )
    if _is_growing(res):
        return "fragmentation", (
            f"fragmentation: {flat}, but reserved grows "
            f"{format_bytes(res.slope_bytes_per_step)}/step to {format_bytes(res.end_bytes)}: "
            "the allocator cannot reuse its free blocks; try "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        )
    if res.end_bytes and cache >= CACHE_MIN_FRACTION * res.end_bytes:
        return "cache", (
            f"not a leak: {flat} and reserved has plateaued at {format_bytes(res.end_bytes)}; "
            f"the caching allocator keeps {format_bytes(cache)} of freed blocks for reuse "
            "(nvidia-smi counts them as used)"
        )
    return "stable", f"stable: {flat}; reserved {format_bytes(res.end_bytes)}"
