"""What ``task="auto"`` means for a config, and the positions it allows: one rule set for both
engines (torch-free), read from the model's :class:`~memfit.models.model_spec.ModelSpec`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.models.model_spec import VISION_TYPES as VISION_TYPES  # re-exported
from memfit.models.model_spec import ModelSpec


def resolve_task(config: Mapping[str, Any] | ModelSpec, task: str) -> str:
    """The task ``auto`` means, from ``model_type`` and ``architectures``
    (:attr:`ModelSpec.task`)."""
    if task != "auto":
        return task
    return ModelSpec.of(config).task


#: Families with learned absolute position embeddings: (config key, positions the padding offset
#: takes) — a longer sequence indexes past the table (a device-side assert on CUDA). Rotary,
#: ALiBi and relative-bias families have no such limit. The table's size is the spec's
#: ``max_positions`` (the config class's default where config.json omits the key).
LEARNED_POSITIONS: dict[str, tuple[str, int]] = {
    "gpt2": ("n_positions", 0),
    "gpt_bigcode": ("n_positions", 0),
    "opt": ("max_position_embeddings", 0),
    "bert": ("max_position_embeddings", 0),
    "roberta": ("max_position_embeddings", 2),  # positions start after padding_idx + 1
}


def position_problems(
    config: Mapping[str, Any] | ModelSpec,
    seq_len: int,
    new_tokens: int = 0,
    *,
    generative: bool = False,
) -> list[str]:
    """Why ``seq_len`` (plus the generated tokens) does not fit the model's learned positions."""
    spec = ModelSpec.of(config)
    model_type = spec.model_type or ""
    if model_type == "clip":
        text = spec.text.max_positions if spec.text is not None else None
        limit, what = text or 77, "text positions"  # CLIPTextConfig.max_position_embeddings
    elif model_type in LEARNED_POSITIONS and spec.max_positions is not None:
        key, offset = LEARNED_POSITIONS[model_type]
        limit = spec.max_positions - offset
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
