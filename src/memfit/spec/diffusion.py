"""Diffusion jobs (torch-free): one pipeline call (:class:`DiffusionJob`) and one training run of
a diffusers example script (:class:`DiffusionTrainJob`), with the vocabulary they are checked
against.

Both take the shared precision names (:data:`memfit.spec.rules.PRECISION_NAMES`), resolved once
in ``__post_init__``: an inference pipeline runs its weights in one dtype, so ``bf16-true`` and
``bf16`` are the same job and the record holds the dtype name (:data:`PIPELINE_PRECISIONS`); a
training run holds the Lightning name of accelerate's ``--mixed_precision``
(:data:`MIXED_PRECISION`: ``bf16`` trains as ``bf16-mixed``). Every problem of a record is
reported together, each naming the field, the value and the rule.

The estimators live in :mod:`memfit.estimate.diffusion` (they need torch and diffusers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memfit.spec.rules import raise_if, resolve_precision

#: The inference pipeline's dtypes (the ``torch_dtype`` of ``from_pretrained``), by the shared
#: names that mean them for an inference run (``resolve_precision(name, "infer")``).
PIPELINE_PRECISIONS = {"bf16-true": "bf16", "16-true": "fp16", "32-true": "fp32"}
#: The dtype names a pipeline job holds (``estimate/diffusion/pipeline.py`` maps them to torch's).
PIPELINE_DTYPES = tuple(PIPELINE_PRECISIONS.values())
#: ``none`` keeps every component on the device; ``model`` / ``sequential`` / ``group`` are
#: diffusers' ``enable_model_cpu_offload`` / ``enable_sequential_cpu_offload`` /
#: ``enable_group_offload``.
PIPELINE_OFFLOADS = ("none", "model", "sequential", "group")
#: ``enable_group_offload(offload_type=...)`` (diffusers hooks/group_offloading.py).
OFFLOAD_TYPES = ("block_level", "leaf_level")
#: ``enable_layerwise_casting(storage_dtype=float8_e4m3fn)``: bytes per stored element.
LAYERWISE_STORAGE_BYTES = {"fp8": 1}
#: A library version as the version rules read it ("4.52.3", "5", "4.x", "0.48.0.dev0").
VERSION_RE = re.compile(r"^\d+(\.(\d+|x))*([.+-]?[0-9A-Za-z.+-]*)?$")

#: Bytes a quantized weight of ``n`` elements and ``rows`` output rows takes: (bytes per element,
#: scale bytes per row). Sources:
#: - bitsandbytes ``Params4bit``: packed uint8, an fp32 absmax per 64-element block; with double
#:   quantization an int8 absmax per block plus an fp32 per 256 blocks. ``Int8Params``: int8
#:   data, ``SCB`` fp32 per row.
#: - torchao 0.18 ``Int8WeightOnlyConfig``: int8 data, an fp32 scale and an int8 zero point per
#:   row; ``Float8WeightOnlyConfig``: fp8 data, an fp32 scale per row.
#: - ggml-common.h blocks: ``block_q8_0`` 34 B per 32, ``block_q6_K`` 210 B per 256,
#:   ``block_q5_1`` 24 B per 32, ``block_q5_0`` 22 B per 32, ``block_q4_K`` 144 B per 256,
#:   ``block_q4_1`` 20 B per 32, ``block_q4_0`` 18 B per 32, ``block_q3_K`` 110 B per 256,
#:   ``block_q2_K`` 84 B per 256.
FORMATS: dict[str, tuple[float, int]] = {
    "nf4": (0.5 + 4 / 64, 0),
    "fp4": (0.5 + 4 / 64, 0),
    "nf4-dq": (0.5 + 1 / 64 + 4 / (64 * 256), 0),
    "int8": (1.0, 4),
    "torchao-int8wo": (1.0, 4 + 1),
    "torchao-fp8wo": (1.0, 4),
    "gguf-q8_0": (34 / 32, 0),
    "gguf-q6_k": (210 / 256, 0),
    "gguf-q5_1": (24 / 32, 0),
    "gguf-q5_0": (22 / 32, 0),
    "gguf-q4_k": (144 / 256, 0),
    "gguf-q4_1": (20 / 32, 0),
    "gguf-q4_0": (18 / 32, 0),
    "gguf-q3_k": (110 / 256, 0),
    "gguf-q2_k": (84 / 256, 0),
}
#: Which library applies each format (what the note says; GGUF checkpoints exist for denoisers).
BACKEND = {
    **dict.fromkeys(("nf4", "fp4", "nf4-dq", "int8"), "bitsandbytes"),
    "torchao-int8wo": "torchao",
    "torchao-fp8wo": "torchao",
}
#: --quant / --text-encoder-quant values that only diffusion pipelines take
DIFFUSION_QUANTS = tuple(q for q in FORMATS if q not in ("nf4", "fp4", "nf4-dq", "int8"))

#: accelerate's ``--mixed_precision`` for each memfit precision the scripts can run: the frozen
#: components are cast to ``weight_dtype`` (fp16 / bf16 / fp32), the forward runs under
#: ``accelerator.autocast`` (the prepared model's forward), fp16 adds accelerate's GradScaler.
MIXED_PRECISION = {"bf16-mixed": "bf16", "16-mixed": "fp16", "32-true": "no"}
#: The optimizers the scripts build: ``torch.optim.AdamW`` (``--optimizer adamw``),
#: ``bnb.optim.AdamW8bit`` (``--use_8bit_adam``) and ``prodigyopt.Prodigy`` (``--optimizer
#: prodigy``, run as the real package: states s, p0, exp_avg, exp_avg_sq per parameter).
TRAIN_OPTIMIZERS = ("adamw", "adamw-8bit", "prodigy")


def pipeline_dtype(value: Any) -> Any:
    """The dtype name of a pipeline precision (``bf16-true``, ``bf16`` -> ``bf16``); anything
    else is returned as given, for the record to refuse."""
    resolved = resolve_precision(value, "infer")
    return PIPELINE_PRECISIONS.get(resolved, value) if isinstance(resolved, str) else value


def _positive(record: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[str]:
    out = []
    for name in names:
        value = getattr(record, name)
        if value is None and name in optional:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            out.append(f"{name} must be a positive whole number, got {value!r}")
    return out


@dataclass(frozen=True, kw_only=True)
class DiffusionJob:
    """One ``pipe(prompt, height=, width=, num_inference_steps=, num_images_per_prompt=)`` call."""

    height: int = 1024
    width: int = 1024
    steps: int = 28
    batch: int = 1
    #: the pipeline's dtype: bf16 / fp16 / fp32, or a shared name that means one for inference
    #: (bf16-true, 16-true, 32-true, 16, 32); held as the dtype name
    precision: str = "bf16"
    offload: str = "none"
    vae_slicing: bool = False
    vae_tiling: bool = False
    #: the T5 prompt length; None: the pipeline's default (FLUX 512, SD3 256, PixArt-Sigma 300)
    max_sequence_length: int | None = None
    #: SD3: ``StableDiffusion3Pipeline.from_pretrained(..., text_encoder_3=None)`` (no T5)
    drop_text_encoder_3: bool = False
    #: the transformers / bitsandbytes versions whose rules apply (estimate/diffusion/versions.py);
    #: None: the installed ones
    transformers_version: str | None = None
    bitsandbytes_version: str | None = None
    #: group offloading (``pipe.enable_group_offload``): its offload_type, blocks per group, stream
    offload_type: str = "block_level"
    num_blocks_per_group: int = 1
    use_stream: bool = False
    #: weight formats: the denoiser's, the largest text encoder's (:data:`FORMATS`)
    quant: str = "none"
    text_encoder_quant: str = "none"
    #: ``enable_layerwise_casting(storage_dtype=float8_e4m3fn)`` on the denoiser
    layerwise_casting: str | None = None
    #: ``pipe.enable_attention_slicing()`` (slice_size "auto")
    attention_slicing: bool = False
    #: video pipelines (WanPipeline): ``num_frames``; None: the pipeline's default (81)
    num_frames: int | None = None
    #: the VAE's own dtype (``vae=AutoencoderKL*.from_pretrained(..., torch_dtype=)``); None:
    #: ``precision`` (and SDXL's fp16 ``force_upcast``)
    vae_precision: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", pipeline_dtype(self.precision))
        if self.vae_precision is not None:
            object.__setattr__(self, "vae_precision", pipeline_dtype(self.vae_precision))
        raise_if(self.problems())

    def problems(self) -> list[str]:
        """Every rule the job breaks (field, value, rule)."""
        p = _positive(
            self,
            ("height", "width", "steps", "batch", "max_sequence_length", "num_frames"),
            optional=("max_sequence_length", "num_frames"),
        )
        for name in ("height", "width"):
            value = getattr(self, name)
            if isinstance(value, int) and value % 16:
                p.append(
                    f"{name} must be a multiple of 16 (the VAE's 8x and the 2x2 patching), got "
                    f"{value}"
                )
        for name in ("transformers_version", "bitsandbytes_version"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and VERSION_RE.match(value)):
                p.append(f"{name} must be a version such as '4.52.3', got {value!r}")
        if self.precision not in PIPELINE_DTYPES:
            p.append(
                f"precision {self.precision!r} is not a diffusion inference precision: use one "
                f"of {', '.join(PIPELINE_DTYPES)} (or {', '.join(PIPELINE_PRECISIONS)})"
            )
        if self.vae_precision is not None and self.vae_precision not in PIPELINE_DTYPES:
            p.append(
                f"vae_precision {self.vae_precision!r} is not one of {', '.join(PIPELINE_DTYPES)}"
            )
        if self.offload not in PIPELINE_OFFLOADS:
            p.append(
                f"pipeline offload {self.offload!r} is not one of {', '.join(PIPELINE_OFFLOADS)}"
            )
        p += self._offload_problems() + self._weight_problems()
        return p

    def _offload_problems(self) -> list[str]:
        p = []
        if self.offload_type not in OFFLOAD_TYPES:
            p.append(f"offload_type {self.offload_type!r} is not one of {', '.join(OFFLOAD_TYPES)}")
        n = self.num_blocks_per_group
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            p.append(f"num_blocks_per_group must be a positive whole number, got {n!r}")
        elif self.use_stream and n != 1:
            p.append(f"use_stream needs num_blocks_per_group 1 (diffusers resets it to 1), got {n}")
        return p

    def _weight_problems(self) -> list[str]:
        p = []
        for name in ("quant", "text_encoder_quant"):
            value = getattr(self, name)
            if value != "none" and value not in FORMATS:
                p.append(
                    f"{name} {value!r} is not a diffusion weight format: use one of "
                    f"{', '.join(FORMATS)}"
                )
        if isinstance(self.text_encoder_quant, str) and self.text_encoder_quant.startswith("gguf"):
            p.append(
                f"text_encoder_quant {self.text_encoder_quant!r}: GGUF checkpoints are loaded for "
                "the denoiser (from_single_file); quantize text encoders with bitsandbytes or "
                "torchao formats"
            )
        if self.layerwise_casting is not None:
            if self.layerwise_casting not in LAYERWISE_STORAGE_BYTES:
                p.append(
                    f"layerwise_casting {self.layerwise_casting!r} is not supported: use fp8 "
                    "(storage float8_e4m3fn)"
                )
            if self.quant != "none":
                p.append(
                    f"layerwise_casting and quant {self.quant!r} both change the denoiser's "
                    "weights: use one of them"
                )
        return p


@dataclass(frozen=True, kw_only=True)
class DiffusionTrainJob:
    """One training run of a diffusers example script (its flags, as memfit spells them)."""

    resolution: int = 1024
    batch: int = 1
    #: LoRA rank (``--rank``; ``lora_alpha`` = rank as the scripts default), None: full fine-tune
    lora_rank: int | None = 4
    checkpointing: bool = False
    optimizer: str = "adamw"
    #: a shared precision name, resolved for training (``bf16`` -> ``bf16-mixed``)
    precision: str = "bf16-mixed"
    train_text_encoder: bool = False
    cache_latents: bool = False
    #: FLUX: T5's ``--max_sequence_length``; None: the script's default (512 in the LoRA
    #: script, 77 in train_dreambooth_flux.py); SDXL's CLIPs take 77 whatever it is
    max_sequence_length: int | None = None
    #: the denoiser's LoRA ``target_modules`` (FLUX's ``--lora_layers``); None: the script's
    lora_targets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", resolve_precision(self.precision, "train"))
        raise_if(self.problems())

    def problems(self) -> list[str]:
        """Every rule the job breaks (field, value, rule)."""
        problems = _positive(
            self, ("resolution", "batch", "max_sequence_length"), optional=("max_sequence_length",)
        )
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
        return problems

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
