"""A diffusion pipeline run composed from its components' traces: the stages' peaks per offload
mode (``max_memory_allocated``), and the caching allocator's peak (``max_memory_reserved``) from
replaying the whole run's allocations in order.

Offload modes, as diffusers 0.42.1 implements them:

* ``none``: every component's weights stay on the device (``pipe.to("cuda")``);
* ``model`` (``enable_model_cpu_offload``): accelerate's ``cpu_offload_with_hook`` chain moves
  the previous component out before the next one comes in: a stage holds its running component;
* ``sequential`` (``enable_sequential_cpu_offload``): one leaf module's weights at a time;
* ``group`` (``pipe.enable_group_offload``): each component's block- or leaf-level groups
  (diffusion_weights.WeightLayout.group_resident_bytes).

The replay allocates each weight tensor where the mode puts it on the device, then each stage's
forward events in order (the denoiser twice: the second step reuses the first one's cached
blocks), each dequantized-layer transient at its forward's peak, after the cuBLAS workspaces the
GPU keeps in the allocator (estimate/device.py). Offloaded groups are replayed as one block per
component; the prompt embeddings carried between stages (KiB to MiB) are left out of the replay.
"""

from __future__ import annotations

from typing import Any

from memfit.estimate.allocator.caching import CachingAllocatorSim
from memfit.estimate.device import allocator_workspaces
from memfit.estimate.diffusion.answer import ComponentTrace, PipelineEstimate, StagePeak
from memfit.spec.diffusion import DiffusionJob

STAGES = ("text_encode", "denoise", "vae_decode")
_WEIGHT_KEY = 2 * 10**15
_RESIDENT_KEY = 3 * 10**15
_TRANSIENT_KEY = 4 * 10**15
_WORKSPACE_KEY = 5 * 10**15


def resident_bytes(job: DiffusionJob, t: ComponentTrace, all_weights: int) -> int:
    if job.offload == "none":
        return all_weights
    if job.offload == "model":
        return t.weights_bytes
    if job.offload == "sequential":
        return t.largest_leaf_bytes
    return t.group_resident_bytes


def model_offload_walk(
    calls: list[str], chain: list[str], pinned: frozenset[str] = frozenset()
) -> list[tuple[str, frozenset[str]]]:
    """The components on the device during each call under ``enable_model_cpu_offload``.

    diffusers chains the components of ``model_cpu_offload_seq`` that the pipeline has with
    ``accelerate.cpu_offload_with_hook(model, device, prev_module_hook=hook)``; a hook's
    ``pre_forward`` offloads only its *predecessor in the chain* before moving its own module in
    (``accelerate/hooks.py: CpuOffload``). A component called again out of chain order (SD3 encodes
    the negative prompt with the three encoders after the positive one) therefore runs next to what
    is still on the device: the second CLIP-L call runs beside the T5 of the first pass. ``pinned``
    components have no hook (diffusion_versions.py: older bitsandbytes 8-bit): on the device
    throughout, outside the chain."""
    chain = [c for c in chain if c not in pinned]
    prev = {c: chain[i - 1] for i, c in enumerate(chain) if i}
    on: set[str] = set(pinned)
    walk = []
    for c in calls:
        on.discard(prev.get(c, ""))
        on.add(c)
        walk.append((c, frozenset(on)))
    return walk


def compose(
    name: str,
    pipeline: str,
    job: DiffusionJob,
    traces: dict[str, ComponentTrace],
    stage_of: dict[str, str],
    *,
    reserved_bytes: int | None = None,
    loaded_reserved_bytes: int | None = None,
    reserved_upper_bytes: int | None = None,
    extra_notes: tuple[str, ...] = (),
    calls: list[str] | None = None,
    pinned: frozenset[str] = frozenset(),
) -> PipelineEstimate:
    all_weights = sum(t.weights_bytes for t in traces.values())
    walk = model_offload_walk(calls or list(stage_of), list(stage_of), pinned)
    on_device = {
        c: max(sum(traces[r].weights_bytes for r in res) for cc, res in walk if cc == c)
        for c in stage_of
    }
    encoders = [c for c, s in stage_of.items() if s == "text_encode"]
    embeds = sum(traces[c].output_bytes for c in encoders)
    stages: list[StagePeak] = []
    for stage in STAGES:
        comps = [c for c, s in stage_of.items() if s == stage]
        peaks = []
        for i, c in enumerate(comps):
            t = traces[c]
            # earlier encoders' outputs stay alive while the next encoder runs
            carried = (
                sum(traces[p].output_bytes for p in comps[:i]) if stage == "text_encode" else embeds
            )
            peaks.append(
                StagePeak(
                    stage=stage,
                    components=(c,),
                    resident_weights_bytes=(
                        on_device[c]
                        if job.offload == "model"
                        else resident_bytes(job, t, all_weights)
                    ),
                    activation_peak_bytes=t.activation_peak_bytes,
                    carried_bytes=carried,
                )
            )
        best = max(peaks, key=lambda p: p.peak_bytes)
        stages.append(
            StagePeak(
                stage=stage,
                components=tuple(comps),
                resident_weights_bytes=best.resident_weights_bytes,
                activation_peak_bytes=best.activation_peak_bytes,
                carried_bytes=best.carried_bytes,
            )
        )
    host = 0
    if job.offload != "none":
        host = all_weights - sum(traces[c].weights_bytes for c in pinned if job.offload == "model")
    notes = [
        f"denoise: the peak of one of the {job.steps} steps (each step frees what the previous "
        "one made; steps do not add memory)",
        "peak allocated tensor bytes (torch.cuda.max_memory_allocated); peak_reserved_bytes "
        "replays them through the caching allocator; neither holds the CUDA context or cuDNN "
        "convolution workspaces (an allowance for those: conv_workspace_allowance_bytes, "
        "reported beside the --gpu verdict)",
    ]
    if job.offload != "none":
        how = f" ({job.offload_type}{', use_stream' if job.use_stream else ''})"
        notes.append(
            f"{job.offload} offload{how if job.offload == 'group' else ''}: all weights stay in "
            "host RAM between uses"
        )
    return PipelineEstimate(
        name=name,
        pipeline=pipeline,
        job=job,
        components=tuple(traces.values()),
        stages=tuple(stages),
        host_weights_bytes=host,
        notes=(*notes, *extra_notes),
        peak_reserved_bytes=reserved_bytes,
        loaded_reserved_bytes=loaded_reserved_bytes,
        peak_reserved_upper_bytes=reserved_upper_bytes,
    )


def _at_peak(events: list[tuple[str, int, int]], key: int, n_bytes: int) -> list[Any]:
    """``events`` with an ``n_bytes`` block allocated just before the allocation that reaches the
    forward's peak and freed just after it."""
    if n_bytes <= 0 or not events:
        return list(events)
    live: dict[int, int] = {}
    cur = best = 0
    at = 0
    for i, (kind, k, n) in enumerate(events):
        if kind == "a":
            live[k] = n
            cur += n
            if cur > best:
                best, at = cur, i
        else:
            cur -= live.pop(k, 0)
    return [*events[:at], ("a", key, n_bytes), events[at], ("f", key, 0), *events[at + 1 :]]


def replay_reserved(
    job: DiffusionJob,
    order: list[str],
    traces: dict[str, ComponentTrace],
    tensor_allocs: dict[str, tuple[tuple[int, tuple[int, ...]], ...]],
    forward_events: dict[str, list[tuple[str, int, int]]],
    stage_of: dict[str, str],
    gpu: Any = None,
    calls: list[str] | None = None,
    pinned: frozenset[str] = frozenset(),
    conv_workspace: bool = False,
) -> tuple[int, int]:
    """(peak reserved bytes after loading, peak reserved bytes of the whole run): see the module
    docstring. ``conv_workspace``: each forward also allocates its cuDNN workspace allowance at
    its peak (the upper figure the ``--gpu`` verdict uses). Under model offload,
    accelerate's ``CpuOffload.pre_forward`` offloads the previous component and calls
    ``clear_device_cache()`` (``torch.cuda.empty_cache``) before moving the next one in."""
    sim = CachingAllocatorSim()
    for i, n in enumerate(allocator_workspaces(gpu, training=False)):
        sim.malloc(-1 - i, n)

    def weights(ci: int, c: str, alloc: bool, *, quantize: bool = False) -> None:
        base = _WEIGHT_KEY + ci * 10**9
        for j, (load, stored) in enumerate(tensor_allocs[c]):
            keys = [base + j * 8 + p for p in range(len(stored))]
            if not alloc:
                for k in keys:
                    sim.free(k)
                continue
            if quantize and load:
                sim.malloc(_TRANSIENT_KEY - 1, load)
            for k, n in zip(keys, stored, strict=True):
                sim.malloc(k, n)
            if quantize and load:
                sim.free(_TRANSIENT_KEY - 1)

    # from_pretrained: bitsandbytes components are quantized on the device while they load;
    # pipe.to("cuda") then moves the others (offload modes: enable_*_offload moves every
    # component to the CPU first and empties the cache)
    on_device = [ci for ci, c in enumerate(order) if any(ld for ld, _ in tensor_allocs[c])]
    for ci in on_device:
        weights(ci, order[ci], True, quantize=True)
    if job.offload == "none":
        for ci, c in enumerate(order):
            if ci not in on_device:
                weights(ci, c, True)
    else:
        for ci in on_device:
            if order[ci] not in pinned or job.offload != "model":
                weights(ci, order[ci], False)
        sim.empty_cache()
    loaded = sim.result().peak_reserved_bytes
    on: set[str] = set(pinned)
    walk = model_offload_walk(calls or list(order), list(order), pinned)
    for call, (c, res) in enumerate(walk):
        ci = order.index(c)
        t = traces[c]
        if job.offload == "model":
            for gone in on - res:
                weights(order.index(gone), gone, False)
                sim.empty_cache()
            for new in res - on:
                weights(order.index(new), new, True)
            on = set(res)
        elif job.offload in ("sequential", "group"):
            sim.malloc(_RESIDENT_KEY + ci, resident_bytes(job, t, 0))
        fwd = _at_peak(forward_events[c], _TRANSIENT_KEY + ci, t.transient_bytes)
        if conv_workspace:  # the cuDNN allowance (diffusion_workspace.py) at the forward's peak
            fwd = _at_peak(fwd, _WORKSPACE_KEY + ci, t.conv_workspace_bytes)
        for rep in range(2 if stage_of[c] == "denoise" else 1):
            base = (call * 4 + rep + 1) * 10**12
            for kind, k, n in fwd:
                sim.malloc(k + base, n) if kind == "a" else sim.free(k + base)
        if job.offload in ("sequential", "group"):
            sim.free(_RESIDENT_KEY + ci)
    return loaded, sim.result().peak_reserved_bytes
