"""What ``task="auto"`` means for a config: one rule set for both engines (torch-free)."""

from __future__ import annotations

from typing import Any

#: Vision model types (image classification when traced).
VISION_TYPES = ("vit", "deit", "beit", "swin", "convnext", "dinov2", "resnet")


def resolve_task(config: dict[str, Any], task: str) -> str:
    """The task ``auto`` means, from ``model_type`` and ``architectures``."""
    if task != "auto":
        return task
    model_type = config.get("model_type", "")
    archs = " ".join(config.get("architectures") or [])
    if model_type == "clip":
        return "clip"
    if model_type in VISION_TYPES or "ImageClassification" in archs:
        return "image-cls"
    if config.get("is_encoder_decoder"):
        return "seq2seq"
    if "CausalLM" in archs or "LMHead" in archs:
        return "causal-lm"
    if "SequenceClassification" in archs or "MaskedLM" in archs or archs.endswith("Model"):
        return "seq-cls"
    return "causal-lm"
