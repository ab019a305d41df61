"""Every dp x tp x pp x cp layout of N GPUs for one training job, and its per-rank peak.

The first half of a layout search (issue 30 item 3): for ``gpus`` GPUs, a global batch and a
sequence length, every layout whose degrees multiply to ``gpus`` (tp and cp powers of two up to
their caps, pp dividing the layers' count within reason), every micro-batch size that divides the
per-replica batch, every checkpointing mode — each estimated by the parallel closed form (the
same for pp = cp = 1 layouts, so that all compare alike) and judged by THE verdict rule on
``gpu``. The caller ranks them (no step-time model here: ``bubble`` is the pipeline's idle
fraction, ``(pp - 1) / (m v + pp - 1)``, Narayanan et al. 2021 §2.2).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.parallel.engine import estimate_parallel
from memfit.estimate.parallel.schedule import chunks_per_rank
from memfit.spec import WorkloadSpec

#: Tensor-parallel degrees tried: within one 8-GPU NVLink node (TP across nodes is not run).
TP_DEGREES = (1, 2, 4, 8)
#: Context-parallel degrees tried.
CP_DEGREES = (1, 2, 4, 8)
#: The deepest pipeline tried.
MAX_PP = 64
MICRO_BATCHES = (1, 2, 4)
CHECKPOINTING = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class LayoutPeak:
    """One layout and the peak GPU's figures (``verdict``: THE verdict on the GPU asked, None
    without one)."""

    dp: int
    tp: int
    pp: int
    cp: int
    micro_batch: int
    grad_accum: int
    checkpointing: str
    peak_pp_rank: int
    peak_allocated_bytes: int
    device_used_bytes: int
    device_used_high_bytes: int
    verdict: str | None
    bubble: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _degrees(gpus: int, n_layers: int) -> Iterator[tuple[int, int, int, int]]:
    for tp in TP_DEGREES:
        for cp in CP_DEGREES:
            for pp in range(1, min(MAX_PP, n_layers) + 1):
                if gpus % (tp * cp * pp) == 0:
                    yield gpus // (tp * cp * pp), tp, pp, cp


def enumerate_layouts(
    source: Any,
    *,
    gpus: int,
    global_batch: int,
    seq_len: int,
    gpu: Any = None,
    shard: str = "fsdp",
    pp_schedule: str = "1f1b",
) -> list[LayoutPeak]:
    """Every valid layout of ``gpus`` GPUs for ``source`` (a ModelSource) training batches of
    ``global_batch`` sequences of ``seq_len`` tokens, with its peak GPU (module docstring).
    Layouts the model or the rules refuse (tp not dividing the heads, a sequence cp cannot cut)
    are left out."""
    n_layers = int(getattr(source.spec, "n_layers", 0) or 0)
    out: list[LayoutPeak] = []
    for dp, tp, pp, cp in _degrees(gpus, n_layers):
        if global_batch % dp:
            continue
        per_replica = global_batch // dp
        for mb in MICRO_BATCHES:
            if per_replica % mb:
                continue
            for ckpt in CHECKPOINTING:
                row = _one(source, gpus, dp, tp, pp, cp, mb, per_replica // mb, ckpt, seq_len,
                           gpu, shard, pp_schedule)  # fmt: skip
                if row is not None:
                    out.append(row)
    return out


def _one(
    source: Any,
    gpus: int,
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    mb: int,
    accum: int,
    ckpt: str,
    seq_len: int,
    gpu: Any,
    shard: str,
    schedule: str,
) -> LayoutPeak | None:
    try:
        w = WorkloadSpec(
            gpus=gpus,
            tp=tp,
            pp=pp,
            cp=cp,
            batch_size=mb,
            grad_accum=accum,
            seq_len=seq_len,
            checkpointing=ckpt,
            attention="flash",
            shard=shard if dp * cp > 1 else "none",
            pp_schedule=schedule if pp > 1 else "1f1b",
        )
        est = estimate_parallel(source, w, gpu=gpu)
    except SpecError:
        return None
    v = chunks_per_rank(w.pp_schedule, w.pp_virtual_stages) if pp > 1 else 1
    return LayoutPeak(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        micro_batch=mb,
        grad_accum=accum,
        checkpointing=ckpt,
        peak_pp_rank=int(est.trace["parallel"]["peak_pp_rank"]),
        peak_allocated_bytes=est.peak_allocated_bytes,
        device_used_bytes=est.device_used_bytes,
        device_used_high_bytes=est.ranges["device_used_bytes"][1],
        verdict=None if est.verdict is None else est.verdict.verdict,
        bubble=(pp - 1) / (accum * v + pp - 1),
    )


__all__ = ["LayoutPeak", "enumerate_layouts"]
