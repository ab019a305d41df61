"""``fit`` for diffusion inference: the most images per prompt, or the largest square picture, of
one pipeline call that fits a budget.

The device bytes of a call grow with the batch (every latent, activation and decoded image has
it) and with the picture's side (the tokens of the denoiser and the pixels of the decode), and
the weights do not depend on either; so the answer is found by doubling the value until a call
does not fit, then bisecting between the last that fits and the first that does not. Every value
reported was estimated and judged by THE verdict rule (``judged`` of
:mod:`memfit.plan.diffusion_infer`: ``fits``, not ``tight``), and the next one up was estimated
and does not fit (or is the search's top).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from memfit.errors import SpecError
from memfit.plan.diffusion_code import job_flags
from memfit.plan.diffusion_infer import judged
from memfit.spec.diffusion import DiffusionJob

#: (step, top) of each solve: images per prompt; the side of a square picture in pixels (a
#: multiple of 64: the VAE's 8x, the 2x2 packing, and the sizes the pipelines are used at)
SOLVES = {"batch": (1, 256), "resolution": (64, 4096)}


@dataclass(frozen=True, kw_only=True)
class PipelineFit:
    solve: str
    #: the largest value that fits (None: not even the smallest)
    value: int | None
    #: the call at the value (or at the smallest, when nothing fits), judged on the budget
    estimate: Any
    budget: Any
    #: every (value, need_bytes, fits) estimated, in order
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
            "need_bytes": self.estimate.fits.need_bytes,
            "flags": job_flags(self.estimate.job),
            "probes": [{"value": v, "need_bytes": n, "fits": f} for v, n, f in self.probes],
            "estimate": self.estimate.to_json(),
        }


def _at(job: DiffusionJob, solve: str, value: int) -> DiffusionJob:
    if solve == "batch":
        return replace(job, batch=value)
    return replace(job, height=value, width=value)


def fit_pipeline(
    estimate: Callable[[DiffusionJob], Any], job: DiffusionJob, *, solve: str, budget: Any,
    arch: str | None,
) -> PipelineFit:  # fmt: skip
    """The largest ``solve`` (batch or resolution) of ``job`` that fits ``budget``."""
    if solve not in SOLVES:
        raise SpecError(
            f"--solve {solve} for a diffusion pipeline call: use batch (num_images_per_prompt) "
            "or resolution (a square height = width)"
        )
    step, top = SOLVES[solve]
    probes: list[tuple[int, int, bool]] = []
    seen: dict[int, Any] = {}

    def fits(value: int) -> bool:
        if value not in seen:
            est, v = judged(estimate(_at(job, solve, value)), budget, arch)
            seen[value] = est
            probes.append((value, v.need_bytes, v.fits))
        return bool(seen[value].fits.fits)

    if not fits(step):
        return PipelineFit(solve=solve, value=None, estimate=seen[step], budget=budget,
                           probes=tuple(probes))  # fmt: skip
    lo, hi = step, 2 * step  # lo fits; find an hi that does not
    while hi <= top and fits(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi, top + step)
    while hi - lo > step:  # lo fits, hi does not (or is past the top)
        mid = (lo + hi) // 2 // step * step
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return PipelineFit(solve=solve, value=lo, estimate=seen[lo], budget=budget,
                       probes=tuple(probes))  # fmt: skip
