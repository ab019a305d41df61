"""The trace engine: run the job on fake tensors, count every byte, extrapolate over layers.

A model with L identical blocks is not traced block by block. memfit traces the model with a few
blocks — a base count ``b`` (two periods ``p`` of the layer pattern), ``b + p`` for each repeated
stack, and ``b + 2p`` on the first stack as a check — and extrapolates every quantity linearly in
the block counts: each phase's peak and its components, the peak's owners, the simulated reserved
memory, the parameter counts. Within a phase the peak of a stack of identical blocks is an affine
function of the block count as long as it happens at the same relative point of the step, which the
check trace verifies (``trace["extrapolation_check_error"]``; a test compares with full traces).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import platform
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from memfit.errors import MemfitError, NotModelledError, TraceError
from memfit.estimate import history
from memfit.estimate.device import allocator_workspaces
from memfit.estimate.pipeline import (
    EngineResult,
    assemble,
    check_gpu,
    check_positions,
    prepare_workload,
    with_notes,
)
from memfit.estimate.quant import FORMATS, unquantized_layers_note
from memfit.estimate.quant_experts import quantizes_experts
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace import (
    build,
    distributed,
    job,
    media_inputs,
    quantized,
    quantized_experts,
    rank_trace,
    refusals,
    step_memo,
    steps,
)
from memfit.estimate.trace.cuda_emulation import (
    SdpaRouter,
    cuda_autocast_policy,
    cuda_kernel_workspaces,
    fused_dropout,
    hf_treat_fake_as_real,
)
from memfit.estimate.trace.flat import Flat, extrapolated
from memfit.estimate.trace.flat import engine_result as flat_engine_result
from memfit.estimate.trace.tracker import StorageTracker
from memfit.spec import PRECISION_RULES, WorkloadSpec

#: Models with at most this many repeated blocks are traced block by block. Allocated bytes and
#: components extrapolate exactly from a few blocks, but reserved bytes depend on the whole
#: allocation history: extrapolated from 4-6 blocks they missed H200 measurements of Llama-3.2-1B by
#: -6 % to -15 %, traced in full by +0.6 % (docs/accuracy.md). A full trace of Llama-2-7B (32
#: layers) takes 3.7 s on a 2-core machine (benchmarks/results/trace_speed.md); deeper models
#: (70B-class, 80 layers) are extrapolated.
FULL_TRACE_MAX_LAYERS = 48
#: Relative mismatch above which the extrapolation check is reported in ``notes``.
EXTRAPOLATION_TOLERANCE = 0.001

#: Set by the derived engine (:mod:`memfit.estimate.derived.record`) while it records traces: an
#: object with ``new_tracker()`` (the tracker a run uses), ``on_run(counts, tracker, flat)``
#: after each run and ``on_result(engine_result)`` once per trace. None: plain tracing.
RUN_OBSERVER: contextvars.ContextVar[Any] = contextvars.ContextVar("RUN_OBSERVER", default=None)


def trace_hf(
    config: dict[str, Any],
    workload: WorkloadSpec,
    *,
    name: str,
    gpu: Any = None,
    trust_remote_code: bool = False,
    extrapolate: bool | None = None,
    execution: str = "fake",
    emulate_cuda: bool = True,
) -> MemoryEstimate:
    """Estimate a Hugging Face model's job from its config.json (a dict).

    ``execution="real"`` runs the same step on real CPU tensors under the same tracker, and
    ``emulate_cuda=False`` keeps CPU's own SDPA kernels: together they are how tests check that the
    fake trace counts exactly what real execution allocates.
    """
    started = time.perf_counter()
    run_job = job.prepare_job(config, workload, gpu, trust_remote_code)
    config, workload, task, stacks = run_job.config, run_job.workload, run_job.task, run_job.stacks
    targets, period, prefix = run_job.targets, run_job.period, run_job.prefix
    traced = run_job.traced  # ZeRO: one step for both Adam names

    def run(counts: dict[str, int]) -> Flat:
        return _trace_once(
            config, traced, task, stacks, counts, trust_remote_code, execution, emulate_cuda, gpu
        )

    if extrapolate is None:
        extrapolate = sum(targets.values()) > FULL_TRACE_MAX_LAYERS
    flat, check = (
        extrapolated(run, targets, period, prefix) if extrapolate else (run(targets), None)
    )
    notes = distributed.notes(workload) + quantized.notes(workload)
    if note := unquantized_layers_note(str(config.get("model_type", "")), workload.quant):
        notes.append(note)
    if check is not None:
        notes.append(
            "traced a few layers and extrapolated: allocated bytes are exact, reserved bytes are "
            "extrapolated too (fragmentation is less certain; --no-extrapolate traces every layer)"
        )
    if check is not None and check > EXTRAPOLATION_TOLERANCE:
        notes.append(f"layer extrapolation deviated by {check:.2%} on the check trace")
    trace_info = {
        "task": task,
        "layers": targets,
        "extrapolated": check is not None,
        "extrapolation_check_error": check,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    result = engine_result(flat, name=name, trace=trace_info, notes=notes)
    if (observer := RUN_OBSERVER.get()) is not None:
        observer.on_result(result)
    est = assemble(result, workload, gpu)
    return with_notes(est, run_job.notes)


def memoized(
    config: dict[str, Any],
    workload: WorkloadSpec,
    *,
    gpu: Any = None,
    trust_remote_code: bool = False,
) -> bool:
    """Whether ``trace_hf(config, workload, extrapolate=False)`` would take its run from the
    step memo (:mod:`memfit.estimate.trace.step_memo`: a rank variant of a step traced
    before), running no fake step; False where the job is invalid (the trace reports it)."""
    try:
        j = job.prepare_job(config, workload, gpu, trust_remote_code)
        cfg, wl = job.run_config(j.config, j.traced, j.stacks, j.targets, trust_remote_code)
    except MemfitError:
        return False
    if wl.shard == "fsdp":  # FSDP2 runs for real, never from the memo (as _trace_run)
        return False
    for cast_pixels in (False, True):
        k = step_memo.run_key(
            cfg, wl, j.task, j.targets, trust_remote_code, gpu=gpu, cast_pixels=cast_pixels
        )
        entry = step_memo.get(k, touch=False)
        if entry is None or not entry.uncast:
            return entry is not None
    return False


def trace_step_events(
    config: dict[str, Any],
    workload: WorkloadSpec,
    *,
    gpu: Any = None,
    trust_remote_code: bool = False,
    n_steps: int = 3,
) -> tuple[list[tuple[str, int, int]], list[tuple[str, int]]]:
    """The allocation events of ``n_steps`` training steps of one shape, every layer traced, and
    the tracker's phase marks ``(phase, index of the next event)``: the input of
    :mod:`memfit.estimate.seqrun.replay` (variable-length runs)."""
    workload, _ = prepare_workload(config, workload)
    job.reject_unsupported(workload)
    check_gpu(workload, gpu)
    task = build.resolve_task(config, workload.task)
    check_positions(config, workload, task)
    stacks = build.layer_plan(config, trust_remote_code)
    counts = {v.name: v.count for v in stacks}
    if workload.freeze_layers:
        counts["frozen"] = workload.freeze_layers
        counts[stacks[0].name] -= workload.freeze_layers
    sink: list[Any] = []
    _trace_once(
        config,
        workload,
        task,
        stacks,
        counts,
        trust_remote_code,
        gpu=gpu,
        n_steps=n_steps,
        sink=sink,
    )
    return sink[0], sink[1]


class _UncastPixels(Exception):
    """The model does not cast the processor's fp32 pixels to its weights' dtype."""


def _trace_once(*args: Any, **kwargs: Any) -> Flat:
    """One traced run; an image model that does not cast fp32 pixels itself is run again with
    them in its weights' dtype (what its user must pass: media_inputs.uncast_pixels_error)."""
    try:
        return _trace_run(*args, **kwargs)
    except _UncastPixels:
        return _trace_run(*args, **{**kwargs, "cast_pixels": True})


def _trace_run(
    config: dict[str, Any],
    workload: WorkloadSpec,
    task: str,
    stacks: list[build.LayerVar],
    counts: dict[str, int],
    trust_remote_code: bool,
    execution: str = "fake",
    emulate_cuda: bool = True,
    gpu: Any = None,
    n_steps: int = 2,
    sink: list[Any] | None = None,
    cast_pixels: bool = False,
) -> Flat:
    from torch._subclasses.fake_tensor import FakeTensorMode

    full_cfg, wl = job.run_config(config, workload, stacks, counts, trust_remote_code)
    plan = distributed.plan_for(wl, full_cfg)  # None for one plain GPU; else rank 0's view
    if plan is not None and wl.optimizer_in_bwd:
        raise NotModelledError(
            "optimizer_in_bwd is modelled on one GPU without sharding or offload: use "
            "--gpus 1 --shard none, or drop --optimizer-in-bwd",
            engine="trace",
        )
    refused = refusals.refusal(wl)
    if refused is not None:
        raise refused
    cfg = full_cfg if plan is None else plan.config
    observer = RUN_OBSERVER.get()
    memo_key = None
    if plan is not None and wl.shard != "fsdp" and execution == "fake" and sink is None:
        memo_key = step_memo.run_key(
            full_cfg, wl, task, counts, trust_remote_code, gpu=gpu, emulate_cuda=emulate_cuda,
            n_steps=n_steps, cast_pixels=cast_pixels,
        )  # fmt: skip
        if (entry := step_memo.get(memo_key)) is not None and not history.is_recording():
            if entry.uncast:
                raise _UncastPixels
            return _rank_from_memo(plan, entry, counts, wl, gpu, observer)
    real = execution == "real"
    device = "cpu" if real else "meta"
    if real:
        torch.manual_seed(0)
    model = build.build_hf_model(cfg, wl, task, trust_remote_code=trust_remote_code, device=device)
    to_quantize = quantized.linears_to_quantize(model, wl.quant) if wl.quant in FORMATS else []
    if wl.is_train and wl.lora_rank:
        model = build.apply_lora_(model, wl, device=device)
    if to_quantize:  # after peft: LoRA wraps the Linear, the stand-in replaces its base layer
        quantized.quantize_(model, to_quantize, wl, device=device)
    if quantizes_experts(wl.quant) and wl.quant_experts:
        quantized_experts.quantize_experts_(model, wl, device=device, gpu=gpu)
    if wl.prepare_kbit and wl.is_train:
        quantized.prepare_kbit_(model, wl.quant)
    fake: Any = contextlib.nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True)
    if not real:
        build.meta_to_fake_(model, fake)
    tracker: StorageTracker
    if plan is not None:
        tracker = plan.tracker
    elif observer is not None:
        tracker = observer.new_tracker()
    else:
        tracker = StorageTracker(device_type="cpu")
    with fake, cuda_emulation_for(wl, emulate_cuda, gpu=gpu) as router:
        inputs = steps.example_inputs(cfg, wl, task, cast_pixels=cast_pixels)
        if plan is not None:
            plan.wrap_(model)
        with tracker:
            steps.label_model_state(tracker, model)
            tracker.label(
                [v for v in inputs.values() if isinstance(v, torch.Tensor)], "activations"
            )
            tracker.watch_modules(model)
            paged: set[int] = set()
            try:
                if wl.is_train:
                    paged = steps.run_train_steps(model, inputs, wl, tracker, n_steps=n_steps)
                else:
                    steps.run_inference(model, inputs, wl, task, tracker)
            except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
                if not cast_pixels and media_inputs.uncast_pixels_error(exc, task):
                    step_memo.put(memo_key, step_memo.Entry(uncast=True))
                    raise _UncastPixels from exc
                raise TraceError(
                    f"could not run {type(model).__name__} on fake tensors: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                ) from exc
    n_params = sum(p.numel() for p in model.parameters()) + quantized.n_quantized_params(model)
    n_params += quantized_experts.n_quantized_expert_params(model)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flat = flatten_trace(tracker, n_params, n_trainable, router, paged)
    events = tracker.events or []
    if plan is not None:
        trace = rank_trace.snapshot(plan.tracker, model)  # before the model dies (its frees)
        full = None
        if wl.tp > 1:  # the un-split model's parameter counts
            full = distributed.full_param_counts(
                build.build_hf_model(full_cfg, wl, task, device="meta")
            )
        step_memo.put(memo_key, step_memo.Entry(trace=trace, flat=dict(flat), full_counts=full))
        events = plan.finish(flat, trace, full)
    # --snapshot: the history as replayed below (a no-op unless a recording is active)
    history.keep(events, tracker, allocator_workspaces(gpu, training=wl.is_train))
    if sink is not None:  # trace_step_events: the raw events and where each phase began
        sink.extend([events, list(tracker.phase_marks)])
    flat["reserved"] = replay_reserved(events, gpu, wl.is_train)
    if observer is not None:
        observer.on_run(counts, tracker, flat)
    return flat


def _rank_from_memo(
    plan: distributed.Plan,
    entry: step_memo.Entry,
    counts: dict[str, int],
    wl: WorkloadSpec,
    gpu: Any,
    observer: Any,
) -> Flat:
    """A rank variant's run from a step traced before: its rewrite, replay and observer call,
    as :func:`_trace_run` makes them after the step."""
    assert entry.trace is not None  # an uncast entry raised before
    flat = dict(entry.flat)
    events = plan.finish(flat, entry.trace, entry.full_counts)
    flat["reserved"] = replay_reserved(events, gpu, wl.is_train)
    if observer is not None:
        observer.on_run(counts, plan.tracker, flat)
    return flat


def replay_reserved(events: list[tuple[str, int, int]], gpu: Any, training: bool) -> int:
    """Peak reserved bytes: the trace's allocations replayed through the caching-allocator model,
    after the cuBLAS/cuBLASLt workspaces the GPU's first matmuls allocate (never freed)."""
    from memfit.estimate.allocator.caching import simulate

    sizes = allocator_workspaces(gpu, training=training)
    workspaces = [("a", -1 - i, n) for i, n in enumerate(sizes)]
    return simulate(workspaces + events).peak_reserved_bytes


@contextlib.contextmanager
def cuda_emulation_for(
    workload: WorkloadSpec, cuda_kernels: bool = True, *, gpu: Any = None
) -> Iterator[SdpaRouter | None]:
    """Enter the CUDA emulations the workload needs; yields the SDPA router (or None).
    ``gpu``: the device the kernels' workspaces are sized for (None: memfit's default GPU)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(hf_treat_fake_as_real())
        if PRECISION_RULES[workload.run_precision].autocast:
            stack.enter_context(cuda_autocast_policy())
        router = None
        if cuda_kernels:
            stack.enter_context(fused_dropout())
            stack.enter_context(cuda_kernel_workspaces(gpu))
            if workload.attention != "eager":
                mode = "flash" if workload.attention == "flash" else "auto"
                router = stack.enter_context(SdpaRouter(mode))
        yield router


def flatten_trace(
    tracker: StorageTracker,
    n_params: int,
    n_trainable: int,
    router: Any,
    paged: set[int] | frozenset[int] = frozenset(),
) -> Flat:
    """The trace as flat numbers; ``paged``: tracker keys of paged optimizer states, summed per
    phase peak under ``phase/<phase>/unified`` (they are part of ``optimizer_states`` too)."""
    flat: Flat = {"n_params": n_params, "n_trainable": n_trainable, "n_ops": tracker.n_ops}
    for phase, snap in tracker.phase_peaks.items():
        if phase in ("init", "end"):
            continue
        flat[f"phase/{phase}/peak"] = snap.total_bytes
        if paged:
            live = set(snap.keys) & paged
            flat[f"phase/{phase}/unified"] = sum(tracker.storages[k].n_bytes for k in live)
        for comp, n in tracker.breakdown(snap).items():
            flat[f"phase/{phase}/comp/{comp}"] = n
        for mod, n in tracker.by_module(snap).items():
            key = f"phase/{phase}/mod/{build.generic_module_name(mod)}"
            flat[key] = flat.get(key, 0) + n
    if router is not None:
        for backend, n in router.choices.items():
            flat[f"backend/{backend}"] = n
    return flat


def engine_result(
    flat: Flat, *, name: str, trace: dict[str, Any], notes: list[str]
) -> EngineResult:
    """The trace's numbers (:func:`flatten_trace`, extrapolated or not, ``reserved`` replayed)
    as the record :func:`memfit.estimate.pipeline.assemble` turns into the estimate."""
    return flat_engine_result(flat, name=name, trace=trace, notes=notes, environment=environment())


def environment() -> dict[str, str]:
    """Versions the trace ran with: what the estimate assumes about the user's stack."""
    env = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("transformers", "peft"):
        env[pkg] = _version(pkg)
    return env


def _version(pkg: str) -> str:
    """``pkg``'s version without importing it where it is not imported yet: importing peft
    for its version alone imports bitsandbytes and compiles its kernels' wrappers (about a
    second of a trace that uses no adapter; the trace's own peft import leaves bitsandbytes
    out, trace/peft_import.py). The installed distribution's version is the module's."""
    module = sys.modules.get(pkg)
    if module is not None:
        return str(getattr(module, "__version__", "unknown"))
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:  # importable without a distribution's metadata (a source tree on the path)
        return str(__import__(pkg).__version__)
    except ImportError:
        return "not installed"
