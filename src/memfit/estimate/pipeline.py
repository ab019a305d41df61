"""The pipeline around an engine's core: the checks before it runs, the estimate after (torch-free).

Every engine runs the same stages::

    prepare_workload(config, workload)         the checkpoint's quantization_config sets the
                                               weight format; --lora-targets q,v → module names
    check_gpu(workload, gpu)                   the GPU can run the job's number formats
    check_tp(config, workload, engine=…)       the tensor-parallel split
    check_positions(config, workload, task)    the sequence fits learned positions
    check_generation(workload, task)           new_tokens only from a model that generates
    check_freeze_depth(workload, n_layers)     (the engine knows its layer count)
    …the engine's own core…
    assemble(EngineResult(…), workload, gpu)   → MemoryEstimate

The checks raise a :class:`~memfit.errors.SpecError` whose message is the same whichever engine
runs (tests/estimate/test_pipeline.py holds both to it), or a
:class:`~memfit.errors.NotModelledError` where the engine has no route for the job (another may).
An engine's capability checks (what it does not model yet) are its own. Each engine still calls
the checks in its historical order (analytic: tp, positions, freeze depth, generation; trace:
generation, positions, tp, freeze depth), which decides which message a job breaking two rules
gets; docs/decisions.md says how one order (every problem at once) replaces them.

An engine returns an :class:`EngineResult` — its own numbers: per phase the live bytes by
component at the phase's peak, the owners of those bytes, how it knows the reserved bytes — and
:func:`assemble` adds what is the same for every engine: the cuBLAS workspaces, the peak phase,
the CUDA context (:mod:`memfit.estimate.device`), the fit verdict, the ranges
(:mod:`memfit.estimate.uncertainty`, in ``MemoryEstimate``) and the notes' order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import sharding
from memfit.estimate.device import allocator_workspaces, device_totals, fit_verdict
from memfit.estimate.quant import gpu_problems
from memfit.estimate.quant_experts import (
    EXPERTS_ONLY,
    experts_note,
    format_problems,
    has_routed_experts,
)
from memfit.estimate.result import COMPONENTS, MemoryEstimate, ModuleBytes, PhasePeak
from memfit.estimate.tasks import position_problems
from memfit.models.checkpoint_quant import CheckpointFormat, checkpoint_format
from memfit.models.lora_targets import resolve_lora_targets
from memfit.models.model_spec import ModelSpec
from memfit.spec import WorkloadSpec
from memfit.spec.hf_versions import peft_note, rule_note
from memfit.units import format_bytes

#: How many module owners the estimate lists.
N_TOP_MODULES = 10
#: Tasks that generate tokens (``new_tokens`` needs one).
GENERATIVE_TASKS = ("causal-lm", "seq2seq", "speech-seq2seq")


# ----------------------------------------------------------------------------- checks before
def prepare_workload(
    config: dict[str, Any], workload: WorkloadSpec
) -> tuple[WorkloadSpec, list[str]]:
    """The workload as the model runs it, and notes saying what changed (one workload of
    :func:`prepare_workloads`)."""
    return prepare_workloads(config, [workload])[0]


def prepare_workloads(
    config: dict[str, Any], workloads: Sequence[WorkloadSpec]
) -> list[tuple[WorkloadSpec, list[str]]]:
    """Each workload as the model runs it, with notes saying what changed: the checkpoint's own
    weight format (:func:`checkpoint_quant`), LoRA roles as module names (:func:`lora_by_role`).
    The checkpoint's format is read once for all of them."""
    found = checkpoint_format(ModelSpec.of(config).quantization)
    out = []
    for w in workloads:
        if w.num_beams > 1 or w.cache_implementation != "dynamic":
            raise NotModelledError(
                f"num_beams ({w.num_beams}) / cache_implementation ({w.cache_implementation!r}) "
                "are modelled by `memfit estimate` (memfit.estimate.generation), not on this "
                "path yet: estimate the job with `memfit estimate`",
                engine="both",
            )
        w, quant_notes = checkpoint_quant(found, w)
        quant_notes += experts_quant(config, w)
        w, lora_notes = lora_by_role(config, w)
        versions = [
            rule_note(w.transformers_version, config.get("model_type")) if w.is_train else None,
            peft_note(w.peft_version) if w.is_train and w.lora_rank is not None else None,
        ]
        out.append((w, quant_notes + lora_notes + [n for n in versions if n]))
    return out


def checkpoint_quant(
    found: CheckpointFormat | None, workload: WorkloadSpec
) -> tuple[WorkloadSpec, list[str]]:
    """A pre-quantized checkpoint (``found``: its ``quantization_config``'s format, from
    :mod:`memfit.models.checkpoint_quant`) stores its weights in that format unless ``--quant``
    names another."""
    if found is None:
        return workload, []
    if workload.quant != "none":
        return workload, [
            f"--quant {workload.quant} overrides the checkpoint's quantization_config "
            f"({found.described})"
        ]
    if found.quant is None:
        return workload, [found.why or ""]
    if found.quant in EXPERTS_ONLY and workload.is_train:
        return workload, [
            f"the checkpoint's quantization_config ({found.described}) is dequantized to the "
            "model's dtype for training (Mxfp4Config(dequantize=True): its kernels have no "
            "backward)"
        ]
    changes: dict[str, Any] = {"quant": found.quant, "quant_experts": found.experts}
    flags = f"--quant {found.quant}"
    if found.group_size is not None:
        changes["quant_group_size"] = found.group_size
        flags += f" --group-size {found.group_size}"
    try:
        prepared = dataclasses.replace(workload, **changes)
    except SpecError as exc:
        raise SpecError(
            f"the checkpoint is quantized (quantization_config: {found.described}): {exc}"
        ) from None
    note = f"the checkpoint's quantization_config ({found.described}) sets {flags}; pass --quant"
    return prepared, [note + " to cost another format"]


def experts_quant(config: dict[str, Any], workload: WorkloadSpec) -> list[str]:
    """How a MoE model's routed experts are stored under the workload's format (a note), or a
    SpecError where transformers cannot load the format into this model."""
    if workload.quant == "none":
        return []
    problems = format_problems(workload.quant, str(config.get("model_type") or ""))
    if problems:
        raise SpecError(problems[0])
    if not has_routed_experts(config):
        return []
    if not workload.quant_experts:
        return [
            "routed experts: dequantized to the model's dtype at load (transformers 5.23 "
            "CompressedTensorsDequantize: the fused 3-D experts hold no scales); the Linear "
            "layers keep the checkpoint's format"
        ]
    return [experts_note(workload.quant, training=workload.is_train)]


def lora_by_role(config: dict[str, Any], workload: WorkloadSpec) -> tuple[WorkloadSpec, list[str]]:
    """The workload with LoRA targets given by role (``q,v``, ``attention``, ``mlp``) named as
    the model's family names its modules (:mod:`memfit.models.lora_targets`), and the notes that
    say what the roles became; module names and ``all-linear`` pass through unchanged."""
    asked = workload.lora_targets
    if workload.lora_rank is None or not isinstance(asked, tuple):
        return workload, []
    model_type = str(config.get("model_type") or "")
    resolved = resolve_lora_targets(asked, model_type, config)
    notes = list(resolved.notes)
    if resolved.modules == asked:
        return workload, notes
    modules = resolved.modules if isinstance(resolved.modules, str) else ",".join(resolved.modules)
    notes.insert(0, f"LoRA targets {','.join(asked)} are {modules} in {model_type}")
    return dataclasses.replace(workload, lora_targets=resolved.modules), notes


def with_notes(est: MemoryEstimate, notes: list[str], *, first: bool = False) -> MemoryEstimate:
    """``est`` with ``notes`` after its own (``first``: before them)."""
    if not notes:
        return est
    return dataclasses.replace(est, notes=[*notes, *est.notes] if first else [*est.notes, *notes])


def check_gpu(workload: WorkloadSpec, gpu: Any) -> None:
    """Raise a SpecError when ``gpu`` cannot run the job's number formats (FP8 matmuls)."""
    if problems := gpu_problems(workload.quant, gpu):
        raise SpecError.from_problems(problems)


def check_tp(config: dict[str, Any], workload: WorkloadSpec, *, engine: str) -> None:
    """Raise for a tensor-parallel split of ``config`` (a config.json dict) that ``engine``
    cannot make (:class:`NotModelledError`: the model type is not a Llama-style decoder) or that
    does not divide the model's heads or MLP (SpecError)."""
    if workload.tp <= 1:
        return
    problems = sharding.tp_config_problems(config, workload.tp, engine=engine)
    if not problems:
        return
    if config.get("model_type") not in sharding.TP_MODEL_TYPES:  # no split of this layout
        raise NotModelledError(problems[0], engine=engine)
    raise SpecError.from_problems(problems)


def check_positions(config: dict[str, Any], workload: WorkloadSpec, task: str) -> None:
    """Raise a SpecError when the sequence (plus generated tokens) is longer than the model's
    learned positions (:func:`memfit.estimate.tasks.position_problems`)."""
    generative = not workload.is_train and task == "causal-lm"
    if problems := position_problems(
        config, workload.seq_len, workload.new_tokens, generative=generative
    ):
        raise SpecError.from_problems(problems)


def check_generation(workload: WorkloadSpec, task: str) -> None:
    """Raise a SpecError when inference asks for ``new_tokens`` from a model that does not
    generate (``task``: what ``workload.task`` means for the model, ``tasks.resolve_task``)."""
    if not workload.is_train and workload.new_tokens and task not in GENERATIVE_TASKS:
        raise SpecError(
            f"new_tokens ({workload.new_tokens}) needs a generative model but the task is "
            f"{task!r}; drop --new-tokens"
        )
    if workload.prefill_chunk_size is not None and task != "causal-lm":
        raise NotModelledError(
            f"prefill_chunk_size ({workload.prefill_chunk_size}) is modelled for decoder-only "
            f"causal LMs (generate()'s chunked prefill into a DynamicCache), not task {task!r}",
            engine="both",
        )


def check_freeze_depth(workload: WorkloadSpec, n_layers: int) -> None:
    """Raise a SpecError when ``freeze_layers`` exceeds the model's (first stack's) layers."""
    if workload.freeze_layers > n_layers:
        raise SpecError(
            f"freeze_layers ({workload.freeze_layers}) exceeds the model's {n_layers} layers"
        )


# ----------------------------------------------------------------------------- engine result
@dataclass(frozen=True, kw_only=True)
class PhaseResult:
    """One phase as an engine sees it: live bytes by component at the phase's peak (any of
    ``COMPONENTS``; absent ones are 0), without the process-lifetime cuBLAS workspaces
    (:func:`assemble` adds them), the owners of those bytes, and the paged (CUDA unified memory)
    optimizer-state bytes among them."""

    components: dict[str, int]
    modules: dict[str, int] = field(default_factory=dict)
    unified_bytes: int = 0

    def __post_init__(self) -> None:
        if unknown := sorted(set(self.components) - set(COMPONENTS)):
            raise ValueError(
                f"components {unknown} are not among {', '.join(COMPONENTS)}: an engine bug"
            )


@dataclass(frozen=True, kw_only=True)
class ReservedRule:
    """How an engine knows the allocator's peak reserved bytes: ``replayed_bytes`` (its allocation
    history replayed through the caching-allocator model, workspaces included; never taken below
    the peak allocated bytes), or ``ratio`` = (mid, low, high) times the peak allocated bytes, the
    low..high product its range (a closed form knows the peak, not the history).
    ``fixed_bytes``: (to the point, to the range's top) bytes added to a ratio rule's products
    (a job class's band: ``analytic/reserved.py``, ``band_rule``). ``floor_bytes``: the least a
    ratio rule's point and range bottom take (the allocator's smallest segments:
    ``analytic/reserved.py``, ``MIN_SEGMENTS_BYTES``). ``held_bytes``: bytes of the peak the
    ratio does not scale, counted once (an inference job's weights: allocated once, in blocks
    of their own sizes, never freed, so never fragmented: ``analytic/reserved.py``,
    ``INFER_RESERVED``); 0: the ratio scales the whole peak."""

    replayed_bytes: int | None = None
    ratio: tuple[float, float, float] | None = None
    fixed_bytes: tuple[int, int] = (0, 0)
    floor_bytes: int = 0
    held_bytes: int = 0

    def __post_init__(self) -> None:
        if (self.replayed_bytes is None) == (self.ratio is None):
            raise ValueError("ReservedRule takes exactly one of replayed_bytes and ratio")

    def at(self, peak_allocated_bytes: int) -> tuple[int, tuple[int, int] | None]:
        """(reserved bytes, their range or None) for a peak of ``peak_allocated_bytes``."""
        if self.ratio is None:
            return max(int(self.replayed_bytes or 0), peak_allocated_bytes), None
        mid, low, high = self.ratio
        at_point, at_top = self.fixed_bytes
        floor = self.floor_bytes
        held = min(max(self.held_bytes, 0), peak_allocated_bytes)
        scaled = peak_allocated_bytes - held
        top = held + int(scaled * high) + at_top
        rng = (min(max(held + int(scaled * low), floor), top), top)
        return min(max(held + int(scaled * mid) + at_point, floor), top), rng


@dataclass(frozen=True, kw_only=True)
class EngineResult:
    """An engine's own numbers for one job; :func:`assemble` makes the ``MemoryEstimate``.

    ``n_trainable_params`` as the engine counted them (reported as 0 for inference). ``trace``:
    the engine's diagnostics (``MemoryEstimate.trace``). ``notes``: the engine's, placed after the
    workload's warnings and before the device's. ``paged_note``: whether paged optimizer states
    get their explanatory note (the analytic engine does not add it yet)."""

    engine: str
    model_name: str
    n_params: int
    n_trainable_params: int
    phases: dict[str, PhaseResult]
    reserved: ReservedRule
    environment: dict[str, str]
    host_memory_bytes: int = 0
    attention_backends: dict[str, int] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    paged_note: bool = True

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError(f"the {self.engine} engine returned no phase: an engine bug")


# ----------------------------------------------------------------------------- assembly after
def assemble(result: EngineResult, workload: WorkloadSpec, gpu: Any) -> MemoryEstimate:
    """The estimate of ``result``: each phase's components plus the cuBLAS/cuBLASLt workspaces
    (allocator blocks held for the process's life, so counted in ``max_memory_allocated``,
    measured on an H200; under ``temporary``), the highest phase, the reserved bytes at it, what
    lives outside the allocator, and the verdict on ``gpu``."""
    training = workload.is_train
    workspaces = sum(allocator_workspaces(gpu, training=training))
    phases = {name: _peak(name, p, workspaces) for name, p in result.phases.items()}
    top = max(phases.values(), key=lambda p: p.peak_allocated_bytes)
    at_top = result.phases[top.phase]
    reserved, reserved_range = _reserved_at(result.reserved, top.peak_allocated_bytes, at_top)
    totals = device_totals(gpu, reserved_bytes=reserved, training=training)
    owners = [(n, b) for n, b in at_top.modules.items() if b > 0]
    owners = sorted(owners, key=lambda nb: -nb[1])[:N_TOP_MODULES]
    notes = [*workload.warnings(), *result.notes]
    if at_top.unified_bytes and result.paged_note:
        notes.append(paged_note(at_top.unified_bytes))
    return MemoryEstimate(
        model_name=result.model_name,
        n_params=result.n_params,
        n_trainable_params=result.n_trainable_params if training else 0,
        workload=workload.normalized(),
        engine=result.engine,
        environment=result.environment,
        peak_allocated_bytes=top.peak_allocated_bytes,
        peak_reserved_bytes=totals.reserved_bytes,
        cuda_context_bytes=totals.cuda_context_bytes,
        device_used_bytes=totals.device_used_bytes,
        peak_phase=top.phase,
        components=dict(top.components),
        phases=phases,
        top_modules=[ModuleBytes(name=n, n_bytes=b) for n, b in owners],
        fits=fit_verdict(gpu, totals.device_used_bytes),
        unified_memory_bytes=at_top.unified_bytes,
        host_memory_bytes=result.host_memory_bytes,
        ranges={} if reserved_range is None else {"peak_reserved_bytes": reserved_range},
        attention_backends=dict(result.attention_backends),
        trace=result.trace,
        notes=notes + totals.notes,
    )


def _reserved_at(
    rule: ReservedRule, peak_allocated_bytes: int, at_top: PhaseResult
) -> tuple[int, tuple[int, int] | None]:
    """Reserved bytes (and range) at the peak. A ratio rule scales what torch's caching allocator
    holds: paged optimizer states (bitsandbytes ``get_paged``: ``cudaMallocManaged`` through
    ``lib.cget_managed_ptr``, outside the caching allocator) are added as they are, not scaled
    by its rounding and fragmentation ratio."""
    paged = at_top.unified_bytes if rule.ratio is not None else 0
    reserved, rng = rule.at(peak_allocated_bytes - paged)
    if not paged:
        return reserved, rng
    return reserved + paged, None if rng is None else (rng[0] + paged, rng[1] + paged)


def _peak(name: str, phase: PhaseResult, workspaces: int) -> PhasePeak:
    comps = {c: int(phase.components.get(c, 0)) for c in COMPONENTS}
    comps["temporary"] += workspaces
    return PhasePeak(phase=name, peak_allocated_bytes=sum(comps.values()), components=comps)


def paged_note(unified_bytes: int) -> str:
    """What the estimate assumes about paged optimizer states (bitsandbytes' paged optimizers)."""

    return (
        f"{format_bytes(unified_bytes)} of the optimizer states are paged (bitsandbytes, CUDA "
        "unified memory): included in the device figures, where they sit while there is room; "
        "torch.cuda.max_memory_allocated() does not see them. The verdict leaves them out of "
        "what must stay on the GPU: when the rest needs the room the driver evicts them to host "
        "RAM (that much host RAM free) and pages them back for every optimizer step, slower "
        "steps (docs/decisions.md, 'Paged optimizer states in the verdict')"
    )


__all__ = [
    "EngineResult",
    "PhaseResult",
    "ReservedRule",
    "assemble",
    "check_freeze_depth",
    "check_generation",
    "check_gpu",
    "check_positions",
    "check_tp",
    "paged_note",
]
