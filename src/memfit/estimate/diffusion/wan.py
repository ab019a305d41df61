"""WanPipeline (diffusers 0.42.1, ``pipelines/wan/pipeline_wan.py``) as shapes: what ``__call__``
feeds each component, for ``memfit estimate wan2.2-ti2v-5b --mode infer``.

* Frames and size as ``__call__`` adjusts them: ``num_frames`` with ``(num_frames - 1) % 4 != 0``
  is rounded down to ``num_frames // 4 * 4 + 1`` (diffusers warns and rounds; so does memfit, with
  a note), height and width down to multiples of ``vae.scale_factor_spatial * patch_size``
  (Wan 2.2 TI2V: 16 · 2 = 32).
* ``encode_prompt``: the UMT5 encoder on ``max_sequence_length`` (default 512) tokens with their
  mask, once for the prompt and once more for the negative prompt (guidance 5.0 > 1); both
  embeddings stay alive until the pipeline returns.
* the denoising loop, per step: fp32 latents ``(B, C, (F-1)//4 + 1, H/s, W/s)`` and an fp32
  mask of the same shape live throughout; the transformer runs **twice** (cond, then uncond, two
  calls of batch B, not one doubled batch) on the latents cast to its dtype, with
  ``expand_timesteps`` (Wan 2.2 TI2V) a per-token fp32 timestep ``(B, F·H/s/2·W/s/2)``; the cond
  prediction is alive during the uncond call; the CFG combination follows. ``transformer_2``
  (Wan 2.2 A14B, ``boundary_ratio``) is traced the same way and runs the low-noise steps.
* ``vae.decode`` of the latents cast to the VAE's dtype and de-normalised
  (``latents / (1/latents_std) + latents_mean``), then ``video_processor.postprocess_video``,
  whose ``denormalize`` copy of each video is made on the device before ``.cpu()``.

Not traced: the UniPC scheduler's step (its state is a few fp32 latents: ``solver_order``
previous predictions and the last sample, held as inputs of the denoise trace).
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.errors import SpecError

#: WanPipeline.__call__ defaults
DEFAULT_FRAMES = 81
DEFAULT_SEQ = 512
GUIDANCE = 5.0
#: UniPCMultistepScheduler's default solver_order: the previous predictions it keeps
SOLVER_ORDER = 2


def adjust(configs: dict[str, Any], job: Any) -> tuple[int, int, int, list[str]]:
    """(frames, height, width, notes) as ``WanPipeline.__call__`` adjusts them."""
    vae = configs["vae"]
    tcfg = configs.get("transformer") or configs.get("transformer_2") or {}
    t_comp = int(vae.get("scale_factor_temporal") or 4)
    s_comp = int(vae.get("scale_factor_spatial") or 8)
    patch = tcfg.get("patch_size") or [1, 2, 2]
    frames = job.num_frames if job.num_frames is not None else DEFAULT_FRAMES
    notes = []
    if frames % t_comp != 1:
        rounded = max(frames // t_comp * t_comp + 1, 1)
        notes.append(
            f"num_frames {frames}: (num_frames - 1) must be divisible by {t_comp}; WanPipeline "
            f"rounds it to {rounded}, and so does memfit"
        )
        frames = rounded
    hm, wm = s_comp * int(patch[1]), s_comp * int(patch[2])
    h, w = job.height // hm * hm, job.width // wm * wm
    if h < hm or w < wm:
        raise SpecError(
            f"height {job.height} / width {job.width}: WanPipeline needs at least {hm} x {wm} "
            f"(multiples of vae.scale_factor_spatial x patch_size)"
        )
    if (h, w) != (job.height, job.width):
        notes.append(
            f"height/width must be multiples of ({hm}, {wm}): WanPipeline adjusts "
            f"({job.height}, {job.width}) -> ({h}, {w}), and so does memfit"
        )
    return frames, h, w, notes


def _empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def wan_recipe(
    index: dict[str, Any], configs: dict[str, Any], job: Any, dt: torch.dtype
) -> tuple[dict[str, tuple[Any, Any, str]], torch.dtype, list[str]]:
    """``({component: (make_inputs, call, stage)}, vae dtype, notes)`` for one WanPipeline call,
    the components in ``model_cpu_offload_seq`` order (text_encoder, transformer, transformer_2,
    vae)."""
    from memfit.estimate.diffusion.pipeline import DTYPES

    frames, h, w, notes = adjust(configs, job)
    vae_dt = DTYPES[job.vae_precision] if job.vae_precision else dt
    vae = configs["vae"]
    t_comp = int(vae.get("scale_factor_temporal") or 4)
    s_comp = int(vae.get("scale_factor_spatial") or 8)
    b = job.batch
    seq = job.max_sequence_length or DEFAULT_SEQ
    lat = (b, int(vae.get("z_dim", 16)), (frames - 1) // t_comp + 1, h // s_comp, w // s_comp)
    steps: dict[str, tuple[Any, Any, str]] = {
        "text_encoder": (
            lambda: {
                "input_ids": torch.zeros((b, seq), dtype=torch.long),
                "attention_mask": torch.ones((b, seq), dtype=torch.long),
            },
            lambda m, **kw: m(**kw).last_hidden_state,
            "text_encode",
        )
    }
    expand = bool(index.get("expand_timesteps"))
    for comp in ("transformer", "transformer_2"):
        if comp not in configs:
            continue
        tcfg = configs[comp]
        text_dim = int(tcfg.get("text_dim", 4096))

        def make(text_dim: int = text_dim) -> dict[str, Any]:
            return {
                "latents": _empty(*lat, dtype=torch.float32),
                "mask": torch.ones(lat, dtype=torch.float32),
                # both prompts' embeddings (the composer also carries the prompt's: a
                # B x seq x text_dim over-count, 4 MiB per video at 512 tokens in bf16)
                "prompt_embeds": _empty(b, seq, text_dim, dtype=dt),
                "negative_prompt_embeds": _empty(b, seq, text_dim, dtype=dt),
                "scheduler_state": [
                    _empty(*lat, dtype=torch.float32) for _ in range(SOLVER_ORDER + 1)
                ],
            }

        def call(
            m: Any,
            *,
            latents: Any,
            mask: Any,
            prompt_embeds: Any,
            negative_prompt_embeds: Any,
            **_: Any,
        ) -> Any:
            x = latents.to(dt)
            t = torch.ones((), dtype=torch.float32)
            if expand:
                # pipeline_wan.py: (mask[0][0][:, ::2, ::2] * t).flatten(), expanded to the batch
                ts = (mask[0][0][:, ::2, ::2] * t).flatten()
                timestep = ts.unsqueeze(0).expand(latents.shape[0], -1)
            else:
                timestep = t.expand(latents.shape[0])
            cond = m(
                hidden_states=x,
                timestep=timestep,
                encoder_hidden_states=prompt_embeds,
                return_dict=False,
            )[0]
            uncond = m(
                hidden_states=x,
                timestep=timestep,
                encoder_hidden_states=negative_prompt_embeds,
                return_dict=False,
            )[0]
            return uncond + GUIDANCE * (cond - uncond)

        steps[comp] = (make, call, "denoise")

    latents_std = vae.get("latents_std")
    vae_ch = lat[1]

    def vae_inputs() -> dict[str, Any]:
        return {
            "latents": _empty(*lat, dtype=vae_dt),
            # alive until __call__ returns: the loop's fp32 mask and the scheduler's state
            "held": [_empty(*lat, dtype=torch.float32) for _ in range(SOLVER_ORDER + 2)],
        }

    def vae_call(m: Any, *, latents: Any, **_: Any) -> Any:
        from diffusers.video_processor import VideoProcessor

        z = latents
        if latents_std is not None:
            mean = torch.zeros((1, vae_ch, 1, 1, 1), dtype=latents.dtype)
            inv_std = torch.ones((1, vae_ch, 1, 1, 1), dtype=latents.dtype)
            z = latents / inv_std + mean
        video = m.decode(z, return_dict=False)[0]
        del z
        processor = VideoProcessor(vae_scale_factor=s_comp)
        for i in range(video.shape[0]):
            # output_type "np": denormalize on the device, then .cpu(): the copy is freed
            frames_i = processor.postprocess(video[i].permute(1, 0, 2, 3), output_type="pt")
            del frames_i
        return video

    steps["vae"] = (vae_inputs, vae_call, "vae_decode")
    notes.append(
        f"WanPipeline: {frames} frames -> {lat[2]} latent frames of {lat[3]}x{lat[4]}; "
        f"the transformer runs twice per step (cond, then uncond: guidance {GUIDANCE}), "
        f"the UMT5 encoder twice (prompt, negative prompt) on {seq} tokens"
    )
    return steps, vae_dt, notes
