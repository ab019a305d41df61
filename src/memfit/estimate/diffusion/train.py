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

from dataclasses import asdict, dataclass, field
from typing import Any

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

    @property
    def peak(self) -> PhasePeak:
        return max(self.phases, key=lambda p: p.peak_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.peak.peak_bytes

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
        }
