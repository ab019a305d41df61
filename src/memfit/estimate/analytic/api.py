"""Public entry points: ``estimate_analytic``, ``estimate_many``, ``supports``."""

from __future__ import annotations

import copy
import dataclasses
import json
import platform
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import fastpath, sharding
from memfit.estimate.analytic import unsloth
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.compile import (
    MEASURED_POLICIES,
    UNCHANGED_POLICIES,
    compile_note,
    compile_ratio,
    raise_if_not_modelled,
)
from memfit.estimate.analytic.distributed import per_rank_config
from memfit.estimate.analytic.engine import Simulated, simulate
from memfit.estimate.analytic.graph import TEMP, ZERO, Vec, vsub
from memfit.estimate.analytic.registry import FAMILY_OF, program_for, read_arch, resolve_task
from memfit.estimate.analytic.registry import supports as _family_supports
from memfit.estimate.analytic.replay import REPLAYED_KEY
from memfit.estimate.analytic.reserved import (
    INFER_RESERVED,
    REPLAYED_RATIO,
    ClassBand,
    InferParts,
    class_band,
    describe_infer,
    infer_bytes,
    reserved_rule,
)
from memfit.estimate.analytic.versions import WRITTEN_AGAINST, version_notes
from memfit.estimate.cuda_reduce import reduce_device
from memfit.estimate.pipeline import (
    EngineResult,
    PhaseResult,
    assemble,
    check_freeze_depth,
    check_generation,
    check_gpu,
    check_positions,
    check_tp,
    prepare_workload,
    prepare_workloads,
    with_notes,
)
from memfit.estimate.quant import unquantized_layers_note
from memfit.estimate.result import COMPONENTS, MemoryEstimate
from memfit.hardware.gpu import GPU
from memfit.spec import WorkloadSpec
from memfit.spec.hf_versions import autocasts_adapters, returns_fp32_logits
from memfit.units import format_bytes

#: Workload settings the analytic engine does not model yet, with their default value (peft's
#: LoRA dropout is modelled: ``Ops.lora_dropout_of``, each adapter's dropped input and mask).
UNSUPPORTED_DEFAULTS: dict[str, Any] = {}


#: How the analytic engine's description note begins (a report that names the engine already
#: leaves this note out: report/check.py).
DESCRIPTION_START = "analytic engine: closed forms"


def supports(config: dict[str, Any] | None) -> bool:
    """Whether ``estimate_analytic`` has closed forms for this config.json dict (its
    ``model_type`` has a layer program; the workload may still name a setting not modelled)."""
    return _family_supports(config)


def estimate_analytic(
    source: Any, workload: WorkloadSpec, *, gpu: Any = None, reserved_end: str = "mid"
) -> MemoryEstimate:
    """Estimate ``source`` (a ``ModelSource`` or a config.json dict) running ``workload``;
    ``reserved_end``: the point of the reserved/allocated ratio range its reserved bytes take
    (``reserved.RESERVED_ENDS``: the median, the top for a default answer, or the top of the job
    class's band, ``fastpath.band_class``, where a verdict is settled).

    Raises NotModelledError (a SpecError) for a model_type, task or setting without closed forms,
    SpecError for a job the model cannot run."""
    started = time.perf_counter()
    config, name = _config_of(source)
    workload, prepared_notes, task, sim = _simulated(config, workload, gpu)
    job, why_wide = _band_of(config, workload) if reserved_end == "band" else (None, "")
    result = _result(
        sim, workload, name=name, task=task, started=started, end=reserved_end, job=job
    )
    if why_wide:
        result.trace["reserved_band"] += f": {why_wide}"
    est = assemble(result, workload, gpu)
    return with_notes(est, prepared_notes)


#: Simulations kept in this process, least recently used dropped first: :func:`_simulated`'s
#: (one workload) and :func:`estimate_many`'s (a batch-free workload's batch-1 simulation and
#: its batch lines), keyed by everything they read (:func:`_sim_key`): the model's config as
#: JSON, the workload's every field and the GPU record. A default answer asks for the same job
#: at two reserved ends (``policy.EnginePolicy._validated_fast``), which change only the
#: reserved rule; ``memfit web``'s worker answers jobs of one model on one GPU whose "nearest
#: change that fits" searches estimate the same stacks (issue 32). Nothing downstream changes
#: a kept value (:func:`_result` and :func:`_at_batch` build new records from it). Memory:
#: ~100 KiB a simulation (512 held 52.7 MiB after the web mix's 160 first jobs, tracemalloc),
#: so ~13 MiB a process.
MAX_SIMULATIONS_KEPT = 128
_SIMULATIONS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
#: The last configs' and GPU records' key parts, by object (the entry holds the object, so
#: ``is`` tells a reused id; a config's deep copy tells a change of it in place).
_CONFIG_KEYS: list[tuple[dict[str, Any], dict[str, Any], str]] = []
_GPU_KEYS: list[tuple[Any, str]] = []
MAX_KEY_OBJECTS = 8


def _config_key(config: dict[str, Any]) -> str | None:
    """``config`` as sorted JSON (THE config key of ``memfit.plan.nearest`` and the trace
    cache), kept per dict while a deep copy still equals it; None where it is not JSON (then
    nothing is kept)."""
    for cfg, copy_, key in _CONFIG_KEYS:
        if cfg is config and copy_ == config:
            return key
    try:
        key = json.dumps(config, sort_keys=True)
    except (TypeError, ValueError):
        return None
    _CONFIG_KEYS.insert(0, (config, copy.deepcopy(config), key))
    del _CONFIG_KEYS[MAX_KEY_OBJECTS:]
    return key


def _gpu_key(gpu: Any) -> str:
    """``repr(gpu)`` (a catalog record, or None), kept per record (frozen: its repr stays)."""
    for g, key in _GPU_KEYS:
        if g is gpu:
            return key
    key = repr(gpu)
    if isinstance(gpu, GPU):
        _GPU_KEYS.insert(0, (gpu, key))
        del _GPU_KEYS[MAX_KEY_OBJECTS:]
    return key


def _sim_key(kind: str, config: dict[str, Any], job: Any, gpu: Any) -> tuple[Any, ...] | None:
    """The key of a kept simulation (``job``: the workload's fields as :func:`_simulated` or
    :func:`estimate_many` reads them); None: not kept (a config that is not JSON)."""
    config_key = _config_key(config)
    if config_key is None:
        return None
    return (kind, config_key, job, _gpu_key(gpu))


def _kept(key: tuple[Any, ...] | None) -> Any:
    if key is None:
        return None
    found = _SIMULATIONS.get(key)
    if found is not None:
        _SIMULATIONS.move_to_end(key)
    return found


def _keep(key: tuple[Any, ...] | None, value: Any) -> None:
    if key is None:
        return
    _SIMULATIONS[key] = value
    while len(_SIMULATIONS) > MAX_SIMULATIONS_KEPT:
        _SIMULATIONS.popitem(last=False)


def _simulated(
    config: dict[str, Any], workload: WorkloadSpec, gpu: Any
) -> tuple[WorkloadSpec, list[str], str, Simulated]:
    """The prepared workload, its notes, the task and the simulation of ``workload`` on the
    model of ``config``; kept (:data:`_SIMULATIONS`) per config, workload and GPU record.
    Nothing downstream changes a :class:`Simulated`."""
    key = _sim_key("one", config, repr(workload), gpu)
    found = _kept(key)
    if found is not None:
        return found  # type: ignore[no-any-return]
    workload, prepared_notes = prepare_workload(config, workload)
    check_gpu(workload, gpu)
    prog, task = _prepare(config, workload)
    with reduce_device(gpu):  # CUDA kernels' workspaces sized for this GPU
        sim = _with_full_counts(simulate(prog, workload, task), config, workload, task)
    _add_notes(sim, config, workload)
    value = (workload, prepared_notes, task, sim)
    _keep(key, value)
    return value


def _band_of(config: dict[str, Any], workload: WorkloadSpec) -> tuple[str | None, str]:
    """The grid job whose own reserved band settles ``workload``'s verdict, ""; or None and
    why the wide band does (``fastpath.wide_band_reason``)."""
    job = fastpath.band_class(config, workload)
    if job is not None and class_band(job) is not None:
        return job, ""
    own = class_band(fastpath.grid_job(workload, config.get("model_type"))) is not None
    return None, fastpath.wide_band_reason(config, workload, own_band=own)


def _add_notes(sim: Simulated, config: dict[str, Any], wl: WorkloadSpec) -> None:
    if note := unquantized_layers_note(str(config.get("model_type", "")), wl.quant):
        sim.notes.append(note)
    if wl.kernels == "unsloth" and wl.is_train:
        sim.notes.append(_unsloth_note(config, wl))
    if wl.compile and wl.is_train:
        arch = read_arch(config if wl.tp == 1 else per_rank_config(config, wl.tp))
        ratio = None
        if wl.checkpointing in MEASURED_POLICIES:  # full: the profile is left as is
            dims = {"hidden": arch.hidden, "kv": arch.kv_dim, "ffn": arch.ffn}
            ratio = compile_ratio(arch.model_type, wl.checkpointing, heads=arch.n_heads, **dims)
        sim.notes.append(compile_note(wl.checkpointing, ratio=ratio))


def _unsloth_note(config: dict[str, Any], wl: WorkloadSpec) -> str:
    """Which of Unsloth's kernels and defaults the estimate of ``wl`` applied (one line)."""
    arch = read_arch(config)
    lora = (wl.lora_rank, wl.lora_targets) if wl.lora_rank else None
    applied, why = unsloth.kernels_applied(
        arch.model_type,
        lora=lora,
        lora_dropout=wl.lora_dropout,
        qkv_bias=arch.qkv_bias,
        o_bias=arch.o_bias,
        mlp_bias=arch.mlp_bias,
    )
    return unsloth.note(arch.model_type, applied, why, wl.kernel_defaults, loss=wl.loss)


def estimate_many(
    model: Any, workloads: Sequence[WorkloadSpec], *, gpu: Any = None
) -> list[MemoryEstimate]:
    """Estimates of one model for many workloads. Every byte count is linear in the batch size
    for a fixed model and remaining settings, so workloads that differ only in ``batch_size``
    share two simulations (at batch 1 and 2) and are evaluated by interpolation — the same
    numbers ``estimate_analytic`` gives, at a fraction of the cost. A fused cross-entropy's chunk
    (Liger's size rule: a power of two of the tokens) is not affine in the batch: those
    workloads are estimated one at a time."""
    config, name = _config_of(model)
    asked = list(workloads)
    mapped = prepare_workloads(config, workloads)
    workloads = [w for w, _ in mapped]
    for wl in {w.quant: w for w in workloads}.values():
        check_gpu(wl, gpu)
    cache: dict[tuple[Any, ...], tuple[str, Simulated, dict[str, list[tuple[Vec, Vec]]]]] = {}
    batches: dict[tuple[Any, ...], set[int]] = {}  # the batch sizes asked per batch-free key
    keys = [None if wl.loss == "fused" else _batch_free_key(wl) for wl in workloads]
    for key, wl in zip(keys, workloads, strict=True):
        if key is not None:
            batches.setdefault(key, set()).add(wl.batch_size)
    out: list[MemoryEstimate] = []
    for key, wl in zip(keys, workloads, strict=True):
        started = time.perf_counter()
        if key is None:  # a fused loss: its chunk grows in steps with the tokens, not affine
            out.append(estimate_analytic(model, asked[len(out)], gpu=gpu))
            continue
        entry = cache.get(key)
        kept_key = None
        if entry is None:
            # batch 1 alone (its peaks) or its lines through the batch-2 simulation: kept apart
            kept_key = _sim_key("lines", config, (key, batches[key] == {1}), gpu)
            entry = _kept(kept_key)
            if entry is not None:
                cache[key] = entry
        if entry is None:
            prog, task = _prepare(config, wl)
            with reduce_device(gpu):
                one_ = simulate(prog, replace(wl, batch_size=1), task)
                one_ = _with_full_counts(one_, config, wl, task)
                _add_notes(one_, config, wl)
                if batches[key] == {1}:  # batch 1 only: no second simulation (issue 32)
                    lines = _peaks(one_)
                else:
                    lines = _envelopes(one_, simulate(prog, replace(wl, batch_size=2), task))
            entry = cache[key] = (task, one_, lines)
            _keep(kept_key, entry)
        task, one_, lines = entry
        sim = _at_batch(one_, lines, wl.batch_size)
        if REPLAYED_KEY in one_.info and wl.batch_size > 1:  # routed experts (replay.py)
            sim.info[REPLAYED_KEY] = _replayed_at(config, wl, gpu)
        est = assemble(_result(sim, wl, name=name, task=task, started=started), wl, gpu)
        out.append(with_notes(est, mapped[len(out)][1]))
    return out


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
        lines = [(p1, vsub(p2, p1)) for p1, p2 in zip(pts1, two.candidates[phase], strict=True)]
        keep: list[tuple[Vec, Vec]] = []
        # each line's (total at batch 1, total's change per sequence), summed once
        sums = [(sum(p1), sum(dp)) for p1, dp in lines]
        i = max(range(len(lines)), key=lambda j: sums[j])  # the first of the largest
        while True:
            keep.append(lines[i])  # type: ignore[arg-type]
            a0, s0 = sums[i]
            # the steeper line that overtakes ``best`` first (smallest crossing batch)
            steeper = [((a0 - a) / (d - s0), j) for j, (a, d) in enumerate(sums) if d > s0]
            if not steeper:
                break
            i = min(steeper, key=lambda c: (c[0], -sums[c[1]][1]))[1]
        out[phase] = keep
    return out


def _peaks(one_: Simulated) -> dict[str, list[tuple[Vec, Vec]]]:
    """Per phase, the peak at batch 1 alone, as :func:`_envelopes`' lines with no change per
    sequence: at batch 1 the envelope's first line is that peak (the first of the largest),
    so :func:`_at_batch` gives the same answer at batch 1 without a second simulation."""
    return {phase: [(max(pts, key=sum), ZERO)] for phase, pts in one_.candidates.items()}


def _replay_sets(parts: InferParts, fit: Any, end: str) -> bool:
    """Whether the allocator replay (routed experts) sets the reserved bytes of ``parts``
    over what the fitted rule alone gives (the note then says so)."""
    if not parts.replayed_bytes:
        return False
    ratio = REPLAYED_RATIO["shown" if end == "mid" else "top"]
    alone = replace(parts, replayed_bytes=0)
    return infer_bytes(parts, fit, ratio) > infer_bytes(alone, fit)


def _replayed_at(config: dict[str, Any], wl: WorkloadSpec, gpu: Any) -> int | None:
    """The allocator replay's bytes of ``wl`` at its own batch size (``replay.py``; routed
    experts only): the segments' rounding is not affine in the batch, so a search replays each
    batch it asks (one simulation of ``wl``, its blocks kept as every other)."""
    prog, task = _prepare(config, wl)
    with reduce_device(gpu):
        return simulate(prog, wl, task).info.get(REPLAYED_KEY)


def _at_batch(one_: Simulated, lines: dict[str, list[tuple[Vec, Vec]]], batch: int) -> Simulated:
    """Points at ``batch`` from the envelope lines (each point is affine in the batch size);
    the allocator replay's bytes (routed experts) are batch 1's: the caller replays another
    batch (:func:`_replayed_at`)."""
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
        info=dict(one_.info),
    )


def _config_of(source: Any) -> tuple[dict[str, Any], str]:
    if isinstance(source, dict):
        return source, str(source.get("_name_or_path") or source.get("model_type") or "model")
    config = getattr(source, "config", None)
    if config is None:
        raise NotModelledError(
            f"the analytic engine needs a config.json; {getattr(source, 'name', source)!r} is a "
            "factory (pkg.module:function): use --engine trace",
            engine="analytic",
        )
    return config, str(getattr(source, "name", "model"))


def _prepare(config: dict[str, Any], wl: WorkloadSpec) -> tuple[Any, str]:
    bad = [
        f"{k}={getattr(wl, k)!r}"
        for k, default in UNSUPPORTED_DEFAULTS.items()
        if getattr(wl, k) != default
    ]
    if wl.compile and wl.is_train and wl.lora_rank is not None and wl.lora_dropout:
        # torch.compile's saved set was measured without LoRA dropout (compile.py)
        bad.append(f"lora_dropout={wl.lora_dropout!r} with compile")
    if wl.quant != "none" and (wl.tp > 1 or wl.shard in ("zero3", "fsdp")):
        bad.append(f"quant={wl.quant!r} with tp={wl.tp}, shard={wl.shard!r}")
    if wl.is_train and wl.lora_rank is not None and not autocasts_adapters(wl.peft_version):
        bad.append(f"peft_version={wl.peft_version!r} (adapters in the base dtype)")
    if wl.is_train and returns_fp32_logits(wl.transformers_version, config.get("model_type")):
        bad.append(
            f"transformers_version={wl.transformers_version!r} (its forward returns fp32 logits: "
            "memfit.spec.hf_versions)"
        )
    if bad:
        raise NotModelledError(
            f"the analytic engine does not model {', '.join(bad)} yet; use --engine trace",
            engine="analytic",
        )
    check_tp(config, wl, engine="analytic")
    if wl.tp > 1:
        config = per_rank_config(config, wl.tp)
    arch = _arch(config)
    task = resolve_task(config, wl.task)
    check_positions(config, wl, task)
    check_freeze_depth(wl, arch.n_layers)
    check_generation(wl, task)
    if wl.compile:
        _check_compile(arch, wl)
    try:
        prog = program_for(arch, task, lora_rank=wl.lora_rank if wl.is_train else None)
    except SpecError as exc:  # every refusal of program_for is a family/task/technique it lacks
        raise NotModelledError(str(exc), engine="analytic") from None
    return prog, task


def _check_compile(arch: Arch, wl: WorkloadSpec) -> None:
    """``--compile`` where its saved set is measured (``compile.compile_problem``); the ratio
    assumes the query width is the hidden width (what the fit's basis spans)."""
    raise_if_not_modelled(arch.model_type, wl, moe=arch.n_experts > 0, engine="analytic")
    if wl.checkpointing in UNCHANGED_POLICIES:
        return
    if wl.tp > 1:
        raise NotModelledError(
            f"compile with tp {wl.tp}: the analytic engine runs tensor parallelism as a narrower "
            "layer, whose compiled saved set is not measured; add --sp (the per-rank closed "
            "form), use --checkpointing full, or drop --compile",
            engine="analytic",
        )
    if arch.q_dim != arch.hidden:
        raise NotModelledError(
            f"compile with heads x head_dim ({arch.q_dim}) != hidden_size ({arch.hidden}): "
            "torch.compile's saved set was measured on layers whose query width is the hidden "
            "width; use --checkpointing full or drop --compile",
            engine="analytic",
        )


def _arch(config: dict[str, Any]) -> Arch:
    try:
        return read_arch(config)
    except SpecError as exc:
        if str(config.get("model_type", "")) in FAMILY_OF:
            raise
        raise NotModelledError(str(exc), engine="analytic") from None


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


def _result(
    sim: Simulated,
    wl: WorkloadSpec,
    *,
    name: str,
    task: str,
    started: float,
    end: str = "mid",
    job: str | None = None,
) -> EngineResult:
    assert COMPONENTS.index("temporary") == TEMP
    paged = int(sim.info.get("paged_bytes", 0))
    phases: dict[str, PhaseResult] = {}
    for phase, pts in sim.candidates.items():
        best: Vec = max(pts, key=sum)
        comps = {c: int(best[i]) for i, c in enumerate(COMPONENTS)}
        phases[phase] = PhaseResult(components=comps, unified_bytes=paged)
    # an inference job's parameters, KV cache and the rest at its phases' peaks: its reserved
    # rule takes each apart (reserved.INFER_RESERVED)
    parts = None if wl.is_train else InferParts.of({k: p.components for k, p in phases.items()})
    if parts is not None and sim.info.get(REPLAYED_KEY):  # routed experts (replay.py)
        parts = replace(parts, replayed_bytes=int(sim.info[REPLAYED_KEY]))
    # segments a later step takes again beyond the ratio: FSDP2's root buffers
    # (distributed.fsdp_stranded_bytes), a reduction staging block (Whisper's
    # WhisperStep.staging_stranded_bytes)
    fsdp_stranded = int(sim.info.get("fsdp_stranded_bytes", 0))
    staging_stranded = int(sim.info.get("staging_stranded_bytes", 0))
    stranded = fsdp_stranded + staging_stranded
    reserved = reserved_rule(
        training=wl.is_train, end=end, job=job, infer=parts, stranded_bytes=stranded
    )
    assert reserved.ratio is not None
    band = class_band(job) if end == "band" else None
    if band is not None:
        reserved_note = f"reserved bytes at the top of the band of {band.describe()}"
    elif reserved.held_bytes:  # inference (reserved.INFER_RESERVED)
        fit = INFER_RESERVED["shown" if end == "mid" else "top"]
        reserved_note = (
            f"reserved bytes are {describe_infer(fit)} (a fit to measured serving-size "
            "inference: the trace's allocator replay and an H200; the KV cache grows by "
            "torch.cat each decode step; one 20 MiB large-pool and one 2 MiB small-pool segment)"
        )
        if parts is not None and _replay_sets(parts, fit, end):
            reserved_note += (
                f"; at least the parameters' and the caching allocator's replay of the "
                f"prefill's own allocation order ({format_bytes(parts.replayed_bytes)}: routed "
                "experts' tensors in fresh segments, analytic/replay.py)"
            )
    else:
        which = "a fit to" if end == "mid" else "the top of the measured range of"
        reserved_note = (
            f"reserved bytes are allocated x {reserved.ratio[0]:.3f} ({which} the trace's "
            "allocator replay)"
        )
        if reserved.floor_bytes:  # inference: the allocator's smallest segments
            plus = "" if end == "mid" else f" + {format_bytes(reserved.fixed_bytes[0])}"
            reserved_note = reserved_note.replace(" (", f"{plus} (", 1) + (
                f", at least {format_bytes(reserved.floor_bytes)} (one 20 MiB large-pool and one "
                "2 MiB small-pool segment)"
            )
    if fsdp_stranded and wl.is_train:  # FSDP2's root buffers (distributed.fsdp_stranded_bytes)
        reserved_note += (
            f", + {format_bytes(fsdp_stranded)}: the segments the caching allocator takes again "
            "for FSDP2's root-group all-gather output and fp32 reduce-scatter input"
        )
    if staging_stranded and wl.is_train:  # Whisper: WhisperStep.staging_stranded_bytes
        reserved_note += (
            f", + {format_bytes(staging_stranded)}: the segment a later step takes again for "
            "the backward's largest CUDA reduction staging block (a bias gradient summed over "
            "every encoder frame)"
        )
    return EngineResult(
        engine="analytic",
        model_name=name,
        n_params=sim.n_params,
        n_trainable_params=sim.n_trainable,
        phases=phases,
        reserved=reserved,
        environment={
            "python": platform.python_version(),
            "models": f"transformers {WRITTEN_AGAINST['transformers']} code",
        },
        host_memory_bytes=int(sim.info.get("host_bytes", 0)),
        trace={
            "analytic": {
                "task": task,
                "wall_s": round(time.perf_counter() - started, 6),
                **sim.info,
            },
            **(
                {
                    "reserved_band": _band_note(
                        band,
                        reserved.ratio,
                        reserved.fixed_bytes[1],
                        extra=_band_extra(wl, fsdp_stranded, staging_stranded),
                    )
                }
                if end == "band"
                else {}
            ),
        },
        notes=[
            f"{DESCRIPTION_START} of what transformers {WRITTEN_AGAINST['transformers']}"
            f" / torch {WRITTEN_AGAINST['torch']} allocate per "
            f"layer, calibrated against the trace engine (docs/accuracy.md); {reserved_note}"
        ]
        + list(version_notes())
        + sharding.layout_notes(wl)
        + sim.notes,
    )


def _band_note(
    band: ClassBand | None,
    ratio: tuple[float, float, float],
    top_bytes: int = 0,
    *,
    extra: str = "fixed segments",
) -> str:
    """Which reserved band an estimate at ``end="band"`` took (the estimate's
    ``trace["reserved_band"]``: the plan and the confirmation say it). ``top_bytes``: what the
    top adds to the ratio (inference: the allocator's smallest segments); ``extra``: what the
    bytes over the band's own fixed part are (FSDP2's root buffers for an FSDP2 training job,
    the weights' and cache's own ratios for inference)."""
    if band is not None:
        more = top_bytes - band.fixed_bytes
        return band.describe() + (f" + {format_bytes(more)} ({extra})" if more else "")
    plus = f" + {format_bytes(top_bytes)}" if top_bytes else ""
    return f"the wide band of every job (reserved <= allocated x {ratio[2]:.3f}{plus})"


def _band_extra(wl: Any, fsdp_stranded: int, staging_stranded: int = 0) -> str:
    """What a reserved rule's top adds over its band's fixed part, in words: FSDP2's root buffers
    (an FSDP2 training job), a reduction staging block's second segment (Whisper training), the
    weights' and KV cache's own segments (inference)."""
    if not wl.is_train:
        return "the weights' and the KV cache's own segments"
    if fsdp_stranded:
        return "FSDP2's root buffers"
    return "a reduction staging block's second segment" if staging_stranded else "fixed segments"
