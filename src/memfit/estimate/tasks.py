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


#: Families with learned absolute position embeddings: (config key, positions the padding offset
#: takes) — a longer sequence indexes past the table (a device-side assert on CUDA). Rotary,
#: ALiBi and relative-bias families have no such limit.
LEARNED_POSITIONS: dict[str, tuple[str, int]] = {
    "gpt2": ("n_positions", 0),
    "gpt_bigcode": ("n_positions", 0),
    "opt": ("max_position_embeddings", 0),
    "bert": ("max_position_embeddings", 0),
    "roberta": ("max_position_embeddings", 2),  # positions start after padding_idx + 1
}
#: transformers' config defaults for the keys above (absent from a config.json).
_DEFAULT_POSITIONS = {"gpt2": 1024, "gpt_bigcode": 1024, "opt": 2048, "bert": 512, "roberta": 514}


def position_problems(
    config: dict[str, Any], seq_len: int, new_tokens: int = 0, *, generative: bool = False
) -> list[str]:
    """Why ``seq_len`` (plus the generated tokens) does not fit the model's learned positions."""
    model_type = str(config.get("model_type", ""))
    if model_type == "clip":
        text = config.get("text_config") or {}
        limit, what = int(text.get("max_position_embeddings") or 77), "text positions"
    elif model_type in LEARNED_POSITIONS:
        key, offset = LEARNED_POSITIONS[model_type]
        limit = int(config.get(key) or _DEFAULT_POSITIONS[model_type]) - offset
        what = f"learned positions ({key})"
    else:
        return []
    needed = seq_len + (new_tokens - 1 if generative and new_tokens > 1 else 0)
    if needed <= limit:
        return []
    room = f"seq_len + new_tokens - 1 ({needed})" if needed != seq_len else f"seq_len ({seq_len})"
    fix = limit - needed + seq_len
    hint = f"pass --seq {fix} or less" if fix > 0 else "pass fewer --new-tokens"
    return [f"{room} exceeds {model_type}'s {limit} {what}; {hint}"]
