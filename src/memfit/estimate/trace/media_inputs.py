"""Inputs and the generation loop of the image and speech models (:mod:`memfit.models.media`).

* image classification: ``pixel_values`` (B, C, H, W) and, to train, ``labels`` (B,) (the head's
  cross-entropy is the loss, as HF's image-classification example trains);
* DETR object detection: ``pixel_values`` and ``pixel_mask`` (B, H, W) (``DetrImageProcessor``
  returns both). Training: DETR's Hungarian-matching loss calls scipy on real values, which fake
  tensors do not have, so memfit backpropagates the mean of the class logits and boxes instead:
  the same activations and gradients, without the loss's own (B x queries x targets) cost matrix;
* Whisper: ``input_features`` (B, num_mel_bins, 3000) and, to train, ``labels`` (B, seq) (the
  ``--seq`` label tokens, at most ``max_target_positions``). Inference follows ``generate()``:
  the encoder runs once per 30 s window, then the decoder starts from one token and decodes
  ``new_tokens`` with the self-attention cache growing and the cross-attention cache fixed at
  1500 positions. Audio longer than 30 s: transformers' sequential long-form ``generate()`` keeps
  the whole ``input_features`` (B, mels, 100 x seconds) on the device and decodes one window per
  sample at a time, so the window's peak repeats: memfit traces one window with the long features
  live (the chunked ``pipeline(chunk_length_s=30, batch_size=K)`` runs K windows at once: that is
  ``--batch K``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from memfit.errors import SpecError
from memfit.models import media
from memfit.spec import WorkloadSpec

TASKS = ("image-cls", "object-detection", "speech-seq2seq")


def media_inputs(
    config: dict[str, Any], workload: WorkloadSpec, task: str, *, cast_pixels: bool = False
) -> dict[str, Any]:
    """One micro-batch for ``task`` (create inside FakeTensorMode)."""
    b = workload.batch_size
    if task == "speech-seq2seq":
        return _speech(config, workload)
    channels, size = media.image_shape(config, workload.media)
    # the image processor's fp32 ``pixel_values``, as the Trainer passes them: the model casts
    # them to its weights' dtype itself (``ViTEmbeddings``: ``pixel_values.to(expected_dtype)``),
    # which is the copy the analytic ViT / CLIP programs count. A model that does not cast them
    # (Swin, ConvNeXt: their first convolution rejects fp32 input with bf16 weights) gets them in
    # its weights' dtype, as the user must pass them (``cast_pixels``: uncast_pixels_error)
    dtype = float_dtype(workload) if cast_pixels else torch.float32
    inputs: dict[str, Any] = {"pixel_values": torch.randn(b, channels, size, size, dtype=dtype)}
    if task == "object-detection":
        inputs["pixel_mask"] = torch.ones(b, size, size, dtype=torch.long)
    elif workload.is_train:
        inputs["labels"] = torch.zeros(b, dtype=torch.long)
    return inputs


def uncast_pixels_error(exc: BaseException, task: str) -> bool:
    """Whether ``exc`` is an image model's first layer rejecting the processor's fp32 pixels
    because the model does not cast them to its weights' dtype (then: pass them cast)."""
    text = str(exc)
    return (
        task in ("image-cls", "object-detection")
        and isinstance(exc, RuntimeError)
        and "Input type (float)" in text
        and "should be the same" in text
    )


def float_dtype(workload: WorkloadSpec) -> torch.dtype:
    """The dtype of the pixel / feature tensors: the processor's fp32 moved to the weights' dtype
    (``inputs.to(model.dtype)``, as HF's examples do; a mixed run keeps fp32 weights)."""
    from memfit.estimate.trace.build import PARAM_DTYPE

    return PARAM_DTYPE[workload.run_precision]


def speech_problems(config: dict[str, Any], workload: WorkloadSpec) -> list[str]:
    """Why a Whisper job cannot run as asked (label length, clip length)."""
    out = []
    limit = config.get("max_target_positions") or 448  # WhisperConfig default
    tokens = workload.seq_len if workload.is_train else workload.new_tokens + 1
    if tokens > limit:
        what = f"seq ({workload.seq_len}) label" if workload.is_train else "new_tokens + 1"
        out.append(
            f"{what} tokens exceed Whisper's {limit} decoder positions (max_target_positions); "
            f"pass {'--seq' if workload.is_train else '--new-tokens'} of at most "
            f"{limit if workload.is_train else limit - 1}"
        )
    seconds = media.audio_seconds(workload.media)
    if workload.is_train and seconds is not None and seconds > media.WHISPER_WINDOW_S:
        out.append(
            f"audio_seconds ({seconds:g}) exceeds Whisper's 30 s window: training takes clips "
            "of at most 30 s (split the audio into segments); long-form audio is for --mode infer"
        )
    return out


def _speech(config: dict[str, Any], workload: WorkloadSpec) -> dict[str, Any]:
    if problems := speech_problems(config, workload):
        raise SpecError.from_problems(problems)
    b = workload.batch_size
    mels = int(config.get("num_mel_bins") or 80)
    window = media.whisper_frames(config)
    seconds = media.audio_seconds(workload.media)
    frames = window
    if seconds is not None:
        frames = max(window, math.ceil(seconds * media.WHISPER_FRAMES_PER_S))
    features = torch.randn(b, mels, frames, dtype=float_dtype(workload))
    inputs: dict[str, Any] = {"input_features": features}
    if workload.is_train:
        vocab = int(config.get("vocab_size") or 51865)
        inputs["labels"] = torch.randint(0, vocab, (b, workload.seq_len))
    return inputs


def run_speech_generation(
    model: torch.nn.Module, inputs: dict[str, Any], workload: WorkloadSpec, tracker: Any
) -> None:
    """generate() for Whisper: the encoder on the first window, then the decoder loop."""
    from memfit.estimate.trace import steps

    features = inputs["input_features"]
    window = 2 * int(getattr(model.config, "max_source_positions", 1500))
    tracker.set_phase("prefill")
    encoder_outputs = model.get_encoder()(input_features=features[:, :, :window])  # type: ignore[operator]
    start = torch.zeros(features.shape[0], 1, dtype=torch.long)
    out = model(encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True)
    token, cache = steps.next_token(out, tracker), out.past_key_values
    del out
    tracker.set_phase("decode")
    for step in steps.decode_steps(workload.new_tokens):
        if step > steps.MAX_TRACED_DECODE_STEPS:
            steps.grow_cache(cache.self_attention_cache, workload.new_tokens - 1, tracker)
        out = model(
            encoder_outputs=encoder_outputs,
            decoder_input_ids=token,
            past_key_values=cache,
            use_cache=True,
        )
        token = steps.next_token(out, tracker)
        del out


def detection_loss(out: Any) -> torch.Tensor:
    """The stand-in loss of a DETR training step (see the module docstring)."""
    return out.logits.float().mean() + out.pred_boxes.float().mean()
