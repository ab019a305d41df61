"""``fit`` and ``plan`` for diffusion training (the diffusers example scripts' runs).

* :func:`fit_training` solves ``--solve batch`` (largest ``--train_batch_size``) or ``--solve
  resolution`` (largest ``--resolution``, a multiple of :data:`RESOLUTION_STEP`) on a GPU's
  budget. Allocated bytes are affine in the batch (every activation has the batch dimension;
  weights, gradients and optimizer states do not) and close to affine in the pixel count, so two
  traces give a guess and traces around the guess confirm it: the answer is always a traced job
  that fits, with the next one up traced and not fitting.
* :func:`plan_training` tries the scripts' memory switches from the cheapest in step time to the
  most expensive (gradient checkpointing recomputes the forward; 8-bit Adam and caching latents
  cost little) and returns every combination that fits, in that order.

A job "fits" when THE verdict rule (:func:`memfit.estimate.verdict.judge`, through
:mod:`memfit.estimate.diffusion.device`) says ``fits`` on the budget: need = max(allocated peak +
CUDA context and cuBLAS workspaces, reserved peak + what lives outside the caching allocator) <=
capacity - headroom. A need above the limit but within the capacity is ``tight``: not a fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.diffusion.device import device_bytes
from memfit.estimate.verdict import Verdict, judge_point

RESOLUTION_STEP = 64
MAX_RESOLUTION = 4096
MAX_BATCH = 1024
#: the most confirming traces around the affine guess before giving up on the guess
MAX_CONFIRM = 8


@dataclass(frozen=True, kw_only=True)
class TrainVerdict:
    """THE verdict (``judgement``) of one traced job on the budget, with the figures the fit and
    plan outputs print."""

    need_bytes: int
    overhead_bytes: int
    limit_bytes: int
    judgement: Verdict

    @property
    def fits(self) -> bool:
        return self.judgement.fits


def verdict(est: Any, budget: Any, arch: str | None) -> TrainVerdict:
    """THE verdict rule of ``est`` (a TrainEstimate) on ``budget`` (its capacity and headroom)."""

    need = device_bytes(est.peak_bytes, est.peak_reserved_bytes, arch, training=True)
    v = judge_point(need, budget.capacity_bytes, budget.headroom_bytes)
    return TrainVerdict(
        need_bytes=need,
        overhead_bytes=need - est.peak_bytes,
        limit_bytes=budget.limit_bytes,
        judgement=v,
    )


def _judged(est: Any, ver: TrainVerdict, budget: Any, arch: str | None) -> Any:
    """``est`` carrying the budget's verdict (what its JSON prints under ``fits``)."""
    return replace(est, gpu=budget.gpu_name, arch=arch, fits=ver.judgement)


@dataclass(frozen=True, kw_only=True)
class TrainFit:
    solve: str
    value: int | None
    #: the traced job at the answer (None when even the smallest does not fit)
    estimate: Any
    verdict: TrainVerdict | None
    budget: Any
    #: every (value, need_bytes, fits) traced, in order
    probes: tuple[tuple[int, int, bool], ...]

    @property
    def fits(self) -> bool:
        return self.value is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "solve": self.solve,
            "max_value": self.value,
            "fits": self.fits,
            "budget": self.budget.to_json(),
            "need_bytes": self.verdict.need_bytes if self.verdict else None,
            "probes": [{"value": v, "need_bytes": n, "fits": f} for v, n, f in self.probes],
            "estimate": self.estimate.to_json() if self.estimate is not None else None,
        }


def fit_training(
    trace: Callable[[Any], Any], job: Any, *, solve: str, budget: Any, arch: str | None
) -> TrainFit:
    """The largest batch or resolution of ``job`` that fits ``budget``; ``trace(job)`` gives a
    :class:`~memfit.estimate.diffusion.train.TrainEstimate`."""
    if solve not in ("batch", "resolution"):
        raise SpecError(
            f"--solve {solve} for diffusion training: use batch (--train_batch_size) or "
            "resolution (--resolution)"
        )
    field = "batch" if solve == "batch" else "resolution"
    step, top = (1, MAX_BATCH) if solve == "batch" else (RESOLUTION_STEP, MAX_RESOLUTION)
    probes: list[tuple[int, int, bool]] = []
    seen: dict[int, tuple[Any, TrainVerdict]] = {}

    def probe(v: int) -> tuple[Any, TrainVerdict]:
        if v not in seen:
            est = trace(replace(job, **{field: v}))
            ver = verdict(est, budget, arch)
            seen[v] = (_judged(est, ver, budget, arch), ver)
            probes.append((v, ver.need_bytes, ver.fits))
        return seen[v]

    lo, hi = step, 2 * step
    e_lo, v_lo = probe(lo)
    if not v_lo.fits:
        return TrainFit(solve=solve, value=None, estimate=e_lo, verdict=v_lo, budget=budget,
                        probes=tuple(probes))  # fmt: skip
    _, v_hi = probe(hi)
    guess = _affine_guess(lo, v_lo.need_bytes, hi, v_hi.need_bytes, budget.limit_bytes, solve)
    guess = max(step, min(top, guess // step * step))
    best = lo
    for _ in range(MAX_CONFIRM):
        _, ver = probe(guess)
        if ver.fits:
            best = max(best, guess)
            if guess >= top or not probe(guess + step)[1].fits:
                break
            guess += step
        else:
            guess -= step
            if guess <= best:
                break
    est, ver = seen[best]
    return TrainFit(solve=solve, value=best, estimate=est, verdict=ver, budget=budget,
                    probes=tuple(probes))  # fmt: skip


def _affine_guess(x1: int, y1: int, x2: int, y2: int, limit: int, solve: str) -> int:
    """Where the line through two traces meets the limit: in the batch, or in the pixel count
    (resolution squared) for the resolution."""
    if solve == "resolution":
        a1, a2 = x1 * x1, x2 * x2
    else:
        a1, a2 = x1, x2
    slope = (y2 - y1) / (a2 - a1)
    if slope <= 0:
        return MAX_BATCH if solve == "batch" else MAX_RESOLUTION
    at = a1 + (limit - y1) / slope
    return int(at**0.5) if solve == "resolution" else int(at)


#: The scripts' memory switches, cheapest first in step time (none of them changes the result
#: of training except LoRA vs full fine-tuning, which the user chooses): 8-bit Adam, cached
#: latents (FLUX LoRA), gradient checkpointing (recomputes each block's forward).
SWITCHES = ("optimizer", "cache_latents", "checkpointing")


def plan_candidates(job: Any, *, pipeline: str) -> list[Any]:
    """Every combination of the switches the script offers, cheapest first."""
    from itertools import product

    out = []
    cache_ok = pipeline == "FluxPipeline" and job.lora_rank is not None
    for ckpt, cache, opt in product((False, True), (False, True), ("adamw", "adamw-8bit")):
        if cache and not cache_ok:
            continue
        out.append(replace(job, checkpointing=ckpt, cache_latents=cache, optimizer=opt))
    return out


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    budget: Any
    #: (job, estimate, verdict) of every combination traced, cheapest first
    tried: tuple[tuple[Any, Any, TrainVerdict], ...]

    @property
    def fitting(self) -> list[tuple[Any, Any, TrainVerdict]]:
        return [t for t in self.tried if t[2].fits]

    @property
    def fits(self) -> bool:
        return bool(self.fitting)

    def to_json(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "budget": self.budget.to_json(),
            "plans": [
                {
                    "flags": job.flags(),
                    "fits": ver.fits,
                    "need_bytes": ver.need_bytes,
                    "peak_allocated_bytes": est.peak_bytes,
                    "peak_reserved_bytes": est.peak_reserved_bytes,
                    "peak_phase": est.peak.phase,
                }
                for job, est, ver in self.tried
            ],
        }


def plan_training(
    trace: Callable[[Any], Any], job: Any, *, pipeline: str, budget: Any, arch: str | None,
    n_plans: int = 3,
) -> TrainPlan:  # fmt: skip
    """Trace the combinations cheapest first, stopping after ``n_plans`` that fit."""
    tried = []
    n_fit = 0
    for cand in plan_candidates(job, pipeline=pipeline):
        est = trace(cand)
        ver = verdict(est, budget, arch)
        tried.append((cand, _judged(est, ver, budget, arch), ver))
        n_fit += ver.fits
        if n_fit >= n_plans:
            break
    return TrainPlan(budget=budget, tried=tuple(tried))
