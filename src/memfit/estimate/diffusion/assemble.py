"""A pipeline estimate assembled from its components' records (torch-free).

An estimate reads three things of each component: its facts (parameter count, fp32 modules),
its weight layout under the job's weight format, and the record of its forward (activation peak,
output bytes, the allocation events the allocator replay needs, the cuDNN allowance). Where they
come from is a :class:`Source`: the trace engine builds and traces the components
(``pipelines.TraceSource``, torch and diffusers); the derived engine reads forms derived from
those traces and shipped with memfit (:mod:`memfit.estimate.diffusion.derived`, no torch). The
composition below is the same code for both, so a derived answer differs from the traced one
only where a record does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from memfit.estimate.diffusion.answer import ComponentTrace, PipelineEstimate
from memfit.estimate.diffusion.compose import compose, replay_reserved
from memfit.estimate.diffusion.versions import behaviour
from memfit.estimate.diffusion.weights import WeightLayout, quantized_components
from memfit.spec.diffusion import BACKEND, DiffusionJob

Event = tuple[str, int, int]
#: the pipeline dtype names as ``str(torch.dtype)`` spells them (the layout keys hold that text)
TORCH_NAMES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


@dataclass(frozen=True, kw_only=True)
class ComponentFacts:
    """A built component's facts the composition reads (none depends on its dtype)."""

    #: ``sum(p.numel() for p in model.parameters())``
    n_params: int
    #: the class's ``_keep_in_fp32_modules`` (what quantizers leave unconverted)
    keep_in_fp32: tuple[str, ...]
    #: ``type(model).__name__`` and whether it has ``set_attention_slice``
    type_name: str
    has_attention_slice: bool


class Source(Protocol):
    """Where a component's facts, layouts and forward records come from."""

    def facts(self, comp: str) -> ComponentFacts: ...

    def layout(self, comp: str, legacy: bool, options: dict[str, Any],
               lay_args: dict[str, Any]) -> WeightLayout: ...  # fmt: skip

    def trace(self, comp: str, legacy: bool) -> tuple[int, int, list[Event], int]: ...


def switches(comp: str, job: DiffusionJob) -> list[bool]:
    """The pipeline switches that change ``comp``'s traced code (a layout's key has them)."""
    if comp == "vae":
        return [job.vae_slicing, job.vae_tiling]
    return [job.attention_slicing] if comp in ("unet", "transformer") else []


def attention_sliced(comp: str, job: DiffusionJob) -> bool:
    return job.attention_slicing and comp in ("unet", "transformer")


def _prepare_notes(comp: str, job: DiffusionJob, facts: ComponentFacts) -> list[str]:
    """What the attention-slicing switch does to ``comp``, said in the notes."""
    if not attention_sliced(comp, job):
        return []
    if facts.has_attention_slice:
        return [f"attention slicing: {comp}.set_attention_slice('auto')"]
    return [f"attention slicing: {facts.type_name} has no set_attention_slice (no effect)"]


def assemble(
    index: dict[str, Any],
    configs: dict[str, Any],
    job: DiffusionJob,
    *,
    name: str,
    gpu: Any,
    stages: dict[str, str],
    dtype_of: dict[str, str],
    recipe_notes: list[str],
    source: Source,
) -> PipelineEstimate:
    """The estimate of one call: ``stages`` (component -> stage, in call order) and ``dtype_of``
    (component -> pipeline dtype name) from the pipeline's recipe; every record from ``source``."""
    pipeline = str(index["_class_name"])
    dt = dtype_of[next(c for c in stages if c != "vae")]
    facts = {c: source.facts(c) for c in stages}
    denoiser = "transformer" if "transformer" in stages else "unet"
    sizes = {c: f.n_params for c, f in facts.items()}
    quants = quantized_components(configs, denoiser, sizes, job)
    beh = behaviour(job.transformers_version, job.bitsandbytes_version)
    notes: list[str] = list(recipe_notes)
    #: bitsandbytes 8-bit components diffusers gives no offload hook (they stay on the device)
    pinned = frozenset(
        c for c, f in quants.items() if f == "int8" and not beh.bnb_8bit_offload_hooks
    )
    if pinned and job.offload == "model":
        notes.append(
            f"{', '.join(sorted(pinned))}: bitsandbytes 8-bit, no offload hook under transformers "
            f"{beh.transformers} / bitsandbytes {beh.bitsandbytes}: stays on the device"
        )
    traces: dict[str, ComponentTrace] = {}
    tensor_allocs: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {}
    forward_events: dict[str, list[Event]] = {}
    for comp in stages:
        notes += _prepare_notes(comp, job, facts[comp])
        fmt = quants.get(comp, "none")
        lw = job.layerwise_casting if comp == denoiser else None
        keep = facts[comp].keep_in_fp32
        legacy = (
            BACKEND.get(fmt) == "bitsandbytes"
            and index[comp][0] == "transformers"
            and beh.bnb_keeps_fp32_modules_in_fp32
            and bool(keep)
        )
        if legacy:
            notes.append(
                f"{comp}: transformers {beh.transformers} keeps "
                f"{', '.join(keep)} in fp32 under bitsandbytes"
            )
        lay_args: dict[str, Any] = {
            "quant": fmt,
            "layerwise": lw,
            "compute_dtype": TORCH_NAMES[dt],
            "num_blocks_per_group": job.num_blocks_per_group,
            "not_converted": keep if fmt != "none" else (),
        }
        options = {**lay_args, "dtype": TORCH_NAMES[dtype_of[comp]],
                   "switches": switches(comp, job),
                   "fp32_modules": list(keep) if legacy else []}  # fmt: skip
        lay = source.layout(comp, legacy, options, lay_args)
        if fmt != "none":
            notes.append(f"{comp}: linear weights in {fmt} ({BACKEND.get(fmt, 'GGUF')})")
        if lw:
            notes.append(f"{comp}: enable_layerwise_casting(storage {lw}, compute {job.precision})")
        act, out, forward_events[comp], workspace = source.trace(comp, legacy)
        traces[comp] = ComponentTrace(
            name=comp,
            class_name=index[comp][1],
            weights_bytes=lay.weights_bytes,
            largest_leaf_bytes=lay.largest_leaf_bytes,
            activation_peak_bytes=act + lay.transient_bytes,
            output_bytes=out,
            storage=lay.storage,
            transient_bytes=lay.transient_bytes,
            conv_workspace_bytes=workspace,
            group_resident_bytes=lay.group_resident_bytes(job.offload_type, job.use_stream),
            dtype=dtype_of[comp],
        )
        tensor_allocs[comp] = lay.tensor_allocs
    calls = list(stages)
    if pipeline in ("StableDiffusion3Pipeline", "WanPipeline"):
        # encode_prompt: the encoders for the prompt, then again for the negative prompt (CFG)
        encoders = [c for c in stages if stages[c] == "text_encode"]
        calls = [*encoders, *calls]
    replay = {"gpu": gpu, "calls": calls, "pinned": pinned}
    args = (job, list(stages), traces, tensor_allocs, forward_events, stages)
    loaded, reserved = replay_reserved(*args, **replay)  # type: ignore[arg-type]
    _, reserved_upper = replay_reserved(*args, **replay, conv_workspace=True)  # type: ignore[arg-type]
    est = compose(
        name,
        pipeline,
        job,
        traces,
        dict(stages),
        reserved_bytes=reserved,
        loaded_reserved_bytes=loaded,
        reserved_upper_bytes=reserved_upper,
        extra_notes=tuple(dict.fromkeys(notes)),
        calls=calls,
        pinned=pinned,
    )
    # THE verdict on the GPU asked (memfit.estimate.diffusion.device)
    return est if gpu is None else est.judge_on(gpu)


def root_name(root: Path) -> str:
    """The bundled pipeline directory's name (the shipped forms' file name)."""
    return root.resolve().name
