"""Every dp x tp x pp x cp (x ep) layout of N GPUs for one training job, and its per-rank peak.

The memory half of the layout search (issue 30 item 3): for ``gpus`` GPUs, a global batch and a
sequence length, every layout whose degrees multiply to ``gpus`` (tp a power of two up to the
GPUs of a node — tensor parallelism stays on the node's NVLink —, cp a power of two up to
:data:`CP_DEGREES`, pp dividing the GPUs within reason; for a MoE model ep a power of two
dividing the experts and ``dp x cp x tp``), each pipeline schedule, sharding mode, micro-batch
size that divides the per-replica batch and checkpointing mode (:func:`layout_choices`) —
each estimated by the parallel closed form (the same for pp = cp = 1 layouts, so that all
compare alike) and judged by THE verdict rule on ``gpu`` (:func:`layout_peak`).
:func:`enumerate_layouts` does both for every choice; :mod:`memfit.plan.layout_plan` ranks
them by predicted step time (:mod:`memfit.plan.layout_cost`). ``bubble`` is the pipeline's
idle fraction of the compute (:func:`memfit.plan.layout_cost.bubble_fraction` is the one rule;
the figure here is ``(pp - 1) / (m v)``, Narayanan et al. 2021 §2.2, zero for the V schedules
with ``m >= 2 pp``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.parallel.engine import estimate_parallel
from memfit.estimate.parallel.schedule import chunks_per_rank
from memfit.spec import WorkloadSpec

#: Tensor-parallel degrees tried, capped at the GPUs of one node (TP across nodes is not run).
TP_DEGREES = (1, 2, 4, 8, 16, 32, 64, 72)
#: Context-parallel degrees tried.
CP_DEGREES = (1, 2, 4, 8)
#: The deepest pipeline tried.
MAX_PP = 64
MICRO_BATCHES = (1, 2, 4)
CHECKPOINTING = ("none", "selective", "full")
#: Pipeline schedules the planner tries (memfit's names; interleaved with 2 chunks per rank).
SCHEDULES = ("1f1b", "interleaved-1f1b", "zbv", "dualpipev")
#: Chunks per rank of the interleaved schedule the planner tries (Megatron's examples use 2-4).
INTERLEAVED_CHUNKS = 2
#: Sharding modes of the data- and context-parallel ranks: torchtitan's FSDP2, Megatron's
#: distributed optimizer.
SHARDS = ("fsdp", "zero1")


@dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """One layout of a training job: degrees, batch split, schedule, sharding, checkpointing."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int = 1
    micro_batch: int
    grad_accum: int
    seq_len: int
    checkpointing: str
    pp_schedule: str = "1f1b"
    pp_virtual_stages: int = 1
    shard: str = "fsdp"

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def workload(self) -> WorkloadSpec:
        """The :class:`WorkloadSpec` the closed form estimates (FlashAttention, as the
        frameworks run these layouts)."""
        return WorkloadSpec(
            gpus=self.gpus,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            batch_size=self.micro_batch,
            grad_accum=self.grad_accum,
            seq_len=self.seq_len,
            checkpointing=self.checkpointing,
            attention="flash",
            shard=self.shard if self.dp * self.cp > 1 else "none",
            pp_schedule=self.pp_schedule if self.pp > 1 else "1f1b",
            pp_virtual_stages=self.pp_virtual_stages if self.pp > 1 else 1,
        )


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
    ep: int = 1
    pp_schedule: str = "1f1b"
    pp_virtual_stages: int = 1
    shard: str = "fsdp"

    @property
    def choice(self) -> LayoutChoice:
        return LayoutChoice(
            dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep,
            micro_batch=self.micro_batch, grad_accum=self.grad_accum, seq_len=0,
            checkpointing=self.checkpointing, pp_schedule=self.pp_schedule,
            pp_virtual_stages=self.pp_virtual_stages, shard=self.shard,
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def bubble_fraction(schedule: str, *, pp: int, micro_batches: int, virtual: int = 1) -> float:
    """Idle time of a pipeline relative to its compute, the one rule (the planner's step time
    adds it): ``(pp - 1) / m`` for GPipe and 1F1B (Narayanan et al. 2021, "Efficient
    Large-Scale Language Model Training on GPU Clusters", §2.2.1), ``(pp - 1) / (m v)`` for
    interleaved 1F1B with ``v`` chunks per rank (§2.2.2); 0 for ZBV and DualPipeV once
    ``m >= 2 pp`` (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 §6;
    DeepSeek-V3 technical report Table 2: DualPipe's bubble is ``(pp/2 - 1)(F&B + B - 3W)``, a
    fraction of one micro-batch), else as interleaved with their 2 chunks per rank."""
    if pp == 1:
        return 0.0
    if schedule in ("zbv", "dualpipev") and micro_batches >= 2 * pp:
        return 0.0
    return (pp - 1) / (micro_batches * chunks_per_rank(schedule, virtual))


def _degrees(gpus: int, n_layers: int, max_tp: int) -> Iterator[tuple[int, int, int, int]]:
    for tp in TP_DEGREES:
        if tp > max_tp:
            continue
        for cp in CP_DEGREES:
            for pp in range(1, min(MAX_PP, n_layers) + 1):
                if gpus % (tp * cp * pp) == 0:
                    yield gpus // (tp * cp * pp), tp, pp, cp


def _schedules(pp: int, m: int, schedules: Sequence[str]) -> Iterator[tuple[str, int]]:
    if pp == 1:
        yield "1f1b", 1
        return
    for name in schedules:
        if name == "dualpipev" and m < 2 * pp:
            continue  # DualPipe needs num_chunks >= 2 x ranks (engine._check)
        yield name, INTERLEAVED_CHUNKS if name == "interleaved-1f1b" else 1


def _ep_degrees(spec: Any, dp: int, tp: int, cp: int, moe: bool) -> list[int]:
    if not moe:
        return [1]
    n_experts = int(getattr(spec, "n_experts", 0) or 0)
    out, ep = [], 1
    while ep <= n_experts and (dp * cp * tp) % ep == 0:
        if n_experts % ep == 0:
            out.append(ep)
        ep *= 2
    return out


def layout_choices(
    source: Any,
    *,
    gpus: int,
    global_batch: int,
    seq_len: int,
    shards: Sequence[str] = ("fsdp",),
    schedules: Sequence[str] = ("1f1b",),
    max_tp: int = 8,
    micro_batches: Sequence[int] = MICRO_BATCHES,
    checkpointing: Sequence[str] = CHECKPOINTING,
) -> Iterator[LayoutChoice]:
    """Every layout of ``gpus`` GPUs for ``global_batch`` sequences of ``seq_len`` tokens
    (module docstring); rules the closed form refuses are found by :func:`layout_peak`."""
    spec = source.spec
    n_layers = int(getattr(spec, "n_layers", 0) or 0)
    moe = bool(getattr(spec, "n_experts", 0))
    for dp, tp, pp, cp in _degrees(gpus, n_layers, max_tp):
        if global_batch % dp:
            continue
        per_replica = global_batch // dp
        for mb in micro_batches:
            if per_replica % mb:
                continue
            m = per_replica // mb
            for sched, v in _schedules(pp, m, schedules):
                for ep in _ep_degrees(spec, dp, tp, cp, moe):
                    for shard in shards if dp * cp > 1 else shards[:1]:
                        for ckpt in checkpointing:
                            yield LayoutChoice(
                                dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, micro_batch=mb,
                                grad_accum=m, seq_len=seq_len, checkpointing=ckpt,
                                pp_schedule=sched, pp_virtual_stages=v, shard=shard,
                            )  # fmt: skip


def layout_peak(source: Any, choice: LayoutChoice, gpu: Any = None) -> LayoutPeak | None:
    """The peak GPU of ``choice`` by the parallel closed form, judged on ``gpu``; None where
    the model or the rules refuse the layout (tp not dividing the heads, too many stages)."""
    try:
        w = choice.workload()
        est = estimate_parallel(source, w, gpu=gpu)
    except SpecError:
        return None
    pp, m = choice.pp, choice.grad_accum
    return LayoutPeak(
        dp=choice.dp,
        tp=choice.tp,
        pp=pp,
        cp=choice.cp,
        ep=choice.ep,
        micro_batch=choice.micro_batch,
        grad_accum=m,
        checkpointing=choice.checkpointing,
        pp_schedule=w.pp_schedule,
        pp_virtual_stages=w.pp_virtual_stages,
        shard=str(w.shard),
        peak_pp_rank=int(est.trace["parallel"]["peak_pp_rank"]),
        peak_allocated_bytes=est.peak_allocated_bytes,
        device_used_bytes=est.device_used_bytes,
        device_used_high_bytes=est.ranges["device_used_bytes"][1],
        verdict=None if est.verdict is None else est.verdict.verdict,
        bubble=bubble_fraction(w.pp_schedule, pp=pp, micro_batches=m, virtual=w.pp_virtual_stages),
    )


def enumerate_layouts(
    source: Any,
    *,
    gpus: int,
    global_batch: int,
    seq_len: int,
    gpu: Any = None,
    shard: str = "fsdp",
    pp_schedule: str = "1f1b",
    shards: Sequence[str] | None = None,
    schedules: Sequence[str] | None = None,
    max_tp: int = 8,
) -> list[LayoutPeak]:
    """Every valid layout of ``gpus`` GPUs for ``source`` (a ModelSource) training batches of
    ``global_batch`` sequences of ``seq_len`` tokens, with its peak GPU (module docstring).
    ``shards`` / ``schedules``: several sharding modes / pipeline schedules (default: the one
    ``shard`` / ``pp_schedule``). Layouts the model or the rules refuse are left out."""
    out: list[LayoutPeak] = []
    for choice in layout_choices(
        source,
        gpus=gpus,
        global_batch=global_batch,
        seq_len=seq_len,
        shards=tuple(shards or (shard,)),
        schedules=tuple(schedules or (pp_schedule,)),
        max_tp=max_tp,
    ):
        row = layout_peak(source, choice, gpu)
        if row is not None:
            out.append(row)
    return out


__all__ = [
    "CHECKPOINTING",
    "MICRO_BATCHES",
    "SCHEDULES",
    "SHARDS",
    "LayoutChoice",
    "LayoutPeak",
    "bubble_fraction",
    "enumerate_layouts",
    "layout_choices",
    "layout_peak",
]
