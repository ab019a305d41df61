"""Diffusion training as the diffusers example scripts run it: the job and the result records.

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

from memfit.errors import SpecError
from memfit.estimate.diffusion.device import (
    capacity_bytes,
    device_bytes,
    fits_json,
)
from memfit.estimate.verdict import Verdict, judge_point

#: accelerate's ``--mixed_precision`` for each memfit precision the scripts can run: the frozen
#: components are cast to ``weight_dtype`` (fp16 / bf16 / fp32), the forward runs under
#: ``accelerator.autocast`` (the prepared model's forward), fp16 adds accelerate's GradScaler.
MIXED_PRECISION = {"bf16-mixed": "bf16", "16-mixed": "fp16", "32-true": "no"}
#: The optimizers the scripts build: ``torch.optim.AdamW`` (``--optimizer adamw``),
#: ``bnb.optim.AdamW8bit`` (``--use_8bit_adam``) and ``prodigyopt.Prodigy`` (``--optimizer
#: prodigy``, run as the real package: states s, p0, exp_avg, exp_avg_sq per parameter).
TRAIN_OPTIMIZERS = ("adamw", "adamw-8bit", "prodigy")
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
class DiffusionTrainJob:
    """One training run of a diffusers example script (its flags, as memfit spells them)."""

    resolution: int = 1024
    batch: int = 1
    #: LoRA rank (``--rank``; ``lora_alpha`` = rank as the scripts default), None: full fine-tune
    lora_rank: int | None = 4
    checkpointing: bool = False
    optimizer: str = "adamw"
    precision: str = "bf16-mixed"
    train_text_encoder: bool = False
    cache_latents: bool = False
    #: FLUX: T5's ``--max_sequence_length``; None: the script's default (512 in the LoRA
    #: script, 77 in train_dreambooth_flux.py); SDXL's CLIPs take 77 whatever it is
    max_sequence_length: int | None = None
    #: the denoiser's LoRA ``target_modules`` (FLUX's ``--lora_layers``); None: the script's
    lora_targets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("resolution", "batch", "max_sequence_length"):
            value = getattr(self, name)
            if name == "max_sequence_length" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive whole number, got {value!r}")
        if isinstance(self.resolution, int) and self.resolution % 16:
            problems.append(
                f"resolution must be a multiple of 16 (the VAE's 8x and FLUX's 2x2 packing), "
                f"got {self.resolution}"
            )
        if self.lora_rank is not None and (
            not isinstance(self.lora_rank, int) or self.lora_rank < 1
        ):
            problems.append(f"lora_rank must be a positive whole number, got {self.lora_rank!r}")
        if self.optimizer not in TRAIN_OPTIMIZERS:
            problems.append(
                f"optimizer {self.optimizer!r} is not one the diffusers scripts build with "
                f"memfit's model: use {', '.join(TRAIN_OPTIMIZERS)}"
            )
        if self.precision not in MIXED_PRECISION:
            problems.append(
                f"precision {self.precision!r}: the scripts run accelerate's --mixed_precision "
                f"bf16 / fp16 / no, i.e. {', '.join(MIXED_PRECISION)}"
            )
        if self.cache_latents and self.lora_rank is None:
            problems.append(
                "cache_latents: only the LoRA scripts (train_dreambooth_lora_flux.py) have "
                "--cache_latents; drop it for full fine-tuning"
            )
        if self.lora_targets is not None and (
            self.lora_rank is None or not self.lora_targets
            or not all(isinstance(t, str) and t for t in self.lora_targets)
        ):  # fmt: skip
            problems.append(
                f"lora_targets {self.lora_targets!r} must be module names and needs a lora_rank"
            )
        if problems:
            raise SpecError("; ".join(problems))

    @property
    def sequence_length(self) -> int:
        """T5's token count as the script runs it (``--max_sequence_length`` or its default)."""
        if self.max_sequence_length is not None:
            return self.max_sequence_length
        return 512 if self.lora_rank is not None else 77

    @property
    def mixed_precision(self) -> str:
        return MIXED_PRECISION[self.precision]

    def flags(self) -> str:
        """The job as ``memfit estimate`` flags."""
        out = [f"--resolution {self.resolution}", f"--batch {self.batch}"]
        if self.lora_rank:
            out.append(f"--lora-rank {self.lora_rank}")
        out.append(f"--precision {self.precision}")
        if self.checkpointing:
            out.append("--checkpointing full")
        if self.optimizer != "adamw":
            out.append(f"--optimizer {self.optimizer}")
        if self.train_text_encoder:
            out.append("--train-text-encoder")
        if self.cache_latents:
            out.append("--cache-latents")
        if self.max_sequence_length is not None:
            out.append(f"--max-sequence-length {self.max_sequence_length}")
        if self.lora_targets:
            out.append(f"--lora-targets {','.join(self.lora_targets)}")
        return " ".join(out)


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
        cap = capacity_bytes(gpu) if capacity is None else capacity
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
