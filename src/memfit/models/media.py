"""Vision and speech inputs: what one sample of an image or audio model is, from its config.

Text models take ``--seq`` tokens; the models here take pixels or audio, and their workload is
said in their own terms (torch-free, read by both the trace engine and the reports):

* **images** (ViT, DeiT, DINOv2, Swin, ConvNeXt, SigLIP's vision tower, DETR): ``pixel_values``
  ``(batch, num_channels, image_size, image_size)``. ``image_size`` / ``num_channels`` come from
  the config (``vision_config`` for SigLIP) unless :class:`MediaSpec` sets them; a new size is
  written into the config, so the patch grid and the position table follow it (what
  ``from_pretrained(..., image_size=N, ignore_mismatched_sizes=True)`` builds; ``interpolate_pos_
  encoding=True`` runs the same activations with the old table). DETR's config has no image size:
  its image processor resizes the shortest edge to 800 (``DetrImageProcessor`` ``size=
  {"shortest_edge": 800, "longest_edge": 1333}``), so memfit uses 800 x 800 and adds the
  ``pixel_mask`` DETR takes.
* **speech** (Whisper): ``input_features`` ``(batch, num_mel_bins, 3000)``: the feature extractor
  pads every clip to one 30 s window (``WhisperFeatureExtractor``: ``chunk_length=30``,
  ``hop_length=160`` at 16 kHz = 100 frames a second; the encoder's two convolutions halve 3000
  frames to ``max_source_positions`` = 1500). Audio longer than 30 s is transcribed as
  transformers' ``generate()`` does it (sequential long-form: the whole ``input_features`` on the
  device, one 30 s window per sample at a time), so the peak is one window's plus the longer
  features; training takes clips of at most 30 s.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from memfit.errors import SpecError
from memfit.spec.media import MediaSpec

__all__ = ["describe_inputs", "media_kind", "with_media"]

#: model_type → where its image size lives ("": the config itself, else the nested key).
IMAGE_TYPES: dict[str, str] = {
    "vit": "",
    "deit": "",
    "beit": "",
    "dinov2": "",
    "swin": "",
    "convnext": "",
    "resnet": "",
    "siglip": "vision_config",
    "siglip_vision_model": "",
    "detr": "",
}
SPEECH_TYPES = ("whisper",)
#: Defaults of the config classes where config.json leaves a key out (transformers 5.23:
#: ViTConfig / SwinConfig / Dinov2Config ``image_size=224``, ``num_channels=3``,
#: SiglipVisionConfig ``image_size=224``; DETR: see the module docstring).
DEFAULT_IMAGE_SIZE = 224
DETR_IMAGE_SIZE = 800
DEFAULT_PATCH = {"vit": 16, "deit": 16, "beit": 16, "dinov2": 14, "swin": 4, "siglip": 16}
#: WhisperFeatureExtractor: 30 s windows of 3000 frames (hop 160 at 16 kHz).
WHISPER_WINDOW_S = 30
WHISPER_FRAMES_PER_S = 100


def media_kind(config: Mapping[str, Any] | None) -> str | None:
    """``"image"``, ``"audio"`` or None (a text model) for a config.json dict."""
    model_type = str((config or {}).get("model_type") or "")
    if model_type in IMAGE_TYPES:
        return "image"
    if model_type in SPEECH_TYPES:
        return "audio"
    return None


def with_media(config: dict[str, Any], media: MediaSpec, *, name: str) -> dict[str, Any]:
    """A copy of ``config`` built for ``media``'s images (``image_size`` / ``num_channels``:
    the patch grid and position table follow them); SpecError when the model takes no such
    input. The inputs themselves (DETR's image size, Whisper's seconds of audio) change no
    weight: they stay in the job (``WorkloadSpec.media``), which the engines read."""
    kind = media_kind(config)
    model_type = config.get("model_type")
    image_flags = media.image_size is not None or media.num_channels is not None
    if image_flags and kind != "image":
        raise SpecError(
            f"image_size / num_channels ({media.image_size!r} / {media.num_channels!r}) apply to "
            f"image models (ViT, DeiT, DINOv2, Swin, ConvNeXt, SigLIP, DETR), but {name} is "
            f"model_type {model_type!r}; drop --image-size / --num-channels"
        )
    if media.audio_seconds is not None and kind != "audio":
        raise SpecError(
            f"audio_seconds ({media.audio_seconds!r}) applies to speech models (Whisper), but "
            f"{name} is model_type {model_type!r}; drop --audio-seconds"
        )
    out = copy.deepcopy(config)
    if kind == "image":
        target = _image_config(out)
        # DetrConfig has no image size (its processor resizes): DETR's is the job's alone
        keys = ("num_channels",) if model_type == "detr" else ("image_size", "num_channels")
        for key in keys:
            if getattr(media, key) is not None:
                target[key] = getattr(media, key)
    return out


def buildable(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as memfit builds it: DETR's hub configs name a timm ResNet-50 backbone
    (``use_timm_backbone: true``); without timm (and never with pretrained weights) memfit builds
    transformers' own ResNet-50 backbone (``ResNetConfig`` defaults: the same depths and widths),
    which is what ``DetrConfig(use_timm_backbone=False)`` builds."""
    if config.get("model_type") != "detr" or not config.get("use_timm_backbone", True):
        return config
    out = dict(config)
    out.update(use_timm_backbone=False, use_pretrained_backbone=False, backbone=None)
    out.setdefault("backbone_config", None)
    return out


def _image_config(config: dict[str, Any]) -> dict[str, Any]:
    key = IMAGE_TYPES.get(str(config.get("model_type") or ""), "")
    if not key:
        return config
    sub = config.get(key)
    if not isinstance(sub, dict):
        sub = config[key] = {}
    return sub


def _int(value: Any, default: int) -> int:
    if isinstance(value, list | tuple) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def image_shape(config: Mapping[str, Any], media: MediaSpec | None = None) -> tuple[int, int]:
    """(num_channels, image_size) of one image for an image model's config (built for the job's
    ``media``; DETR's image size is the job's, its config has none)."""
    if config.get("model_type") == "detr":
        size = media.image_size if media is not None and media.image_size else DETR_IMAGE_SIZE
        return _int(config.get("num_channels"), 3), size
    sub = _image_config(dict(config)) if IMAGE_TYPES.get(str(config.get("model_type"))) else config
    return _int(sub.get("num_channels"), 3), _int(sub.get("image_size"), DEFAULT_IMAGE_SIZE)


def whisper_frames(config: Mapping[str, Any]) -> int:
    """Encoder input frames of one window: 2 x ``max_source_positions`` (the conv stride 2)."""
    return 2 * _int(config.get("max_source_positions"), 1500)


def audio_seconds(media: MediaSpec | None) -> float | None:
    """Seconds of audio per sample the job asks for (None: one 30 s window, the default)."""
    if media is None or media.audio_seconds is None:
        return None
    return float(media.audio_seconds)


def audio_windows(media: MediaSpec | None) -> int:
    seconds = audio_seconds(media)
    if seconds is None:
        return 1
    return max(1, math.ceil(seconds / WHISPER_WINDOW_S))


def describe_inputs(
    config: Mapping[str, Any], batch_size: int, seq_len: int, media: MediaSpec | None = None
) -> dict[str, Any]:
    """The workload in the model's terms (``{}`` for a text model): image size, patches and
    tokens; or audio seconds, 30 s windows, input_features and label tokens."""
    kind = media_kind(config)
    model_type = str(config.get("model_type") or "")
    if kind == "image":
        channels, size = image_shape(config, media)
        out: dict[str, Any] = {
            "kind": "image",
            "image_size": size,
            "num_channels": channels,
            "pixel_values": [batch_size, channels, size, size],
        }
        sub = _image_config(dict(config))
        patch = _int(sub.get("patch_size"), DEFAULT_PATCH.get(model_type, 0))
        if model_type in DEFAULT_PATCH and patch:
            grid = size // patch
            out["patches"] = grid * grid
            extra = {"vit": 1, "deit": 2, "dinov2": 1, "beit": 1}.get(model_type, 0)
            out["tokens"] = grid * grid + extra  # + [CLS] (DeiT: + distillation token)
        return out
    if kind == "audio":
        seconds = audio_seconds(media)
        mels = _int(config.get("num_mel_bins"), 80)
        total = WHISPER_WINDOW_S if seconds is None else seconds
        frames = max(whisper_frames(config), math.ceil(total * WHISPER_FRAMES_PER_S))
        return {
            "kind": "audio",
            "audio_seconds": total,
            "windows": audio_windows(media),
            "input_features": [batch_size, mels, frames],
            "encoder_positions": _int(config.get("max_source_positions"), 1500),
            "decoder_tokens": seq_len,
        }
    return {}


def inputs_phrase(inputs: Mapping[str, Any], batch_size: int, mode: str) -> str:
    """``batch 8 × 224×224 images (196 patches, 197 tokens)`` / ``batch 4 × 30 s audio ...``."""
    if inputs.get("kind") == "image":
        size = inputs["image_size"]
        text = f"batch {batch_size} × {size}×{size} images ({inputs['num_channels']} channels"
        if "patches" in inputs:
            text += f", {inputs['patches']} patches, {inputs['tokens']} tokens"
        return text + ")"
    seconds = inputs["audio_seconds"]
    windows = inputs["windows"]
    text = f"batch {batch_size} × {seconds:g} s audio ({windows} × 30 s window"
    text += "s" if windows > 1 else ""
    text += f", input_features {tuple(inputs['input_features'])}"
    if mode == "train":
        text += f", {inputs['decoder_tokens']} label tokens"
    return text + ")"
