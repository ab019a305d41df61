"""The per-rank estimate of a job with pipeline, context or expert parallelism (closed form).

The trace and analytic engines model one GPU of a dp x tp job; a pipeline rank holds other
layers than its neighbours and keeps a schedule-dependent number of micro-batches, ring
attention and expert dispatch add buffers no single-GPU program has. This engine evaluates
:mod:`.memory` for every pipeline rank and answers for the rank that peaks, listing every rank
in ``trace["parallel"]`` (``--json``). Reserved bytes are the most any rank reserves
(:func:`rank_reserved_bytes`: the calibrated ratio on its peak, or on a torchtitan-style head
rank the loss's own segments beside the rest of the step). Torch-free; microseconds per layout.
"""

from __future__ import annotations

import dataclasses
import platform
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import fsdp1
from memfit.estimate.analytic.compile import (
    UNCHANGED_POLICIES,
    compile_note,
    raise_if_not_modelled,
    workload_compile_problem,
)
from memfit.estimate.analytic.reserved import reserved_bytes
from memfit.estimate.device import allocator_workspaces, device_totals, fit_verdict
from memfit.estimate.parallel.memory import (
    Layout,
    RankBytes,
    layout_of,
    rank_bytes,
    symm_mem_workspace_bytes,
)
from memfit.estimate.parallel.schedule import RankStages, pipeline_ranks
from memfit.estimate.parallel.shape import DecoderShape, read_shape
from memfit.estimate.result import MemoryEstimate, PhasePeak
from memfit.estimate.uncertainty import PATHS, PER_RANK
from memfit.spec import WorkloadSpec
from memfit.spec.hf_versions import returns_fp32_logits
from memfit.spec.parallel_rules import is_parallel_job
from memfit.units import format_bytes

#: The engine name every parallel estimate carries.
ENGINE = "analytic (closed form: parallel)"
#: The band the range carries: the per-rank closed form's own path, fitted on the published
#: per-rank points it estimates (memfit.estimate.uncertainty, benchmarks/calibrate_uncertainty.py).
#: Before 2026-12-07: the other-framework band merged with a hand-set -11 % / +20 %
#: (docs/decisions.md, "The per-rank closed form's own band").
BAND_PATH = PER_RANK
#: What the schedules and formulas were read from (the engine line shows it).
SOURCES = "torch.distributed.pipelining 00722e6, Megatron-LM 00caa53, torchtitan fb3b230"


def engine_reason(w: WorkloadSpec) -> str:
    """Why the parallel closed form answers ``w`` (one line)."""
    used = [f"{k} {getattr(w, k)}" for k in ("pp", "cp", "ep") if getattr(w, k) != 1]
    if getattr(w, "sequence_parallel", False):
        used.append(f"tp {w.tp} with sequence parallelism")
    if getattr(w, "async_tp", False):
        used.append("async TP")
    if getattr(w, "float8", "none") != "none":
        used.append(f"Float8 training ({w.float8})")
    return (
        f"{' x '.join(used)}: pipeline, context, expert and sequence parallelism and Float8 "
        "training are modelled by the per-rank closed form (memfit.estimate.parallel), not by "
        "tracing one GPU"
    )


def per_rank(
    shape: DecoderShape, w: WorkloadSpec, *, sequence_parallel: bool | None = None
) -> tuple[list[RankStages], list[RankBytes]]:
    """Every pipeline rank's stages and bytes for ``w`` (``sequence_parallel``: see
    :func:`estimate_parallel`)."""
    lay = layout_of(w)
    if sequence_parallel is not None:
        lay = dataclasses.replace(lay, sequence_parallel=sequence_parallel and w.tp > 1)
    _check(shape, w, lay)
    if w.is_train and returns_fp32_logits(w.transformers_version, shape.model_type):
        raise NotModelledError(
            f"transformers_version {w.transformers_version}: the per-rank closed form has no "
            "rule for that release's fp32 logits (memfit.spec.hf_versions); drop "
            "--transformers-version",
            engine="analytic",
        )
    if lay.compile:
        _check_compile(shape, w)
        if w.checkpointing in UNCHANGED_POLICIES and not _recompute_measured(shape, w):
            lay = dataclasses.replace(lay, compile=False)
    try:
        stages = pipeline_ranks(
            shape.n_layers,
            pp=w.pp,
            schedule=w.pp_schedule,
            virtual_stages=w.pp_virtual_stages,
            micro_batches=w.grad_accum,
        )
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return stages, [rank_bytes(shape, s, lay) for s in stages]


def _recompute_measured(shape: DecoderShape, w: WorkloadSpec) -> bool:
    """Whether the compiled saved set of the layer full checkpointing recomputes in backward
    is measured (as without checkpointing): the job's own LoRA adapters and frozen layers asked
    about, as the analytic engine asks (``analytic/engine.py`` ``_compile_measured``; before,
    this asked about a fully trained layer whatever the job froze)."""
    problem = workload_compile_problem(shape.model_type, w, moe=shape.moe, checkpointing="none")
    return problem is None and shape.gated


def _check_compile(shape: DecoderShape, w: WorkloadSpec) -> None:
    """``--compile`` where torch.compile's saved set is measured: the model types and settings
    of ``memfit.estimate.analytic.compile`` on a dense gated (SwiGLU) layer."""
    raise_if_not_modelled(shape.model_type, w, moe=shape.moe, engine="analytic")
    if w.checkpointing not in UNCHANGED_POLICIES and not shape.gated:
        raise NotModelledError(
            "compile with a plain (not gated) MLP: torch.compile's saved set was measured on "
            "SwiGLU layers; use --checkpointing full or drop --compile",
            engine="analytic",
        )


def _check(shape: DecoderShape, w: WorkloadSpec, lay: Layout) -> None:
    problems = []
    if w.ep > 1 and not shape.moe:
        problems.append(
            f"ep ({w.ep}) needs a mixture-of-experts model (this one has no routed experts); "
            "drop --ep"
        )
    if shape.moe and shape.n_experts % w.ep:
        problems.append(
            f"ep ({w.ep}) must divide the routed experts ({shape.n_experts}): each rank holds "
            "n_experts / ep of them"
        )
    if w.pp_schedule == "dualpipev" and w.grad_accum < 2 * w.pp:
        problems.append(
            f"grad_accum ({w.grad_accum}) is the pipeline's micro-batch count: pp_schedule "
            f"'dualpipev' needs at least 2 x pp ({2 * w.pp}) of them (DualPipe's num_chunks >= "
            "num_ranks * 2); raise --grad-accum"
        )
    for name, width in (
        ("num_attention_heads", shape.n_heads),
        ("num_key_value_heads", shape.n_kv_heads),
    ):
        if width % w.tp and not (name == "num_key_value_heads" and w.tp % width == 0):
            problems.append(f"tp ({w.tp}) must divide {name} ({width}); use a --tp that does")
    if problems:
        raise SpecError.from_problems(problems)


def estimate_parallel(
    source: Any, workload: WorkloadSpec, *, gpu: Any = None, sequence_parallel: bool | None = None
) -> MemoryEstimate:
    """The peak GPU of ``workload`` (pp / cp / ep > 1) for ``source`` (a ModelSource).
    ``sequence_parallel``: whether tensor parallelism also splits the norms' tensors along the
    sequence (torchtitan's TP plan and Megatron's ``--sequence-parallel`` do); None: the
    workload's own field where it has one, else False."""
    if source.origin == "factory" or source.spec is None:
        raise SpecError(
            f"{source.name}: the parallel closed form reads a config.json model (a bundled "
            "name, a path or a hub id), not a factory"
        )
    if workload.fsdp_version == 1:  # FSDP2's per-rank form + FSDP1's flat-parameter terms
        twin = fsdp1.fsdp2_twin(workload)
        est = estimate_parallel(source, twin, gpu=gpu, sequence_parallel=sequence_parallel)
        return fsdp1.with_fsdp1(est, source, workload, gpu)
    _check_float8_gpu(workload, gpu)
    shape = read_shape(source.spec)
    stages, ranks = per_rank(shape, workload, sequence_parallel=sequence_parallel)
    peak = max(ranks, key=lambda r: r.peak_allocated_bytes)
    workspaces = sum(allocator_workspaces(gpu, training=True))
    comps = peak.components()
    comps["temporary"] += workspaces
    allocated = sum(comps.values())
    # torchtitan logs the max over ranks: the head rank's loss segments may reserve the most
    reserved = max(rank_reserved_bytes(r, workspaces) for r in ranks)
    dev = device_totals(gpu, reserved_bytes=reserved, training=True)
    # async TP's SymmetricMemory workspace: driver memory beside the caching allocator's
    symm_mem = symm_mem_workspace_bytes(shape, layout_of(workload))
    device_used = dev.device_used_bytes + symm_mem
    parallel_json = _per_rank_json(stages, ranks, peak, workspaces)
    parallel_json["symm_mem_workspace_bytes"] = symm_mem
    return MemoryEstimate(
        model_name=source.name,
        n_params=int(source.spec.n_params or 0),
        n_trainable_params=int(source.spec.n_params or 0),
        workload=workload.normalized(),
        engine=ENGINE,
        environment={"python": platform.python_version(), "closed form after": SOURCES},
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=dev.reserved_bytes,
        cuda_context_bytes=dev.cuda_context_bytes,
        device_used_bytes=device_used,
        peak_phase="backward",
        components=comps,
        phases={
            "backward": PhasePeak(
                phase="backward", peak_allocated_bytes=allocated, components=dict(comps)
            )
        },  # fmt: skip
        top_modules=[],
        fits=fit_verdict(gpu, device_used),
        trace={"parallel": parallel_json},
        notes=[
            *_notes(shape, workload, stages, peak),
            *_async_tp_note(symm_mem),
            *_loss_reserve_note(ranks, workspaces, reserved),
            *dev.notes,
        ],
        engine_reason=engine_reason(workload),
        band_path=BAND_PATH,
    )


def _async_tp_note(symm_mem_bytes: int) -> list[str]:
    """Say where async TP's workspace is counted (nothing without async TP)."""
    if not symm_mem_bytes:
        return []
    return [
        f"async TP: a SymmetricMemory workspace of {format_bytes(symm_mem_bytes)} per GPU for "
        "the fused all-gather-matmul / matmul-reduce-scatter ops (two output chunks of the "
        "largest reduce-scatter), mapped outside the caching allocator: in the device (nvidia-smi) "
        "figure, not in allocated or reserved; the fused ops' other tensors are the unfused "
        "path's (code reading, torch 006b161; not measured)"
    ]


def rank_reserved_bytes(r: RankBytes, workspaces: int) -> int:
    """One rank's reserved bytes: its peak at the calibrated ratio
    (:func:`~memfit.estimate.analytic.reserved.reserved_bytes`), or, on the head rank whose loss
    needs segments of its own (:func:`~memfit.estimate.parallel.memory.loss_reserve_parts`),
    the rest of the step at that ratio plus the loss's segments as they are, where that is
    more: the segments stay cached once the loss has run, whatever peaks later."""
    scaled = reserved_bytes(r.peak_allocated_bytes + workspaces, training=True).bytes
    if r.loss_reserve is None:
        return scaled
    rest, segments = r.loss_reserve
    return max(scaled, reserved_bytes(rest + workspaces, training=True).bytes + segments)


def _loss_reserve_note(ranks: list[RankBytes], workspaces: int, reserved: int) -> list[str]:
    """Say so where the head rank's loss segments set the reserved answer."""
    for r in ranks:
        if r.loss_reserve is None or rank_reserved_bytes(r, workspaces) != reserved:
            continue
        if reserved == reserved_bytes(r.peak_allocated_bytes + workspaces, training=True).bytes:
            continue
        return [
            f"reserved: pipeline rank {r.rank}'s loss keeps {format_bytes(r.loss_reserve[1])} of "
            "segments of its own (its fp32 tensors over the vocabulary and the freed bf16 "
            "logits' block, larger than any block the rest of the step frees), counted beside "
            "the rest of the step at the calibrated reserved/allocated ratio"
        ]
    return []


def _check_float8_gpu(w: WorkloadSpec, gpu: Any) -> None:
    """Float8 training needs fp8 matrix cores (torchao's ``Float8Linear`` runs
    ``torch._scaled_mm``: CUDA compute capability 8.9+ or AMD CDNA3+)."""
    recipe = getattr(w, "float8", "none")
    if recipe != "none" and gpu is not None and not gpu.supports_fp8:
        raise SpecError(
            f"float8 ({recipe!r}) on {gpu.name}: it has no fp8 matrix cores (torchao's Float8 "
            "training needs e.g. L4, L40S, H100, H200, B200, MI300X); drop --float8 or choose "
            "such a --gpu"
        )


FLOAT8_NOTE = (
    "Float8 (torchao Float8Linear): the blocks' linears save their bf16 inputs as without it; "
    "counted: fp8 casts in backward, fp8 all-gather where set. torch.compile's fusion of the "
    "amax and cast kernels is not modelled; no eager Float8 run has been measured"
)


def _per_rank_json(
    stages: list[RankStages], ranks: list[RankBytes], peak: RankBytes, workspaces: int
) -> dict[str, Any]:
    rows = []
    for s, r in zip(stages, ranks, strict=True):
        rows.append(
            {
                "pp_rank": s.rank,
                "chunks": [c.index for c in s.chunks],
                "n_layers": s.n_layers,
                "embedding": s.embedding,
                "head": s.head,
                "in_flight_micro_batches": s.in_flight,
                "peak_allocated_bytes": r.peak_allocated_bytes + workspaces,
                "peak_reserved_bytes_approx": rank_reserved_bytes(r, workspaces),
                "components": r.components(),
                "temporary_kind": r.temporary_kind,
            }
        )
    reserved_peak = max(ranks, key=lambda r: rank_reserved_bytes(r, workspaces))
    return {
        "peak_pp_rank": peak.rank,
        "peak_reserved_pp_rank": reserved_peak.rank,
        "ranks": rows,
    }


def _notes(
    shape: DecoderShape, w: WorkloadSpec, stages: list[RankStages], peak: RankBytes
) -> list[str]:
    s = stages[peak.rank]
    where = [k for k, on in (("embeddings", s.embedding), ("output head + loss", s.head)) if on]
    notes = [
        f"pipeline rank {peak.rank} of {w.pp} peaks ({s.n_layers} layers"
        + (f", {' and '.join(where)}" if where else "")
        + f", {s.in_flight} chunk-micro-batches in flight under {w.pp_schedule}); every rank "
        "is listed in --json under trace.parallel",
        f"per GPU: dp {w.dp} x tp {w.tp} x pp {w.pp} x cp {w.cp}"
        + (
            f", ep {w.ep} (etp {w.etp}): {shape.n_experts // w.ep} experts per rank"
            if w.ep > 1
            else ""
        ),  # fmt: skip
        "closed form for torchtitan / Megatron-style decoder blocks (fused norms, FlashAttention);"
        " the largest transient here: " + peak.temporary_kind,
        _range_note(),
    ]
    if getattr(w, "float8", "none") != "none":
        notes.append(FLOAT8_NOTE)
    if getattr(w, "compile", False):
        notes.append(compile_note(w.checkpointing))
    if w.pp > 1 and w.grad_accum < w.pp:
        notes.append(
            f"grad_accum ({w.grad_accum}) is the pipeline's micro-batch count: fewer than pp "
            f"({w.pp}) leaves stages idle (raise --grad-accum)"
        )
    return notes


def _range_note() -> str:
    """The range's band in words: one fraction of every figure (a whole-figure path)."""
    band = PATHS[BAND_PATH]
    part = band.parts["dynamic"]
    return (
        f"range: -{part.low:.1%} / +{part.high:.1%} of each figure, the worst errors of this "
        f"closed form on the {band.n_points} published per-rank points it estimates "
        "(benchmarks/results/uncertainty.md, path per-rank-closed-form; docs/accuracy.md, "
        "'The per-rank closed form's own band')"
    )


def needs_parallel(w: WorkloadSpec) -> bool:
    """Whether ``w`` goes to this engine (pp, cp or ep > 1)."""
    return is_parallel_job(w)


__all__ = [
    "ENGINE",
    "engine_reason",
    "estimate_parallel",
    "needs_parallel",
    "per_rank",
    "rank_reserved_bytes",
]
