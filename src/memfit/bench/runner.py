"""``memfit.bench``: the baseline, each technique alone and the combined plan, run for real.

Every row builds a fresh model (same seed, same weights), applies its workload with
``memfit.apply_plan_`` and ``memfit.build_optimizer``, runs ``steps`` training steps on the same
batches of packaged text, and records the measured peak, step time, throughput and losses, next to
memfit's estimate of the same workload.

The estimate a row is compared with depends on the device:

- **CPU**: the trace engine with CPU kernels (``trace_hf(..., emulate_cuda=False)``), which counts
  what real CPU execution allocates, minus the cuBLAS/cuBLASLt workspaces the estimate adds for a
  CUDA device (``device.allocator_workspaces``: a CPU run never allocates them). The bench states
  the bytes it took out (``workspace_bytes_excluded``).
- **CUDA**: the trace engine with CUDA kernel routing and the workspaces of a generic GPU
  (``trace_hf(..., gpu=None)``), compared with ``max_memory_allocated``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from memfit.apply.preflight import refuse_if_too_large
from memfit.bench.data import TextBatches, make_batches
from memfit.bench.gate import (
    QualityResult,
    QualityThresholds,
    compare_outputs,
    gate,
    outputs,
    quantized_notes,
)
from memfit.bench.measure import measure_training
from memfit.bench.models import BenchModel, get_bench_model
from memfit.bench.result import BenchResult, BenchRow
from memfit.errors import MemfitError, SpecError
from memfit.estimate.device import allocator_workspaces
from memfit.spec import WorkloadSpec

#: The baseline every row changes one thing of: fp32 weights, AdamW (torch), eager attention
#: (materialised scores), no checkpointing — a plain full fine-tune.
BASELINE = WorkloadSpec(mode="train", precision="fp32", attention="eager", optimizer="adamw")
#: LoRA rank of the ``lora`` and ``int8`` rows and of the combined plan.
LORA_RANK = 8

Change = Callable[[WorkloadSpec, BenchModel], WorkloadSpec]

#: One change per technique. ``int8`` trains LoRA adapters over int8 base weights (quantized
#: weights get no gradients, so it cannot run alone in training): compare it with ``lora``.
TECHNIQUES: dict[str, Change] = {
    "sdpa": lambda w, m: dataclasses.replace(w, attention="sdpa"),
    "bf16": lambda w, m: dataclasses.replace(w, precision="bf16-true"),  # pure bf16 weights
    "checkpointing": lambda w, m: dataclasses.replace(w, checkpointing="full"),
    "lora": lambda w, m: dataclasses.replace(w, lora_rank=LORA_RANK),
    "freeze": lambda w, m: dataclasses.replace(w, freeze_layers=max(m.n_layers // 2, 1)),
    "adamw-8bit": lambda w, m: dataclasses.replace(w, optimizer="adamw-8bit"),
    "int8": lambda w, m: dataclasses.replace(w, quant="int8", lora_rank=LORA_RANK),
}
#: The combined plan: every technique that composes (8-bit AdamW adds nothing over LoRA's few
#: trainable parameters; freezing nothing over LoRA).
COMBINED = ("bf16", "sdpa", "checkpointing", "lora", "int8")
#: Quantization in the bench uses bitsandbytes (LLM.int8 runs on CPU in 0.50, and on CUDA): the
#: format memfit's ``--quant int8`` models. torchao's int8 weight-only stores the same bytes but
#: trains differently under peft (measured: +11 % over LoRA alone at OPT-125m b1 x 128), which
#: memfit does not model; ``memfit quality --backend torchao`` gates its outputs.
QUANT_BACKEND = "bitsandbytes"


def bench(
    model: str = "opt-125m",
    *,
    techniques: list[str] | tuple[str, ...] | None = None,
    steps: int = 3,
    batch_size: int = 1,
    seq_len: int = 128,
    device: str | None = None,
    combined: bool = True,
    thresholds: QualityThresholds | None = None,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
) -> BenchResult:
    """Run ``model`` (``opt-125m``, ``minilm``, ``tiny-opt``, any MODEL memfit resolves offline) for
    ``steps`` training steps per row; ``techniques`` default to all of :data:`TECHNIQUES`.

    Before any row runs, the baseline row (fp32 + AdamW, the largest) is estimated and the bench
    refused (SpecError) when that exceeds this machine's free memory (RAM on CPU, device memory
    on CUDA), unless ``force``."""
    names = list(TECHNIQUES) if techniques is None else list(techniques)
    _check(names, steps, batch_size, seq_len)
    if not isinstance(force, bool):
        raise SpecError(f"force ({force!r}) must be True or False")
    started = time.perf_counter()
    dev = bench_device(device)
    spec = get_bench_model(model)
    base = dataclasses.replace(BASELINE, batch_size=batch_size, seq_len=seq_len)
    if not force:
        peak, _fwd_bwd, _error = _estimate(spec, base, dev, extrapolate=None)
        refuse_if_too_large(peak, dev, what=f"memfit bench {spec.name} (baseline row)", force=force)
    data = make_batches(
        task=spec.task,
        n_steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        vocab_size=spec.vocab_size,
    )
    plan: list[tuple[str, list[str], WorkloadSpec]] = [("baseline", [], base)]
    plan += [(n, [n], TECHNIQUES[n](base, spec)) for n in names]
    if combined and len(names) > 1:
        parts = [n for n in COMBINED if n in names]
        w = base
        for n in parts:
            w = TECHNIQUES[n](w, spec)
        plan.append(("combined", parts, w))
    rows: list[BenchRow] = []
    for name, parts, workload in plan:
        if progress:
            progress(f"{name}: {', '.join(parts) or 'fp32 + AdamW'}")
        rows.append(_row(name, parts, workload, spec, data, dev, thresholds))
    return BenchResult(
        model=spec.name,
        pretrained=spec.pretrained,
        task=spec.task,
        device=str(dev),
        corpus=data.corpus,
        tokenizer=data.tokenizer,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        estimate_kind=_estimate_kind(dev),
        workspace_bytes_excluded=_workspace_bytes() if dev.type == "cpu" else 0,
        rows=_with_deltas(rows),
        wall_s=round(time.perf_counter() - started, 1),
    )


def bench_device(device: str | None) -> torch.device:
    """``device`` ("cpu", "cuda", "cuda:N"; None: cuda when available) as a torch device, or a
    SpecError naming the value (``tpu`` used to fail with a traceback)."""
    if device is not None and not isinstance(device, str):
        raise SpecError(f"device ({device!r}) must be 'cpu', 'cuda' or 'cuda:N'")
    text = (device or ("cuda" if torch.cuda.is_available() else "cpu")).strip().lower()
    head, _, index = text.partition(":")
    if head not in ("cpu", "cuda") or (index and (head == "cpu" or not index.isdigit())):
        raise SpecError(f"device ({device!r}) must be 'cpu', 'cuda' or 'cuda:N'")
    if head == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"device ({device!r}): no CUDA GPU is visible here; use --device cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise SpecError(
            f"device ({device!r}): this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device(text)


def _check(names: list[str], steps: int, batch_size: int, seq_len: int) -> None:
    problems = [
        f"technique {n!r} is not one of {', '.join(TECHNIQUES)}"
        for n in names
        if n not in TECHNIQUES
    ]
    for field, value, upper in (("steps", steps, 1000), ("batch_size", batch_size, 1024)):
        if not isinstance(value, int) or not 1 <= value <= upper:
            problems.append(f"{field} ({value!r}) must be an integer from 1 to {upper}")
    if not isinstance(seq_len, int) or not 8 <= seq_len <= 4096:
        problems.append(f"seq_len ({seq_len!r}) must be an integer from 8 to 4096")
    if problems:
        raise SpecError.from_problems(problems)


def _row(
    name: str,
    parts: list[str],
    workload: WorkloadSpec,
    spec: BenchModel,
    data: TextBatches,
    device: torch.device,
    thresholds: QualityThresholds | None,
) -> BenchRow:
    record: dict[str, Any] = {
        "name": name,
        "techniques": parts,
        "workload": workload.normalized(),
    }
    try:
        model, optimizer, amp = _prepared(spec, workload, device)
        torch.manual_seed(0)  # the same dropout masks in every row (LoRA init drew numbers)
        measured = measure_training(model, optimizer, data.train, amp)
        n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        quality = _quality(model, spec, data, device, workload, thresholds)
        del model, optimizer
    except (MemfitError, ImportError, RuntimeError, NotImplementedError) as exc:
        if name == "baseline":  # nothing to compare with: the bench cannot run here at all
            raise
        return BenchRow(**record, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    estimated, fwd_bwd, est_error = _estimate(spec, workload, device)
    return BenchRow(
        **record,
        measured_peak_bytes=measured.peak_allocated_bytes,
        measured_fwd_bwd_peak_bytes=measured.fwd_bwd_peak_bytes,
        estimated_fwd_bwd_peak_bytes=fwd_bwd,
        measured_reserved_bytes=measured.peak_reserved_bytes,
        device_used_bytes=measured.device_used_bytes,
        estimated_peak_bytes=estimated,
        estimate_error=est_error,
        step_time_s=round(measured.step_time_s, 4),
        tokens_per_s=round(data.n_tokens_per_batch / measured.step_time_s, 1),
        samples_per_s=round(workload.batch_size / measured.step_time_s, 3),
        losses=[round(x, 5) for x in measured.losses],
        n_trainable_params=n_trainable,
        quality=quality,
    )


def _prepared(spec: BenchModel, workload: WorkloadSpec, device: torch.device) -> Any:
    """A fresh model on ``device`` with ``workload`` applied, its optimizer and its AMP step."""
    from memfit.apply.amp import AmpStep
    from memfit.apply.model import apply_plan_
    from memfit.apply.optimizers import build_optimizer

    model = spec.build(train=True, attention="eager").to(device)
    applied = apply_plan_(model, workload, quant_backend=QUANT_BACKEND)
    model = applied if isinstance(applied, torch.nn.Module) else model
    optimizer = build_optimizer(model, workload)
    return model, optimizer, AmpStep(workload, device_type=device.type)


def _quality(
    model: torch.nn.Module,
    spec: BenchModel,
    data: TextBatches,
    device: torch.device,
    workload: WorkloadSpec,
    thresholds: QualityThresholds | None,
) -> QualityResult | None:
    """For a quantized row: the inference quality gate of the same quantization (fresh models)."""
    if workload.quant == "none":
        return None
    from memfit.apply.model import apply_plan_

    reference = spec.build(train=False, attention="sdpa").to(device)
    ref_out = outputs(reference, data.eval)
    infer = WorkloadSpec(mode="infer", precision="fp32", quant=workload.quant)
    apply_plan_(reference, infer, quant_backend=QUANT_BACKEND)
    metrics = compare_outputs(ref_out, outputs(reference, data.eval))
    notes = quantized_notes(reference, spec.name, workload.quant)
    return gate(
        f"quant {workload.quant} ({QUANT_BACKEND})",
        metrics,
        thresholds or QualityThresholds(),
        notes,
    )


def _estimate(
    spec: BenchModel, workload: WorkloadSpec, device: torch.device, extrapolate: bool | None = False
) -> tuple[int | None, int | None, str | None]:
    """memfit's estimate of the row's peak and of its forward + backward peak (see the module
    docstring), or the reason it failed."""
    from memfit.estimate.trace.engine import trace_hf

    cpu = device.type == "cpu"
    try:
        est = trace_hf(
            spec.config,
            dataclasses.replace(workload, task=spec.task),
            name=spec.name,
            extrapolate=extrapolate,
            emulate_cuda=not cpu,
        )
    except MemfitError as exc:
        return None, None, f"{type(exc).__name__}: {str(exc)[:300]}"
    workspaces = _workspace_bytes() if cpu else 0
    fwd_bwd = max(
        (est.phases[p].peak_allocated_bytes for p in ("forward", "backward") if p in est.phases),
        default=None,
    )
    return (
        est.peak_allocated_bytes - workspaces,
        None if fwd_bwd is None else fwd_bwd - workspaces,
        None,
    )


def _workspace_bytes() -> int:
    """cuBLAS/cuBLASLt workspaces the trace adds for a CUDA device (training, generic GPU)."""

    return sum(allocator_workspaces(None, training=True))


def _estimate_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return "trace_hf (CUDA kernels, generic-GPU workspaces) vs max_memory_allocated"
    return (
        "trace_hf(emulate_cuda=False) (CPU kernels) minus the cuBLAS workspaces a CUDA device "
        "would add, vs the exact CPU tensor tracker"
    )


def _with_deltas(rows: list[BenchRow]) -> list[BenchRow]:
    base = rows[0] if rows and rows[0].error is None else None
    if base is None or base.measured_peak_bytes is None:
        return rows
    out = []
    for r in rows:
        if r.error is not None or r.measured_peak_bytes is None:
            out.append(r)
            continue
        out.append(
            dataclasses.replace(
                r,
                measured_saving_bytes=base.measured_peak_bytes - r.measured_peak_bytes,
                estimated_saving_bytes=(
                    base.estimated_peak_bytes - r.estimated_peak_bytes
                    if base.estimated_peak_bytes is not None and r.estimated_peak_bytes is not None
                    else None
                ),
                reduction_factor=round(base.measured_peak_bytes / r.measured_peak_bytes, 3),
                loss_delta=(
                    round(r.losses[-1] - base.losses[-1], 5) if r.losses and base.losses else None
                ),
            )
        )
    return out
