"""``plan`` for diffusion inference: the diffusers memory switches that make a pipeline call fit.

:func:`plan_pipeline` starts from the call as asked and adds what a diffusers user would try,
in that order (diffusers docs, optimization/memory.md and quantization/):

1. **memory-only** (the same picture): ``vae.enable_tiling()`` / ``vae.enable_slicing()`` when
   the decode is the peak, ``enable_attention_slicing()`` when the denoiser is, then the
   offload modes ``enable_model_cpu_offload``, ``enable_group_offload`` (block_level, then
   leaf_level with a CUDA stream) and ``enable_sequential_cpu_offload``;
2. **changes the result** (other weights or another picture): the denoiser's weights in fp8
   storage (``enable_layerwise_casting``), torchao fp8 / int8 weight-only, bitsandbytes int8 or
   nf4 (with the T5 in the same format where the pipeline has one), SD3 without its T5
   (``text_encoder_3=None``); each with the offload ladder of (1);
3. only when nothing above fits: fewer images per prompt, then a smaller picture (a different
   job; each new shape is a new trace, seconds each).

For each set of weights the ladder stops at its first rung that fits, so every plan listed is
the least offload that makes those weights fit. A job fits when THE verdict rule says ``fits``
(:func:`memfit.estimate.verdict.judge_point` on the pipeline's device bytes, as
``memfit estimate --gpu`` judges it); ``tight`` is not a fit.

**Rank** (:func:`rank_key`): fitting plans first; then those that keep every setting the user
changed from diffusers' defaults; then memory-only before result-changing; then a shape change
last; then the slowdown rank: the product of the published slowdowns of its offload mode
(:data:`OFFLOAD_SLOWDOWN`) and of its denoiser format (:data:`FORMAT_SLOWDOWN`). Those are times
of one published benchmark each, not a time on the user's card: the output says "slowdown rank".
Switches without a published timing count 1. Each plan's diffusers code and flags:
:mod:`memfit.plan.diffusion_code`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

from memfit.estimate.verdict import Verdict, judge_point
from memfit.plan.diffusion_code import MEMORY_ONLY, Change, code_lines, describe, job_flags
from memfit.spec.diffusion import DiffusionJob

#: Seconds of one FLUX pipeline call by offload mode, as published in diffusers PR #11682
#: (https://github.com/huggingface/diffusers/pull/11682, description, 2025-06-09: base 6.594 s,
#: model CPU offload 21.682 s, sequential CPU offload 68.406 s, group offload 47.693 s), divided
#: by the base. One figure for group offloading, whatever its offload_type.
OFFLOAD_SLOWDOWN = {
    "none": 1.0,
    "model": 21.682 / 6.594,
    "group": 47.693 / 6.594,
    "sequential": 68.406 / 6.594,
}
#: Seconds of one FLUX.1-dev call (1024x1024, 50 steps, 1x H100, transformer and T5 in the format)
#: by weight format over BF16's 12 s, from "Exploring Quantization Backends in Diffusers"
#: (huggingface/blog diffusers-quantization.md, commit 0b53cb19406564a21da2bff693a71a08e73538ee):
#: BnB 4-bit 12 s, BnB 8-bit 27 s, torchao int8_weight_only 15 s, float8_weight_only 15 s, FP8
#: layerwise casting 13 s. The other formats have no published figure here: 1.
FORMAT_SLOWDOWN = {
    "none": 1.0,
    "nf4": 12 / 12,
    "int8": 27 / 12,
    "torchao-int8wo": 15 / 12,
    "torchao-fp8wo": 15 / 12,
    "layerwise-fp8": 13 / 12,
}
#: The denoiser's weights a plan tries, as (quant, text_encoder_quant, layerwise_casting), least
#: memory saved first; the T5 variant only where the largest text encoder is a T5.
WEIGHTS: tuple[tuple[str, str, str | None], ...] = (
    ("none", "none", "fp8"),
    ("torchao-fp8wo", "none", None),
    ("torchao-int8wo", "none", None),
    ("int8", "none", None),
    ("int8", "int8", None),
    ("nf4", "none", None),
    ("nf4", "nf4", None),
)
#: Resolutions tried (each side scaled, a multiple of 64) when nothing else fits.
SHAPE_SCALES = (0.75, 0.5)


@dataclass(frozen=True, kw_only=True)
class PipelinePlan:
    """One pipeline call, its estimate and THE verdict on the budget."""

    job: DiffusionJob
    estimate: Any
    verdict: Verdict
    changes: tuple[Change, ...]
    #: a setting the user changed from diffusers' default that this plan changes again
    overrides_user: bool
    slowdown: float

    @property
    def fits(self) -> bool:
        return self.verdict.fits

    @property
    def code(self) -> list[str]:
        """The plan as diffusers code (:func:`memfit.plan.diffusion_code.code_lines`)."""
        return code_lines(self.changes, self.estimate.pipeline)

    @property
    def job_flags(self) -> str:
        """The plan as ``memfit estimate PIPELINE`` flags."""
        return job_flags(self.job)

    @property
    def memory_only(self) -> bool:
        return all(c.kind == MEMORY_ONLY for c in self.changes)

    @property
    def changes_shape(self) -> bool:
        return any(c.what.startswith(("num_images_per_prompt", "height")) for c in self.changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "verdict": self.verdict.verdict,
            "need_bytes": self.verdict.need_bytes,
            "memory_only": self.memory_only,
            "changes": [c.to_json() for c in self.changes],
            "code": self.code,
            "slowdown_rank": round(self.slowdown, 2),
            "flags": job_flags(self.job),
            "peak_stage": self.estimate.peak_stage,
            "host_weights_bytes": self.estimate.host_weights_bytes,
        }


@dataclass(frozen=True, kw_only=True)
class PipelinePlans:
    """The call as asked and every plan tried, best first (:func:`rank_key`)."""

    asked: PipelinePlan
    plans: tuple[PipelinePlan, ...]
    budget: Any
    pipeline: str

    @property
    def fitting(self) -> list[PipelinePlan]:
        return [p for p in self.plans if p.fits]

    @property
    def fits(self) -> bool:
        return bool(self.fitting)

    @property
    def best(self) -> PipelinePlan | None:
        return self.fitting[0] if self.fitting else None

    def to_json(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "pipeline": self.pipeline,
            "budget": self.budget.to_json(),
            "asked": self.asked.to_json(),
            "plans": [p.to_json() for p in self.fitting],
            "tried": len(self.plans),
            "rank": "fitting, keeps the user's settings, memory-only, same shape, then the "
            "slowdown rank (published timings of the offload mode x the weight format; a rank, "
            "not a time on this GPU)",
        }


def judged(est: Any, budget: Any, arch: str | None) -> tuple[Any, Verdict]:
    """``est`` judged by THE verdict rule on ``budget`` (as ``PipelineEstimate.judge_on``)."""
    on = replace(est, gpu=budget.gpu_name, arch=arch)
    v = judge_point(on.device_used_bytes, budget.capacity_bytes, budget.headroom_bytes)
    return replace(on, fits=v), v


def rank_key(p: PipelinePlan) -> tuple[Any, ...]:
    return (not p.fits, p.overrides_user, not p.memory_only, p.changes_shape, p.slowdown,
            len(p.changes), p.verdict.need_bytes)  # fmt: skip


def plan_pipeline(
    estimate: Callable[[DiffusionJob], Any], job: DiffusionJob, *, budget: Any,
    arch: str | None, n_plans: int = 8,
) -> PipelinePlans:  # fmt: skip
    """The plans that make ``job`` fit ``budget``; ``estimate(job)`` gives a PipelineEstimate
    (one trace per shape; other settings re-compose the same traces)."""
    seen: dict[DiffusionJob, PipelinePlan] = {}

    def probe(cand: DiffusionJob) -> PipelinePlan:
        if cand not in seen:
            est, v = judged(estimate(cand), budget, arch)
            seen[cand] = PipelinePlan(
                job=cand, estimate=est, verdict=v, changes=describe(cand, job, est),
                overrides_user=overrides(cand, job), slowdown=slowdown(cand),
            )  # fmt: skip
        return seen[cand]

    asked = probe(job)
    info = _Pipeline.of(asked.estimate)
    if not asked.fits:
        _search(probe, job, info, budget.limit_bytes)
    plans = _minimal(sorted(seen.values(), key=rank_key))
    fitting = [p for p in plans if p.fits][:n_plans]
    rest = [p for p in plans if not p.fits]
    return PipelinePlans(asked=asked, plans=(*fitting, *rest), budget=budget,
                         pipeline=asked.estimate.pipeline)  # fmt: skip


def _search(probe: Callable[[DiffusionJob], PipelinePlan], job: DiffusionJob, info: _Pipeline,
            limit_bytes: int) -> None:  # fmt: skip
    """The ladders of the module docstring: memory-only first; then each weight format, on the
    rungs faster than the best memory-only plan (a slower one that changes the picture is never
    the better choice); then the shapes, only when nothing fits."""
    unet = info.denoiser == "unet"
    best = _ladder(probe, job, limit_bytes, unet=unet)
    cap = best.slowdown if best is not None else float("inf")
    fitted: set[str] = set()
    for weights in _weight_options(job, info):
        if weights.text_encoder_quant != job.text_encoder_quant and weights.quant in fitted:
            continue  # the denoiser's format alone already fits: T5 in it too is no better
        found = _ladder(probe, weights, limit_bytes, unet=unet, cap=cap)
        if found is not None:
            fitted.add(weights.quant)
            best = best or found
    if best is None:
        for shaped in _shapes(job):
            if _ladder(probe, shaped, limit_bytes, unet=unet) is not None:
                break


def _changed(p: PipelinePlan, asked: DiffusionJob) -> frozenset[tuple[str, Any]]:
    return frozenset(
        (f.name, getattr(p.job, f.name)) for f in fields(DiffusionJob)
        if getattr(p.job, f.name) != getattr(asked, f.name)
    )  # fmt: skip


def _minimal(plans: list[PipelinePlan]) -> list[PipelinePlan]:
    """Without the fitting plans that add a change to another fitting plan (dominated: the same
    fit with more changed)."""
    if not plans:
        return plans
    asked = (
        next(p.job for p in plans if not p.changes)
        if any(not p.changes for p in plans)
        else plans[0].job
    )
    fit_sets = [_changed(p, asked) for p in plans if p.fits]
    return [
        p for p in plans
        if not p.fits or not any(s < _changed(p, asked) for s in fit_sets)
    ]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _Pipeline:
    denoiser: str
    #: the largest text encoder is a T5 (text_encoder_quant is worth trying)
    t5: bool
    #: SD3: a text_encoder_3 the pipeline can be built without
    has_te3: bool

    @classmethod
    def of(cls, est: Any) -> _Pipeline:
        comps = {c.name: c for c in est.components}
        denoiser = "transformer" if "transformer" in comps else "unet"
        encoders = [c for c in est.components if c.name.startswith("text_encoder")]
        largest = max(encoders, key=lambda c: c.weights_bytes, default=None)
        return cls(
            denoiser=denoiser,
            t5=largest is not None and "T5" in largest.class_name,
            has_te3="text_encoder_3" in comps,
        )


def _ladder(probe: Callable[[DiffusionJob], PipelinePlan], start: DiffusionJob,
            limit_bytes: int, *, unet: bool, cap: float = float("inf")
            ) -> PipelinePlan | None:  # fmt: skip
    """The memory-only rungs on ``start``, least slowdown first (those under ``cap``): its
    first that fits. VAE tiling / attention slicing are tried on a rung whose peak is the
    decode / the denoiser, unless another stage alone is already over the limit; attention
    slicing only on a UNet (``set_attention_slice``; the transformers here have none, and
    each try re-traces the denoiser)."""
    for cand in _rungs(start):
        if slowdown(cand) >= cap:
            return None
        p = probe(cand)
        if p.fits:
            return p
        stage = p.estimate.peak_stage
        if stage == "vae_decode" and not cand.vae_tiling and _may_fit(p, stage, limit_bytes):
            p = probe(_decode(cand))
        elif (
            stage == "denoise"
            and unet
            and not cand.attention_slicing
            and _may_fit(p, stage, limit_bytes)
        ):
            p = probe(replace(cand, attention_slicing=True))
        if p.fits:
            return p
    return None


def _may_fit(p: PipelinePlan, stage: str, limit_bytes: int) -> bool:
    """Whether a switch that lowers only ``stage`` can make ``p`` fit: the other stages'
    allocated peak plus what lives outside the allocator (a lower bound of the need) is within
    the limit."""
    est = p.estimate
    others = max((s.peak_bytes for s in est.stages if s.stage != stage), default=0)
    return others + est.overhead_bytes <= limit_bytes


def _decode(job: DiffusionJob) -> DiffusionJob:
    """VAE tiling, and slicing when the call makes several images."""
    return replace(job, vae_tiling=True, vae_slicing=job.vae_slicing or job.batch > 1)


def _rungs(job: DiffusionJob) -> Iterator[DiffusionJob]:
    """The job at its own offload, then each offload mode that offloads more, least slowdown
    first (a mode the user chose is kept as the first rung)."""
    yield job
    if job.offload in ("none",):
        yield replace(job, offload="model")
    if job.offload in ("none", "model"):
        yield replace(job, offload="group", offload_type="block_level", num_blocks_per_group=1,
                      use_stream=False)  # fmt: skip
        yield replace(job, offload="group", offload_type="leaf_level", num_blocks_per_group=1,
                      use_stream=True)  # fmt: skip
    if job.offload != "sequential":
        yield replace(job, offload="sequential")


def _weight_options(job: DiffusionJob, info: _Pipeline) -> Iterator[DiffusionJob]:
    """The job with its own weights, then each format of :data:`WEIGHTS` it did not set, then
    SD3 without its T5. A format the user set is kept."""
    yield job
    user_set = job.quant != "none" or job.layerwise_casting is not None
    for quant, te, layerwise in WEIGHTS:
        if user_set or (te != "none" and (not info.t5 or job.text_encoder_quant != "none")):
            continue
        te = te if te != "none" else job.text_encoder_quant
        yield replace(job, quant=quant, text_encoder_quant=te, layerwise_casting=layerwise)
    if info.has_te3 and not job.drop_text_encoder_3:
        yield replace(job, drop_text_encoder_3=True)


def _shapes(job: DiffusionJob) -> Iterator[DiffusionJob]:
    """Fewer images per prompt (halving to 1), then smaller pictures of the same aspect."""
    b = job.batch
    while b > 1:
        b //= 2
        yield replace(job, batch=b)
    for scale in SHAPE_SCALES:
        h, w = (max(64, int(x * scale) // 64 * 64) for x in (job.height, job.width))
        if (h, w) != (job.height, job.width):
            yield replace(job, batch=1, height=h, width=w)


def slowdown(job: DiffusionJob) -> float:
    """The slowdown rank of :data:`OFFLOAD_SLOWDOWN` x :data:`FORMAT_SLOWDOWN`."""
    fmt = "layerwise-fp8" if job.layerwise_casting else job.quant
    return OFFLOAD_SLOWDOWN[job.offload] * FORMAT_SLOWDOWN.get(fmt, 1.0)


_DEFAULT = DiffusionJob()


def overrides(cand: DiffusionJob, asked: DiffusionJob) -> bool:
    """Whether ``cand`` changes a setting the user changed from the default."""
    return any(
        getattr(asked, f.name) != getattr(_DEFAULT, f.name)
        and getattr(cand, f.name) != getattr(asked, f.name)
        for f in fields(DiffusionJob)
    )
