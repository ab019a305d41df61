"""Diffusion pipeline inference: each component built by diffusers/transformers from its config on
the meta device, its forward traced on fake tensors, the stages composed per offload mode.

A pipeline run is three stages, each one component (or two) at a time:

* ``text_encode``: the text encoders (FLUX: CLIP-L then T5-XXL; SDXL: two CLIPs);
* ``denoise``: the denoiser (transformer or UNet) called ``steps`` times. Each call frees what the
  previous one made, so the peak of one call is the stage's peak: steps do not add memory;
* ``vae_decode``: ``vae.decode`` of the final latents (with diffusers' own slicing/tiling code
  paths when asked: the traced code is diffusers', so a tiled decode is traced tile by tile).

On the device, a stage holds: the resident weights (``none``: every component; ``model``: only the
running component, as accelerate's ``cpu_offload_with_hook`` chain in
``DiffusionPipeline.enable_model_cpu_offload`` moves the previous one out before the next one
comes in; ``sequential``: one leaf module at a time, ``enable_sequential_cpu_offload``), plus the
traced activation peak of the stage's forward, plus the tensors carried between stages (prompt
embeddings live until the pipeline returns; latents). Offloaded weights are in host RAM.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from memfit.errors import NotModelledError, SpecError, TraceError
from memfit.estimate.diffusion.device import (
    device_bytes,
    fits_json,
)
from memfit.estimate.diffusion.diffusers_import import diffusers_module
from memfit.estimate.trace import build
from memfit.estimate.trace.engine import cuda_emulation_for
from memfit.estimate.trace.tracker import StorageTracker
from memfit.estimate.verdict import Verdict, judge_point
from memfit.hardware.overhead import device_overhead
from memfit.spec import WorkloadSpec
from memfit.spec.diffusion import DiffusionJob
from memfit.userfiles import read_json

#: The pipeline dtypes (memfit.spec.diffusion.PIPELINE_DTYPES) as torch's.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: The pipelines memfit composes, with their stages' components.
SUPPORTED = (
    "FluxPipeline",
    "StableDiffusionXLPipeline",
    "StableDiffusion3Pipeline",
    "PixArtSigmaPipeline",
    "WanPipeline",
)


@dataclass(frozen=True, kw_only=True)
class ComponentTrace:
    """One component's forward on fake tensors: weights, the largest leaf module's weights, the
    peak of what its forward allocated above the weights (inputs included)."""

    name: str
    class_name: str
    weights_bytes: int
    largest_leaf_bytes: int
    activation_peak_bytes: int
    output_bytes: int
    #: the weight format ("" for the component's dtype), the dequantized-layer transient included
    #: in ``activation_peak_bytes``, and the weights group offloading keeps on the device
    storage: str = ""
    transient_bytes: int = 0
    #: the dtype the component runs in (SDXL's VAE: fp32 under an fp16 run, ``force_upcast``)
    dtype: str = ""
    group_resident_bytes: int = 0
    #: the cuDNN convolution-workspace allowance of its forward (diffusion_workspace.py)
    conv_workspace_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class StagePeak:
    stage: str
    components: tuple[str, ...]
    resident_weights_bytes: int
    activation_peak_bytes: int
    carried_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.resident_weights_bytes + self.activation_peak_bytes + self.carried_bytes


@dataclass(frozen=True, kw_only=True)
class PipelineEstimate:
    name: str
    pipeline: str
    job: DiffusionJob
    components: tuple[ComponentTrace, ...]
    stages: tuple[StagePeak, ...]
    host_weights_bytes: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the caching allocator's peak (``torch.cuda.max_memory_reserved``), from replaying every
    #: stage's allocations through estimate/allocator/caching.py; None when not replayed
    peak_reserved_bytes: int | None = None
    #: ``max_memory_reserved`` once the pipeline is loaded and placed (before the call)
    loaded_reserved_bytes: int | None = None
    #: the reserved peak when every forward also allocates its cuDNN convolution-workspace
    #: allowance at its peak (the allocator replay again; what the ``--gpu`` verdict uses)
    peak_reserved_upper_bytes: int | None = None
    #: the GPU asked (its name and architecture, whose CUDA context the device bytes add; None:
    #: no GPU, the default context) and THE verdict on it (memfit.estimate.diffusion.device)
    gpu: str | None = None
    arch: str | None = None
    fits: Verdict | None = None

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_bytes for s in self.stages)

    # -- the Answer protocol (memfit.estimate.answer) -------------------------------------------
    @property
    def peak_allocated_bytes(self) -> int:
        return self.peak_bytes

    @property
    def device_used_bytes(self) -> int:
        """What nvidia-smi shows at the peak: the point value of the verdict (device.py)."""
        return device_bytes(self.peak_bytes, self.peak_reserved_bytes, self.arch, training=False)

    @property
    def device_used_upper_bytes(self) -> int:
        """The same with every forward's cuDNN convolution-workspace allowance allocated."""
        reserved = self.peak_reserved_bytes
        upper_reserved = None if reserved is None else (self.peak_reserved_upper_bytes or 0)
        return device_bytes(self.peak_upper_bytes, upper_reserved, self.arch, training=False)

    @property
    def overhead_bytes(self) -> int:
        """What the device bytes add to the tensors: the CUDA context and the cuBLAS workspaces
        (only what lives outside the allocator when the reserved peak was replayed)."""

        ov = device_overhead(self.arch, training=False)
        return ov.total_bytes if self.peak_reserved_bytes is None else ov.outside_allocator_bytes

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """No measured error range for diffusion pipelines (docs/diffusion.md, accuracy)."""
        return {}

    @property
    def peak_components(self) -> dict[str, int]:
        """At the peak stage: resident weights, the forward's activations, the carried tensors
        (prompt embeddings, latents)."""
        s = max(self.stages, key=lambda s: s.peak_bytes)
        return {
            "parameters": s.resident_weights_bytes,
            "activations": s.activation_peak_bytes + s.carried_bytes,
        }

    @property
    def engine(self) -> str:
        return "trace"

    @property
    def engine_reason(self) -> str:
        return "diffusion pipelines: each component's forward traced on fake tensors"

    @property
    def verdict(self) -> Verdict | None:
        return self.fits

    def judge_on(self, gpu: Any) -> PipelineEstimate:
        """This answer with THE verdict on ``gpu`` (a catalog record)."""
        on = replace(self, gpu=gpu.name, arch=gpu.arch)  # the context of gpu's architecture
        return replace(on, fits=judge_point(on.device_used_bytes, gpu.capacity_bytes))

    def fits_json(self) -> dict[str, Any] | None:
        """The ``fits`` object: the verdict's keys beside those the pipeline always printed."""
        if self.fits is None:
            return None
        upper = self.device_used_upper_bytes
        return fits_json(
            self.fits,
            {
                "gpu": self.gpu,
                "capacity_bytes": self.fits.capacity_bytes,
                "overhead_bytes": self.overhead_bytes,
                "need_bytes": self.fits.need_bytes,
                "need_with_conv_workspace_bytes": upper,
                "fits": self.fits.fits,
                "fits_with_conv_workspace": upper <= self.fits.capacity_bytes,
            },
        )

    @property
    def peak_stage(self) -> str:
        return max(self.stages, key=lambda s: s.peak_bytes).stage

    def _workspace(self, stage: StagePeak) -> int:
        by_name = {c.name: c for c in self.components}
        return max((by_name[c].conv_workspace_bytes for c in stage.components), default=0)

    @property
    def conv_workspace_bytes(self) -> int:
        """The largest cuDNN convolution-workspace allowance of any stage."""
        return max((self._workspace(s) for s in self.stages), default=0)

    @property
    def peak_upper_bytes(self) -> int:
        """The allocated peak with each stage's convolution-workspace allowance added: what the
        run may show on a card with memory to spare for cuDNN's workspaces."""
        return max(s.peak_bytes + self._workspace(s) for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "model": self.name,
            "pipeline": self.pipeline,
            "job": asdict(self.job),
            "peak_allocated_bytes": self.peak_bytes,
            "peak_stage": self.peak_stage,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "conv_workspace_allowance_bytes": self.conv_workspace_bytes,
            "peak_upper_bytes": self.peak_upper_bytes,
            "peak_reserved_upper_bytes": self.peak_reserved_upper_bytes,
            "loaded_reserved_bytes": self.loaded_reserved_bytes,
            "host_weights_bytes": self.host_weights_bytes,
            "stages": [{**asdict(s), "peak_bytes": s.peak_bytes} for s in self.stages],
            "components": [asdict(c) for c in self.components],
            "notes": list(self.notes),
            "fits": self.fits_json(),
        }


def read_tree(root: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``model_index.json`` and each weight-bearing component's ``config.json``."""

    index = read_json(root / "model_index.json", what="pipeline index")
    if not isinstance(index, dict) or "_class_name" not in index:
        raise SpecError(f"{root / 'model_index.json'} has no _class_name: not a diffusers tree")
    configs: dict[str, dict[str, Any]] = {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2:
            continue
        if entry[0] is None or name.startswith(("tokenizer", "scheduler", "feature_extractor")):
            continue
        path = root / name / "config.json"
        if not path.is_file():
            raise SpecError(f"{root} declares component {name!r} but has no {name}/config.json")
        configs[name] = read_json(path, what=f"{name} config")
    return index, configs


def build_component(library: str, class_name: str, config: dict[str, Any]) -> torch.nn.Module:
    """The component as diffusers / transformers build it from its config, on the meta device."""
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    with torch.device("meta"):
        if library == "diffusers":
            cls = getattr(diffusers_module(), class_name, None)
            if cls is None:
                raise NotModelledError(
                    f"diffusers has no model class {class_name!r}", engine="diffusion"
                )
            return cls.from_config(cfg)  # type: ignore[no-any-return]
        if library == "transformers":
            import transformers

            cls = getattr(transformers, class_name, None)
            if cls is None:
                raise NotModelledError(
                    f"transformers has no model class {class_name!r}", engine="diffusion"
                )
            conf = transformers.AutoConfig.for_model(**cfg)
            return cls(conf)  # type: ignore[no-any-return]
    raise NotModelledError(
        f"component library {library!r} ({class_name}) is not modelled", engine="diffusion"
    )


def trace_forward(
    model: torch.nn.Module,
    make_inputs: Any,
    call: Any,
    *,
    real: bool = False,
    events: list[tuple[str, int, int]] | None = None,
) -> tuple[int, int]:
    """(peak bytes above the weights, bytes of the output) of ``call(model, **make_inputs())``
    under ``no_grad``; on fake tensors (the model on meta) or, ``real=True``, on real CPU ones.
    ``events``: filled with the forward's allocations and frees (the inputs' first, the weights'
    left out), each storage still alive at the end freed, for the allocator replay."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = StorageTracker(device_type="cpu", record_events=events is not None)
    with ExitStack() as stack:
        if not real:
            fake = FakeTensorMode(allow_non_fake_inputs=False)
            build.meta_to_fake_(model, fake)
            stack.enter_context(fake)
            stack.enter_context(cuda_emulation_for(WorkloadSpec(attention="sdpa"), True))
        inputs = make_inputs()
        stack.enter_context(tracker)
        stack.enter_context(torch.no_grad())
        tracker.set_phase("forward")
        # weights first (their views must not count as new storages), then the inputs
        tracker.label([*model.parameters(), *model.buffers()], "parameters")
        base = tracker.current_bytes
        weight_keys = set(tracker.live)
        tracker.label(_tensors(inputs), "activations")
        try:
            out = call(model, **inputs)
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            raise TraceError(
                f"{type(model).__name__} failed on fake tensors: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300]}"
            ) from exc
        peak = tracker.peak.total_bytes - base
        out_bytes = sum(t.untyped_storage().nbytes() for t in _tensors(out))
    if events is not None and tracker.events is not None:
        events.extend(e for e in tracker.events if e[1] not in weight_keys)
        events.extend(("f", k, 0) for k, n in tracker.live.items() if n and k not in weight_keys)
    return peak, out_bytes


def _tensors(tree: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    if hasattr(tree, "to_tuple"):
        tree = tree.to_tuple()
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _weight_bytes(model: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def largest_leaf_bytes(model: torch.nn.Module) -> int:
    """The weights of the largest module that has parameters of its own (what
    ``enable_sequential_cpu_offload`` keeps on the device at one time: accelerate's ``cpu_offload``
    attaches an ``AlignDevicesHook`` to each module with direct parameters)."""
    best = 0
    for m in model.modules():
        own = sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
        own += sum(b.numel() * b.element_size() for b in m.buffers(recurse=False))
        best = max(best, own)
    return best


def json_config(root: Path, name: str) -> dict[str, Any]:
    data = read_json(root / name / "config.json", what=f"{name} config")
    if not isinstance(data, dict):
        raise SpecError(f"{root / name / 'config.json'} is not a JSON object")
    return dict(data)
