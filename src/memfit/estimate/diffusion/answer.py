"""A diffusion pipeline's answer (torch-free): the records an estimate is made of, the tree it
reads, and the answer kept in the trace cache.

:func:`memfit.estimate.diffusion.route.estimate_pipeline` looks the whole answer up in the
trace cache (:func:`kept_answer`, THE key rule: the pipeline's
``model_index.json`` and component configs, the job, the GPU, the installed versions and
memfit's own source) before anything imports torch; only a miss builds and traces the
components (:mod:`memfit.estimate.diffusion.pipelines`). So a repeated estimate, and each
variant a "what makes it fit" search probes again, costs a cache read. A kept entry that does
not decode to a plausible answer (another class, a field missing, a negative count) is
rebuilt and replaced, never used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.diffusion.device import device_bytes, fits_json
from memfit.estimate.verdict import Verdict, judge_point
from memfit.hardware.overhead import device_overhead
from memfit.spec.diffusion import DiffusionJob
from memfit.userfiles import read_json


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
    #: the derived engine's account of its forms (memfit.estimate.diffusion.derived); None: traced
    derived_from: str | None = None

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
        return "trace" if self.derived_from is None else "derived"

    @property
    def engine_reason(self) -> str:
        if self.derived_from is not None:
            return f"diffusion pipelines: each component's forward {self.derived_from}"
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
            "engine": self.engine,
            "engine_reason": self.engine_reason,
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


class NotDerived(Exception):
    """A record of the job is not in the shipped forms (memfit.estimate.diffusion.derived): the
    trace engine answers the job."""


#: The records a kept pipeline estimate holds (trace_cache.encode_record), by class name.
_KEPT: dict[str, type] = {
    c.__name__: c for c in (PipelineEstimate, ComponentTrace, StagePeak, DiffusionJob, Verdict)
}


def _trace_cache() -> Any:
    """:mod:`memfit.estimate.trace_cache`, on first use: it loads numpy (through the derived
    cache), which ``memfit --help`` (api.py imports this module) should not pay for."""
    from memfit.estimate import trace_cache

    return trace_cache


def _encode(est: PipelineEstimate) -> dict[str, Any]:
    return _trace_cache().encode_record(est, _KEPT)  # type: ignore[no-any-return]


def _decode(data: Any) -> PipelineEstimate | None:
    """A kept estimate, None where it is not a plausible one (counts whole and non-negative)."""
    est = _trace_cache().decode_record(data, PipelineEstimate, _KEPT)
    if not isinstance(est, PipelineEstimate) or not isinstance(est.job, DiffusionJob):
        return None
    counts: list[Any] = [est.host_weights_bytes, est.peak_reserved_bytes,
                         est.loaded_reserved_bytes, est.peak_reserved_upper_bytes]  # fmt: skip
    for rec in (*est.components, *est.stages):
        if not isinstance(rec, (ComponentTrace, StagePeak)):
            return None
        counts += [getattr(rec, f.name) for f in dataclasses.fields(rec) if "bytes" in f.name]
    ok = all(v is None or (type(v) is int and v >= 0) for v in counts) and bool(est.stages)
    return est if ok else None


def kept_answer(parts: dict[str, Any], run: Callable[[], PipelineEstimate]) -> PipelineEstimate:
    """The pipeline answer kept in the trace cache under ``parts`` (THE key rule), else
    ``run()``'s, kept (:func:`memfit.estimate.trace_cache.cached_answer`)."""
    est, _ = _trace_cache().cached_answer(parts, run, encode=_encode, decode=_decode)
    return est  # type: ignore[no-any-return]
