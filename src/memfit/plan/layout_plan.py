"""The fastest dp x tp x pp x cp (x ep) layout of a training job that fits (issue 30 item 3).

:func:`plan_layout` lists every layout of N GPUs (:func:`memfit.estimate.parallel.layouts.
layout_choices`: degrees, pipeline schedules, FSDP or Megatron's distributed optimizer,
micro-batch, checkpointing), prices each with the step-time model
(:func:`memfit.plan.layout_cost.layout_step_cost`; microseconds each), then estimates the
per-rank memory by the closed form **in order of predicted step time** and judges it by THE
verdict rule (:mod:`memfit.estimate.verdict`) until it holds the fastest fitting layout and
``n_alternatives`` runners-up of other degrees — so a 1,024-GPU search estimates the memory of
the layouts worth running, not of all of them. ``nearest_miss``: the fastest layout that does
not fit — of those faster than the pick when one fits (what a little more memory would buy),
else of all — the one closest to fitting (least device memory).

:func:`recommend_layout_gpus` answers "how many GPUs of which kind": per training GPU of the
catalog (SXM / OAM / superchip parts), the smallest power-of-two count at or above the
model-state floor on which a layout fits, and the one doubling above it, with $ per 1 M tokens
(:func:`memfit.plan.cost.usd_per_million_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit import progress
from memfit.errors import SpecError
from memfit.estimate.parallel.layouts import (
    SCHEDULES,
    SHARDS,
    LayoutChoice,
    LayoutPeak,
    layout_choices,
    layout_peak,
)
from memfit.estimate.parallel.shape import DecoderShape, read_shape
from memfit.hardware.catalog import list_gpus
from memfit.plan.cost import Rates, usd_per_million_tokens
from memfit.plan.layout_cost import LayoutCost, Topology, layout_step_cost

#: Bytes of model state per parameter a layout cannot go below (FSDP2 as torchtitan runs it:
#: fp32 parameters, fp32 gradients, Adam's two fp32 moments), the floor of the GPU count.
STATE_BYTES_PER_PARAM = 16
#: Form factors sold in multi-GPU training nodes (the GPU advice of a layout job).
TRAINING_FORM_FACTORS = ("sxm", "oam", "superchip")
#: Doublings above the smallest fitting count the GPU advice also prices.
EXTRA_DOUBLINGS = 1
#: The most doublings above the floor the GPU advice tries before giving up on a GPU.
MAX_DOUBLINGS = 5


@dataclass(frozen=True, kw_only=True)
class LayoutOption:
    """One layout, its peak GPU and its predicted step time and price."""

    peak: LayoutPeak
    cost: LayoutCost
    usd_per_million_tokens: float | None

    @property
    def fits(self) -> bool:
        return self.peak.verdict == "fits"

    def to_json(self) -> dict[str, Any]:
        return {
            **self.peak.to_json(),
            **self.cost.to_json(),
            "usd_per_million_tokens": self.usd_per_million_tokens,
        }


@dataclass(frozen=True, kw_only=True)
class LayoutPlan:
    """The fastest fitting layout (``best``; None when none fits), runners-up of other degrees,
    and the nearest layout that does not fit."""

    model: str
    gpu: str
    gpus: int
    gpus_per_node: int
    global_batch: int
    seq_len: int
    best: LayoutOption | None
    alternatives: list[LayoutOption]
    nearest_miss: LayoutOption | None
    n_layouts: int
    n_estimated: int
    usd_per_gpu_hour: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.best is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "gpus_per_node": self.gpus_per_node,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "fits": self.fits,
            "best": None if self.best is None else self.best.to_json(),
            "alternatives": [a.to_json() for a in self.alternatives],
            "nearest_miss": None if self.nearest_miss is None else self.nearest_miss.to_json(),
            "n_layouts": self.n_layouts,
            "n_estimated": self.n_estimated,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "notes": list(self.notes),
        }


def _degrees(p: LayoutPeak) -> tuple[int, ...]:
    return (p.dp, p.tp, p.pp, p.cp, p.ep)


def plan_layout(
    source: Any,
    *,
    gpus: int,
    global_batch: int,
    seq_len: int,
    gpu: Any,
    gpus_per_node: int | None = None,
    usd_per_gpu_hour: float | None = None,
    n_alternatives: int = 4,
    schedules: Sequence[str] = SCHEDULES,
    shards: Sequence[str] = SHARDS,
) -> LayoutPlan:
    """The fastest layout of ``gpus`` ``gpu``\\ s that fits (module docstring)."""
    shape = read_shape(source.spec)
    topo = Topology.of(gpu, gpus_per_node)
    rates = Rates.of(gpu)
    choices = list(
        layout_choices(source, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                       shards=shards, schedules=schedules, max_tp=topo.gpus_per_node)
    )  # fmt: skip
    priced = sorted(
        ((layout_step_cost(shape, c, rates, topo), i, c) for i, c in enumerate(choices)),
        key=lambda t: (t[0].step_s, t[1]),
    )
    fits: list[LayoutOption] = []
    misses: list[LayoutOption] = []
    n_est = 0
    for cost, _, choice in priced:
        if len({_degrees(o.peak) for o in fits}) > n_alternatives:
            break
        if n_est % 200 == 0:
            progress.report(f"estimating layouts in order of step time ({n_est} of {len(priced)})")
        n_est += 1
        peak = layout_peak(source, choice, gpu)
        if peak is None:
            continue
        usd = None if usd_per_gpu_hour is None else usd_per_gpu_hour * gpus
        opt = LayoutOption(peak=peak, cost=cost, usd_per_million_tokens=usd_per_million_tokens(
            usd, cost.tokens_per_s))  # fmt: skip
        (fits if opt.fits else misses).append(opt)
    best = fits[0] if fits else None
    return LayoutPlan(
        model=source.name,
        gpu=gpu.name,
        gpus=gpus,
        gpus_per_node=topo.gpus_per_node,
        global_batch=global_batch,
        seq_len=seq_len,
        best=best,
        alternatives=_alternatives(fits, n_alternatives),
        nearest_miss=_nearest_miss(best, misses),
        n_layouts=len(choices),
        n_estimated=n_est,
        usd_per_gpu_hour=usd_per_gpu_hour,
        notes=_notes(shape, topo, gpus, len(choices)),
    )


def _alternatives(fits: list[LayoutOption], n: int) -> list[LayoutOption]:
    """The fastest fitting layout of each other (dp, tp, pp, cp, ep)."""
    seen = {_degrees(fits[0].peak)} if fits else set()
    out: list[LayoutOption] = []
    for o in fits[1:]:
        if _degrees(o.peak) not in seen and len(out) < n:
            seen.add(_degrees(o.peak))
            out.append(o)
    return out


def _nearest_miss(best: LayoutOption | None, misses: list[LayoutOption]) -> LayoutOption | None:
    if not misses:
        return None
    if best is not None:
        misses = [m for m in misses if m.cost.step_s < best.cost.step_s]
    return min(misses, key=lambda m: m.peak.device_used_bytes) if misses else None


def _notes(shape: DecoderShape, topo: Topology, gpus: int, n: int) -> list[str]:
    nodes = math.ceil(gpus / topo.gpus_per_node)
    return [
        f"{n} layouts priced by the step-time model (memfit.plan.layout_cost); their per-rank "
        "memory estimated in order of step time until the fastest fitting ones were found",
        f"{nodes} node(s) of {topo.gpus_per_node} GPUs: {topo.intra_bps / 1e9:.0f} GB/s per GPU "
        f"per direction inside a node, {topo.inter_bps / 1e9:.0f} GB/s between nodes; tensor "
        "parallelism stays inside a node",
        "step time: a roofline calibrated on 48 published multi-GPU runs (median error 7 %, "
        "docs/accuracy.md 'Layout step time') plus bubble and exposed collectives; it ranks "
        "layouts, it is not a measurement of your cluster",
    ]


@dataclass(frozen=True, kw_only=True)
class GPUCount:
    """One GPU kind: the smallest count with a fitting layout, and the cheapest per token of
    the counts tried (None: nothing fit up to the counts tried)."""

    gpu: str
    smallest: LayoutPlan | None
    cheapest: LayoutPlan | None
    tried: list[int]

    def to_json(self) -> dict[str, Any]:
        def one(p: LayoutPlan | None) -> dict[str, Any] | None:
            if p is None or p.best is None:
                return None
            return {"gpus": p.gpus, **p.best.to_json()}

        return {
            "gpu": self.gpu,
            "smallest": one(self.smallest),
            "cheapest": one(self.cheapest),
            "tried": self.tried,
        }


def gpu_floor(shape_params: int, capacity_bytes: int) -> int:
    """The fewest GPUs whose memory holds the model states (a power of two)."""
    need = max(1, math.ceil(shape_params * STATE_BYTES_PER_PARAM / capacity_bytes))
    return 1 << (need - 1).bit_length()


def recommend_layout_gpus(
    source: Any,
    *,
    global_batch: int,
    seq_len: int,
    prices: Any,
    gpus_per_node: int | None = None,
    max_gpus: int | None = None,
) -> list[GPUCount]:
    """Per training GPU of the catalog, how many make the job fit (module docstring); the
    ones that fit first, cheapest per 1 M tokens first."""
    n_params = int(source.spec.n_params or 0)
    out = []
    for g in list_gpus():
        if getattr(g, "form_factor", None) not in TRAINING_FORM_FACTORS:
            continue
        try:
            Rates.of(g)
        except SpecError:  # no published rates: its step time cannot be predicted
            continue
        price = prices.of(g).usd_per_hour if prices is not None else None
        out.append(_one_kind(source, g, n_params, global_batch, seq_len, price,
                             gpus_per_node, max_gpus))  # fmt: skip
    return sorted(out, key=_advice_key)


def _one_kind(
    source: Any,
    g: Any,
    n_params: int,
    global_batch: int,
    seq_len: int,
    price: float | None,
    per_node: int | None,
    max_gpus: int | None,
) -> GPUCount:
    n = gpu_floor(n_params, g.capacity_bytes)
    tried: list[int] = []
    found: list[LayoutPlan] = []
    for _ in range(MAX_DOUBLINGS + 1):
        if (max_gpus and n > max_gpus) or len(found) > EXTRA_DOUBLINGS:
            break
        progress.report(f"{g.name}: trying {n} GPUs")
        tried.append(n)
        plan = plan_layout(
            source, gpus=n, global_batch=global_batch, seq_len=seq_len, gpu=g,
            gpus_per_node=per_node, usd_per_gpu_hour=price, n_alternatives=0,
        )  # fmt: skip
        if plan.fits:
            found.append(plan)
        n *= 2
    smallest = found[0] if found else None
    priced = [(_usd(p), p) for p in found if _usd(p) is not None]
    cheapest = min(priced, key=lambda up: up[0] or 0.0)[1] if priced else smallest
    return GPUCount(gpu=g.name, smallest=smallest, cheapest=cheapest, tried=tried)


def _usd(p: LayoutPlan) -> float | None:
    return p.best.usd_per_million_tokens if p.best is not None else None


def _advice_key(c: GPUCount) -> tuple[Any, ...]:
    best = c.cheapest.best if c.cheapest is not None else None
    usd = best.usd_per_million_tokens if best is not None else None
    return (best is None, usd is None, usd or 0.0)


__all__ = [
    "GPUCount",
    "LayoutChoice",
    "LayoutOption",
    "LayoutPlan",
    "gpu_floor",
    "plan_layout",
    "recommend_layout_gpus",
]
