"""How each diffusers training script sets its components up: dtypes, LoRA targets, what it frees.

Read from huggingface/diffusers ``examples/`` (commit in docs/diffusion.md, "Training"):

* ``train_dreambooth_lora_flux.py``: every component ``.to(device, dtype=weight_dtype)``;
  ``transformer.requires_grad_(False)`` then ``add_adapter(LoraConfig(r=rank, lora_alpha=rank,
  init_lora_weights="gaussian", target_modules=[attn.to_k, attn.to_q, attn.to_v, attn.to_out.0,
  attn.add_{k,q,v}_proj, attn.to_add_out, ff.net.0.proj, ff.net.2, ff_context.net.0.proj,
  ff_context.net.2]))``; ``--train_text_encoder`` adds LoRA (q/k/v/out_proj) to CLIP only, T5
  stays frozen and on the device; without it the prompt embeddings are computed once and
  ``del text_encoder_one, text_encoder_two`` + ``free_memory()``; ``--cache_latents`` encodes the
  dataset once (``latent_dist`` objects kept on the device) and ``del vae``.
* ``train_dreambooth_flux.py`` (full): the transformer stays fp32 and trainable, the VAE and text
  encoders in ``weight_dtype``; the text encoders are deleted after the embeddings are computed.
* ``train_dreambooth_lora_sdxl.py``: UNet and both text encoders in ``weight_dtype``, the VAE
  "always in float32 to avoid NaN losses"; LoRA on ``to_k, to_q, to_v, to_out.0``. Its clean-up
  ``del tokenizers, text_encoders`` deletes the *lists*: ``text_encoder_one`` / ``_two`` still
  reference both encoders, which therefore stay on the device for the whole run.
* ``train_text_to_image_sdxl.py`` (full): the UNet fp32 and trainable; VAE (fp32) and text
  encoders compute the dataset's latents and embeddings once (``datasets.map``, results moved to
  the CPU), then ``del text_encoder_one, text_encoder_two, text_encoders, tokenizers, vae``.

All scripts: under ``--mixed_precision fp16`` ``cast_training_params(models, dtype=float32)``
upcasts the trainable (LoRA) parameters; under bf16 they stay in the base layer's dtype, as peft
creates them. ``--gradient_checkpointing`` is ``enable_gradient_checkpointing()`` on the denoiser
(and ``gradient_checkpointing_enable()`` on trained text encoders).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import NotModelledError
from memfit.estimate.diffusion.train import SCRIPTS
from memfit.spec.diffusion import DiffusionTrainJob

#: diffusers' LoRA target modules, per script (``target_modules=`` as each script writes it).
FLUX_LORA_TARGETS = (
    "attn.to_k",
    "attn.to_q",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_k_proj",
    "attn.add_q_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
)
SDXL_LORA_TARGETS = ("to_k", "to_q", "to_v", "to_out.0")
TEXT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")


@dataclass(frozen=True, kw_only=True)
class ComponentSetup:
    """What the script does with one component: its dtype ("weight" = weight_dtype, "fp32"),
    whether it is trained (``full``/``lora``/``frozen``), and when it is deleted."""

    name: str
    dtype: str
    role: str
    lora_targets: tuple[str, ...] = ()
    #: "never", "after_text" (embeddings precomputed), "after_latents" (latents cached)
    freed: str = "never"


@dataclass(frozen=True, kw_only=True)
class ScriptSetup:
    script: str
    denoiser: str
    components: tuple[ComponentSetup, ...]
    #: embeddings computed once before training (the text encoders run under no_grad)
    precompute_text: bool
    #: latents computed before training (True: cached on the device, FLUX LoRA --cache_latents;
    #: "cpu": the dataset map of train_text_to_image_sdxl.py moves them to the host)
    precompute_latents: bool
    latents_on_device: bool
    #: each step runs vae.encode on the batch's pixels
    encode_each_step: bool


def script_setup(pipeline: str, job: DiffusionTrainJob) -> ScriptSetup:
    """The set-up of the script that trains ``pipeline`` the way ``job`` asks."""
    lora = job.lora_rank is not None
    script = SCRIPTS.get((pipeline, lora))
    if script is None:
        raise NotModelledError(
            f"training {pipeline} is not modelled (memfit follows diffusers' scripts for "
            "FluxPipeline and StableDiffusionXLPipeline)",
            engine="diffusion-train",
        )
    te = job.train_text_encoder
    if pipeline == "FluxPipeline":
        return _flux(script, job, lora, te)
    return _sdxl(script, job, lora, te)


def _flux(script: str, job: DiffusionTrainJob, lora: bool, te: bool) -> ScriptSetup:
    if te and not lora:
        raise NotModelledError(
            "--train-text-encoder with full fine-tuning of FLUX: train_dreambooth_flux.py "
            "leaves T5 off the device in that mode; memfit does not model it (use LoRA)",
            engine="diffusion-train",
        )
    text_freed = "never" if te else "after_text"
    comps = (
        ComponentSetup(
            name="transformer",
            dtype="weight" if lora else "fp32",
            role="lora" if lora else "full",
            lora_targets=FLUX_LORA_TARGETS if lora else (),
        ),
        ComponentSetup(name="vae", dtype="weight", role="frozen",
                       freed="after_latents" if job.cache_latents else "never"),
        ComponentSetup(
            name="text_encoder",
            dtype="weight",
            role="lora" if te else "frozen",
            lora_targets=TEXT_LORA_TARGETS if te else (),
            freed=text_freed,
        ),
        ComponentSetup(name="text_encoder_2", dtype="weight", role="frozen", freed=text_freed),
    )  # fmt: skip
    return ScriptSetup(
        script=script,
        denoiser="transformer",
        components=comps,
        precompute_text=not te,
        precompute_latents=job.cache_latents,
        latents_on_device=job.cache_latents,
        encode_each_step=not job.cache_latents,
    )


def _sdxl(script: str, job: DiffusionTrainJob, lora: bool, te: bool) -> ScriptSetup:
    if job.cache_latents:
        raise NotModelledError(
            f"--cache-latents: {script.rsplit('/', 1)[-1]} has no --cache_latents (the SDXL LoRA "
            "script encodes each batch; the full script precomputes the latents on the host)",
            engine="diffusion-train",
        )
    if te and not lora:
        raise NotModelledError(
            "--train-text-encoder with full fine-tuning of SDXL: train_text_to_image_sdxl.py "
            "does not train the text encoders",
            engine="diffusion-train",
        )
    if lora:
        text = tuple(
            ComponentSetup(
                name=n,
                dtype="weight",
                role="lora" if te else "frozen",
                lora_targets=TEXT_LORA_TARGETS if te else (),
            )
            for n in ("text_encoder", "text_encoder_2")
        )
        comps = (
            ComponentSetup(name="unet", dtype="weight", role="lora",
                           lora_targets=SDXL_LORA_TARGETS),
            ComponentSetup(name="vae", dtype="fp32", role="frozen"),
            *text,
        )  # fmt: skip
        return ScriptSetup(
            script=script,
            denoiser="unet",
            components=comps,
            precompute_text=not te,
            precompute_latents=False,
            latents_on_device=False,
            encode_each_step=True,
        )
    comps = (
        ComponentSetup(name="unet", dtype="fp32", role="full"),
        ComponentSetup(name="vae", dtype="fp32", role="frozen", freed="after_latents"),
        ComponentSetup(name="text_encoder", dtype="weight", role="frozen", freed="after_latents"),
        ComponentSetup(name="text_encoder_2", dtype="weight", role="frozen", freed="after_latents"),
    )
    return ScriptSetup(
        script=script,
        denoiser="unet",
        components=comps,
        precompute_text=True,
        precompute_latents=True,
        latents_on_device=False,
        encode_each_step=False,
    )
