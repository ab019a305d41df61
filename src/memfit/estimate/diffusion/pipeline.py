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

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from memfit.errors import NotModelledError, SpecError, TraceError
from memfit.estimate.diffusion.answer import (  # the records (torch-free), re-exported
    ComponentTrace as ComponentTrace,
)
from memfit.estimate.diffusion.answer import PipelineEstimate as PipelineEstimate
from memfit.estimate.diffusion.answer import StagePeak as StagePeak
from memfit.estimate.diffusion.answer import read_tree as read_tree
from memfit.estimate.diffusion.diffusers_import import diffusers_module
from memfit.estimate.trace import build
from memfit.estimate.trace.engine import cuda_emulation_for
from memfit.estimate.trace.tracker import StorageTracker
from memfit.spec import WorkloadSpec
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
    marked: Sequence[torch.nn.Module] = (),
    marks: list[int] | None = None,
) -> tuple[int, int]:
    """(peak bytes above the weights, bytes of the output) of ``call(model, **make_inputs())``
    under ``no_grad``; on fake tensors (the model on meta) or, ``real=True``, on real CPU ones.
    ``events``: filled with the forward's allocations and frees (the inputs' first, the weights'
    left out), each storage still alive at the end freed, for the allocator replay. ``marks``:
    filled with the index in ``events`` where each forward of a module of ``marked`` starts."""
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
        raw: list[int] = []
        hooks = [
            m.register_forward_pre_hook(lambda *_: raw.append(len(tracker.events or ())))
            for m in marked
        ]
        try:
            out = call(model, **inputs)
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            raise TraceError(
                f"{type(model).__name__} failed on fake tensors: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300]}"
            ) from exc
        finally:
            for h in hooks:
                h.remove()
        peak = tracker.peak.total_bytes - base
        out_bytes = sum(t.untyped_storage().nbytes() for t in _tensors(out))
    if events is not None and tracker.events is not None:
        if marks is not None:  # each index among the events kept (the weights' left out)
            kept = [0]
            for e in tracker.events:
                kept.append(kept[-1] + (e[1] not in weight_keys))
            marks.extend(kept[i] for i in raw)
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
