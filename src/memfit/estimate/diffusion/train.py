"""Diffusion training as the diffusers example scripts run it: the result records (the job,
:class:`~memfit.spec.diffusion.DiffusionTrainJob`, is in spec/).

One :class:`DiffusionTrainJob` is one ``accelerate launch`` of a diffusers training script
(docs/diffusion.md, "Training"; the scripts read are listed in :data:`SCRIPTS`): LoRA (``peft``
``LoraConfig`` through ``add_adapter``, ``rank``) or full fine-tuning (``rank`` None) of the
denoiser, at ``--resolution`` with ``--train_batch_size``, ``--gradient_checkpointing``,
``--use_8bit_adam``, ``--mixed_precision``, ``--train_text_encoder`` and (FLUX LoRA)
``--cache_latents``. :mod:`memfit.estimate.diffusion.train_step` traces it on fake tensors
through the real diffusers / transformers / peft classes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memfit.estimate.diffusion.device import (
    device_bytes,
    fits_json,
)
from memfit.estimate.verdict import Verdict, judge_point
from memfit.spec.diffusion import DiffusionTrainJob

#: (pipeline class, LoRA?) -> the script memfit follows, in diffusers' examples/ (commit in docs).
SCRIPTS = {
    ("FluxPipeline", True): "examples/dreambooth/train_dreambooth_lora_flux.py",
    ("FluxPipeline", False): "examples/dreambooth/train_dreambooth_flux.py",
    ("StableDiffusionXLPipeline", True): "examples/dreambooth/train_dreambooth_lora_sdxl.py",
    ("StableDiffusionXLPipeline", False): "examples/text_to_image/train_text_to_image_sdxl.py",
}
#: Phases of the traced run, in order: the set-up the script does once (text embeddings
#: precomputed, latents cached), then two training steps (the second has optimizer states).
PHASES = ("precompute_text", "cache_latents", "vae_encode", "forward", "backward", "optimizer")


@dataclass(frozen=True, kw_only=True)
class PhasePeak:
    """The device tensors at one phase's peak, by component (memfit's categories)."""

    phase: str
    peak_bytes: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    activations_bytes: int
    temporary_bytes: int
    #: bytes at the peak by model component (transformer, vae, text_encoder, ...; "(step)" for
    #: the step's own tensors: inputs, loss, outputs outside any module)
    by_model: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ComponentState:
    """One pipeline component as the script holds it during training."""

    name: str
    class_name: str
    dtype: str
    #: "trained" (full), "lora" (adapters trained), "frozen", or "freed" (deleted after set-up)
    role: str
    weights_bytes: int
    n_params: int
    n_trainable: int


@dataclass(frozen=True, kw_only=True)
class TrainEstimate:
    """A diffusion training run's device memory: the peak (``max_memory_allocated``), its phase
    and components, and the caching allocator's reserved peak from replaying the run."""

    name: str
    pipeline: str
    script: str
    job: DiffusionTrainJob
    phases: tuple[PhasePeak, ...]
    components: tuple[ComponentState, ...]
    peak_reserved_bytes: int
    notes: tuple[str, ...] = ()
    #: the GPU asked (its name and architecture, whose CUDA context the device bytes add; None:
    #: no GPU, the default context) and THE verdict on it (memfit.estimate.diffusion.device)
    gpu: str | None = None
    arch: str | None = None
    fits: Verdict | None = None

    @property
    def peak(self) -> PhasePeak:
        return max(self.phases, key=lambda p: p.peak_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.peak.peak_bytes

    # -- the Answer protocol (memfit.estimate.answer) -------------------------------------------
    @property
    def peak_allocated_bytes(self) -> int:
        return self.peak_bytes

    @property
    def device_used_bytes(self) -> int:
        """What nvidia-smi shows at the peak: the point value of the verdict (device.py)."""
        return device_bytes(self.peak_bytes, self.peak_reserved_bytes, self.arch, training=True)

    @property
    def overhead_bytes(self) -> int:
        """What the device bytes add to the allocated peak (CUDA context, workspaces)."""
        return self.device_used_bytes - self.peak_bytes

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """No measured error range for diffusion training (docs/diffusion.md, accuracy)."""
        return {}

    @property
    def peak_components(self) -> dict[str, int]:
        p = self.peak
        return {
            "parameters": p.parameters_bytes,
            "gradients": p.gradients_bytes,
            "optimizer_states": p.optimizer_states_bytes,
            "activations": p.activations_bytes,
            "temporary": p.temporary_bytes,
        }

    @property
    def engine(self) -> str:
        return "trace"

    @property
    def engine_reason(self) -> str:
        return "diffusion training: the diffusers script's step traced on fake tensors"

    @property
    def verdict(self) -> Verdict | None:
        return self.fits

    def judge_on(
        self, gpu: Any, *, capacity: int | None = None, headroom: int | None = None
    ) -> TrainEstimate:
        """This answer with THE verdict on ``gpu`` (a catalog record, or None with a
        ``capacity``: a ``--gpu-memory`` budget); ``headroom`` None: the default fraction."""
        arch = self.arch if gpu is None else gpu.arch
        judged = replace(self, arch=arch)
        cap = gpu.capacity_bytes if capacity is None else capacity
        v = judge_point(judged.device_used_bytes, cap, headroom)
        name = gpu.name if gpu is not None else self.gpu
        return replace(judged, gpu=name, fits=v)

    def fits_json(self) -> dict[str, Any] | None:
        """The ``fits`` object: the verdict's keys beside those the training answer printed."""
        if self.fits is None:
            return None
        return fits_json(
            self.fits,
            {
                "gpu": self.gpu,
                "capacity_bytes": self.fits.capacity_bytes,
                "overhead_bytes": self.overhead_bytes,
                "need_bytes": self.fits.need_bytes,
                "fits": self.fits.fits,
            },
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "pipeline": self.pipeline,
            "script": self.script,
            "mode": "train",
            "job": asdict(self.job),
            "peak_allocated_bytes": self.peak_bytes,
            "peak_phase": self.peak.phase,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "phases": [asdict(p) for p in self.phases],
            "components": [asdict(c) for c in self.components],
            "notes": list(self.notes),
            "fits": self.fits_json(),
        }
