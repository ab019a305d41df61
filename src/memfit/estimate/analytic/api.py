"""Public entry points: ``estimate_analytic``, ``estimate_many``, ``supports``."""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import FAMILY_OF, read_arch
from memfit.estimate.analytic.distributed import per_rank_config, tp_problems
from memfit.estimate.analytic.engine import Simulated, simulate
from memfit.estimate.analytic.graph import TEMP, Vec, vadd
from memfit.estimate.analytic.programs import PROGRAMS, program_for, resolve_task
from memfit.estimate.analytic.reserved import reserved_bytes
from memfit.estimate.quant import gpu_problems, unquantized_layers_note
from memfit.estimate.result import COMPONENTS, MemoryEstimate, PhasePeak
from memfit.estimate.tasks import position_problems
from memfit.estimate.trace.device import allocator_workspaces, device_totals, fit_verdict
from memfit.spec import WorkloadSpec

#: Workload settings the analytic engine does not model yet, with their default value.
UNSUPPORTED_DEFAULTS: dict[str, Any] = {}


def supports(config: dict[str, Any] | None) -> bool:
    """Whether ``estimate_analytic`` has closed forms for this config.json dict (its
    ``model_type`` has a layer program; the workload may still name a setting not modelled)."""
    if not config:
        return False
    return FAMILY_OF.get(str(config.get("model_type", ""))) in PROGRAMS


def estimate_analytic(source: Any, workload: WorkloadSpec, *, gpu: Any = None) -> MemoryEstimate:
    """Estimate ``source`` (a ``ModelSource`` or a config.json dict) running ``workload``.

    Raises SpecError for a model_type without closed forms or a workload setting not modelled."""
    started = time.perf_counter()
    config, name = _config_of(source)
    _check_gpu(workload, gpu)
    prog, task = _prepare(config, workload)
    sim = _with_full_counts(simulate(prog, workload, task), config, workload, task)
    _add_notes(sim, config, workload)
    return _to_estimate(sim, workload, name=name, gpu=gpu, task=task, started=started)


def _add_notes(sim: Simulated, config: dict[str, Any], wl: WorkloadSpec) -> None:
    if note := unquantized_layers_note(str(config.get("model_type", "")), wl.quant):
        sim.notes.append(note)


def estimate_many(
    model: Any, workloads: Sequence[WorkloadSpec], *, gpu: Any = None
) -> list[MemoryEstimate]:
    """Estimates of one model for many workloads. Every byte count is linear in the batch size
    for a fixed model and remaining settings, so workloads that differ only in ``batch_size``
    share two simulations (at batch 1 and 2) and are evaluated by interpolation — the same
    numbers ``estimate_analytic`` gives, at a fraction of the cost."""
    config, name = _config_of(model)
    for wl in {w.quant: w for w in workloads}.values():
        _check_gpu(wl, gpu)
    cache: dict[tuple[Any, ...], tuple[str, Simulated, dict[str, list[tuple[Vec, Vec]]]]] = {}
    out = []
    for wl in workloads:
        started = time.perf_counter()
        key = _batch_free_key(wl)
        entry = cache.get(key)
        if entry is None:
            prog, task = _prepare(config, wl)
            one_ = simulate(prog, replace(wl, batch_size=1), task)
            one_ = _with_full_counts(one_, config, wl, task)
            _add_notes(one_, config, wl)
            two = simulate(prog, replace(wl, batch_size=2), task)
            entry = cache[key] = (task, one_, _envelopes(one_, two))
        task, one_, lines = entry
        sim = _at_batch(one_, lines, wl.batch_size)
        out.append(_to_estimate(sim, wl, name=name, gpu=gpu, task=task, started=started))
    return out


def _check_gpu(wl: WorkloadSpec, gpu: Any) -> None:
    if problems := gpu_problems(wl.quant, gpu):
        raise SpecError.from_problems(problems)


def _batch_free_key(wl: WorkloadSpec) -> tuple[Any, ...]:
    """Every field but the batch size and the micro-batch count (one micro-batch is simulated;
    accumulation's held gradients are ``zero_grad_set_to_none``, which the key keeps)."""
    free = ("batch_size", "grad_accum")
    return tuple(repr(getattr(wl, f.name)) for f in dataclasses.fields(wl) if f.name not in free)


def _envelopes(one_: Simulated, two: Simulated) -> dict[str, list[tuple[Vec, Vec]]]:
    """Per phase, the points that are the peak for some batch size >= 1, as (value at batch 1,
    change per sequence) pairs: the upper envelope of the lines ``total(batch)``."""
    out = {}
    for phase, pts1 in one_.candidates.items():
        lines = [
            (p1, tuple(b - a for a, b in zip(p1, p2, strict=True)))
            for p1, p2 in zip(pts1, two.candidates[phase], strict=True)
        ]
        keep: list[tuple[Vec, Vec]] = []
        best = max(lines, key=lambda ln: (sum(ln[0]), sum(ln[1])))
        while True:
            keep.append(best)  # type: ignore[arg-type]
            a0, s0 = sum(best[0]), sum(best[1])
            # the steeper line that overtakes ``best`` first (smallest crossing batch)
            steeper = [
                ((a0 - sum(ln[0])) / (sum(ln[1]) - s0), ln) for ln in lines if sum(ln[1]) > s0
            ]
            if not steeper:
                break
            best = min(steeper, key=lambda c: (c[0], -sum(c[1][1])))[1]
        out[phase] = keep
    return out


def _at_batch(one_: Simulated, lines: dict[str, list[tuple[Vec, Vec]]], batch: int) -> Simulated:
    """Points at ``batch`` from the envelope lines (each point is affine in the batch size)."""
    k = batch - 1
    cands = {
        phase: [
            tuple(a + k * d for a, d in zip(p, dp, strict=True))  # type: ignore[misc]
            for p, dp in kept
        ]
        for phase, kept in lines.items()
    }
    return Simulated(
        candidates=cands,  # type: ignore[arg-type]
        n_params=one_.n_params,
        n_trainable=one_.n_trainable,
        notes=one_.notes,
        info=one_.info,
    )


def _config_of(source: Any) -> tuple[dict[str, Any], str]:
    if isinstance(source, dict):
        return source, str(source.get("_name_or_path") or source.get("model_type") or "model")
    config = getattr(source, "config", None)
    if config is None:
        raise SpecError(
            f"the analytic engine needs a config.json; {getattr(source, 'name', source)!r} is a "
            "factory (pkg.module:function): use --engine trace"
        )
    return config, str(getattr(source, "name", "model"))


def _prepare(config: dict[str, Any], wl: WorkloadSpec) -> tuple[Any, str]:
    bad = [
        f"{k}={getattr(wl, k)!r}"
        for k, default in UNSUPPORTED_DEFAULTS.items()
        if getattr(wl, k) != default
    ]
    if wl.quant != "none" and (wl.tp > 1 or wl.shard in ("zero3", "fsdp")):
        bad.append(f"quant={wl.quant!r} with tp={wl.tp}, shard={wl.shard!r}")
    if bad:
        raise SpecError(
            f"the analytic engine does not model {', '.join(bad)} yet; use --engine trace"
        )
    if wl.tp > 1:
        if problems := tp_problems(config, wl.tp):
            raise SpecError.from_problems(problems)
        config = per_rank_config(config, wl.tp)
    arch = read_arch(config)
    task = resolve_task(config, wl.task)
    if problems := position_problems(
        config, wl.seq_len, wl.new_tokens, generative=not wl.is_train and task == "causal-lm"
    ):
        raise SpecError.from_problems(problems)
    if wl.freeze_layers > arch.n_layers:
        raise SpecError(
            f"freeze_layers ({wl.freeze_layers}) exceeds the model's {arch.n_layers} layers"
        )
    if not wl.is_train and wl.new_tokens and task not in ("causal-lm", "seq2seq"):
        raise SpecError(
            f"new_tokens ({wl.new_tokens}) needs a generative model but the task is {task!r}; "
            "drop --new-tokens"
        )
    return program_for(arch, task, lora_rank=wl.lora_rank if wl.is_train else None), task


def _with_full_counts(
    sim: Simulated, config: dict[str, Any], wl: WorkloadSpec, task: str
) -> Simulated:
    """Under tensor parallelism the counts are the whole model's (the trace's convention); LoRA
    keeps the rank's adapter count."""
    if wl.tp == 1:
        return sim
    small = replace(wl, tp=1, gpus=wl.dp, batch_size=1, seq_len=min(wl.seq_len, 8), new_tokens=0)
    prog, _ = _prepare(config, small)
    full = simulate(prog, small, task)
    sim.n_params = full.n_params
    if not wl.lora_rank:
        sim.n_trainable = full.n_trainable
    return sim


def _to_estimate(
    sim: Simulated, wl: WorkloadSpec, *, name: str, gpu: Any, task: str, started: float
) -> MemoryEstimate:
    ws = sum(allocator_workspaces(gpu, training=wl.is_train))
    phases: dict[str, PhasePeak] = {}
    for phase, pts in sim.candidates.items():
        best: Vec = max(pts, key=sum)
        best = vadd(best, (0, 0, 0, 0, 0, ws))
        comps = {c: int(best[i]) for i, c in enumerate(COMPONENTS)}
        assert COMPONENTS.index("temporary") == TEMP
        phases[phase] = PhasePeak(
            phase=phase, peak_allocated_bytes=sum(comps.values()), components=comps
        )
    top = max(phases.values(), key=lambda p: p.peak_allocated_bytes)
    reserved = reserved_bytes(top.peak_allocated_bytes, training=wl.is_train)
    totals = device_totals(gpu, reserved_bytes=reserved.bytes, training=wl.is_train)
    return MemoryEstimate(
        model_name=name,
        n_params=sim.n_params,
        n_trainable_params=sim.n_trainable if wl.is_train else 0,
        workload=wl.normalized(),
        engine="analytic",
        environment={"python": platform.python_version(), "models": "transformers 5.23 code"},
        peak_allocated_bytes=top.peak_allocated_bytes,
        peak_reserved_bytes=totals.reserved_bytes,
        cuda_context_bytes=totals.cuda_context_bytes,
        device_used_bytes=totals.device_used_bytes,
        peak_phase=top.phase,
        components=dict(top.components),
        phases=phases,
        top_modules=[],
        fits=fit_verdict(gpu, totals.device_used_bytes),
        unified_memory_bytes=int(sim.info.get("paged_bytes", 0)),
        host_memory_bytes=int(sim.info.get("host_bytes", 0)),
        ranges={"peak_reserved_bytes": reserved.range},
        trace={
            "analytic": {
                "task": task,
                "wall_s": round(time.perf_counter() - started, 6),
                **sim.info,
            }
        },
        notes=wl.warnings()
        + [
            "analytic engine: closed forms of what transformers 5.23 / torch 2.13 allocate per "
            "layer, calibrated against the trace engine (docs/accuracy.md); reserved bytes are "
            f"allocated x {reserved.ratio:.3f} (a fit to the trace's allocator replay)"
        ]
        + sim.notes
        + totals.notes,
    )
