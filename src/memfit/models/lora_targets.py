"""LoRA targets by role (``q,k,v,o,gate,up,down``, ``attention``, ``mlp``) in each family's names.

LitGPT, Unsloth and axolotl users write targets by role (``q,v``; ``attention``; ``mlp``); peft's
``LoraConfig(target_modules=...)`` wants the model's own module names, which differ per family
(``q_proj`` in Llama, ``c_attn`` in GPT-2, ``query_key_value`` in NeoX/Falcon/BLOOM, ``query`` in
BERT, ``q`` in T5). :func:`resolve_lora_targets` maps roles to names; literal module names pass
through unchanged, and ``all-linear`` stays peft's own keyword.

peft matches a target against the last component of a module's name (``peft.tuners.tuners_utils.
check_target_module_exists``: ``key == target or key.endswith("." + target)``), so where a family
fuses several roles into one projection (GPT-2's ``c_attn`` holds q, k and v; Phi-3's
``gate_up_proj``), or gives two roles the same leaf name (GPT-2's ``c_proj`` is both the attention
output and the MLP down projection; BERT's ``dense``), targeting one role adapts every role that
module serves: the notes say so. The tables are checked against the modules transformers builds
for every bundled family (``tests/models/test_lora_targets.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError

ROLES = ("q", "k", "v", "o", "gate", "up", "down")
#: Role groups (LitGPT's ``lora_query/.../lora_mlp`` switches, axolotl's ``lora_target_linear``).
GROUPS: dict[str, tuple[str, ...]] = {
    "attention": ("q", "k", "v", "o"),
    "mlp": ("gate", "up", "down"),
}

_LLAMA = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
}
_GPT2 = {"q": "c_attn", "k": "c_attn", "v": "c_attn", "o": "c_proj", "up": "c_fc", "down": "c_proj"}
_NEOX = {
    "q": "query_key_value",
    "k": "query_key_value",
    "v": "query_key_value",
    "o": "dense",
    "up": "dense_h_to_4h",
    "down": "dense_4h_to_h",
}
_FC = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "up": "fc1", "down": "fc2"}
_BERT = {"q": "query", "k": "key", "v": "value", "o": "dense", "up": "dense", "down": "dense"}

#: model_type → role → module leaf name, read from each family's modeling code in transformers.
#: Families not listed use Llama's names (``q_proj`` … ``down_proj``), which most current decoder
#: families share (Mistral, Qwen 2/3, Gemma 1-3, OLMo 2, Granite, Cohere …).
FAMILY_NAMES: dict[str, dict[str, str]] = {
    "gpt2": _GPT2,
    "gpt_bigcode": _GPT2,
    "gpt_neox": _NEOX,
    "falcon": _NEOX,
    "bloom": _NEOX,
    "opt": _FC,
    "clip": _FC,
    "phi": {**_FC, "o": "dense"},
    "vit": {**_FC, "o": "o_proj"},
    # transformers 5.2x vision / speech families (checked on the modules they build)
    "deit": {**_FC, "o": "o_proj"},
    "dinov2": {**_FC, "o": "o_proj"},
    "swin": {**_FC, "o": "o_proj"},
    "detr": {**_FC, "o": "o_proj"},
    "siglip": _FC,
    "whisper": _FC,
    "convnext": {"up": "pwconv1", "down": "pwconv2"},
    "phi3": {
        "q": "qkv_proj",
        "k": "qkv_proj",
        "v": "qkv_proj",
        "o": "o_proj",
        "gate": "gate_up_proj",
        "up": "gate_up_proj",
        "down": "down_proj",
    },
    "bert": _BERT,
    "roberta": _BERT,
    # T5: gated feed-forward (``feed_forward_proj: gated-*``, Flan-T5) has wi_0 / wi_1; see _t5.
    "t5": {"q": "q", "k": "k", "v": "v", "o": "o", "gate": "wi_0", "up": "wi_1", "down": "wo"},
}

#: Roles a family has no linear module for, with the reason shown to the user.
MISSING_ROLES: dict[str, dict[str, str]] = {
    "convnext": {
        role: "ConvNeXt has no attention (depthwise convolutions); its linear layers are the "
        "MLP's pwconv1 / pwconv2 (roles up, down)"
        for role in GROUPS["attention"]
    },
    "mixtral": {
        role: "Mixtral's experts are fused 3-D parameters in transformers 5 (MixtralExperts), "
        "not linear modules, so peft cannot wrap them by module name; target attention "
        "(q,k,v,o) instead"
        for role in GROUPS["mlp"]
    },
}


@dataclass(frozen=True, kw_only=True)
class LoraTargets:
    """What peft is given: module leaf names (or ``all-linear``), and what the mapping decided."""

    modules: tuple[str, ...] | str
    notes: tuple[str, ...] = ()


def role_names(model_type: str | None, config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """role → module leaf name for ``model_type`` (Llama's names for families not listed)."""
    names = dict(FAMILY_NAMES.get(model_type or "", _LLAMA))
    missing = MISSING_ROLES.get(model_type or "", {})
    for role in missing:
        names.pop(role, None)
    if model_type == "t5" and not str((config or {}).get("feed_forward_proj", "relu")).startswith(
        "gated"
    ):
        names = {**names, "up": "wi"}  # T5DenseActDense: one wi, no gate
        names.pop("gate")
    return names


def resolve_lora_targets(
    targets: tuple[str, ...] | str,
    model_type: str | None,
    config: Mapping[str, Any] | None = None,
) -> LoraTargets:
    """Map roles and role groups in ``targets`` to ``model_type``'s module names (see the module
    docstring); module names that are not roles pass through. SpecError for a role the family has
    no linear module for."""
    if isinstance(targets, str):  # all-linear: peft's own keyword
        return LoraTargets(modules=targets)
    names = role_names(model_type, config)
    missing = MISSING_ROLES.get(model_type or "", {})
    asked: list[str] = []
    modules: list[str] = []
    for target in targets:
        roles = GROUPS.get(target, (target,) if target in ROLES else ())
        if not roles or target in names.values():
            _add(modules, target)  # a literal module name (T5's q is both)
            continue
        for role in roles:
            if role in missing:
                raise SpecError(f"lora_targets ({target!r}): {missing[role]}")
            if role not in names:
                continue  # e.g. gate in a family whose MLP has no gate: the group skips it
            asked.append(role)
            _add(modules, names[role])
    if not modules:
        raise SpecError(
            f"lora_targets ({','.join(targets)}) name no linear module of {model_type!r}: its "
            f"roles are {', '.join(names)} ({', '.join(sorted(set(names.values())))})"
        )
    return LoraTargets(modules=tuple(modules), notes=_shared_notes(asked, names, model_type))


def _add(modules: list[str], name: str) -> None:
    if name not in modules:
        modules.append(name)


def _shared_notes(
    asked: list[str], names: dict[str, str], model_type: str | None
) -> tuple[str, ...]:
    """A note for every module that serves roles the user did not ask for."""
    notes = []
    for module in dict.fromkeys(names[r] for r in asked):
        serves = [r for r, n in names.items() if n == module]
        extra = [r for r in serves if r not in asked]
        if extra:
            notes.append(
                f"LoRA: {model_type}'s {module} serves {', '.join(serves)}; peft matches module "
                f"names, so adapting it for {', '.join(r for r in serves if r in asked)} adapts "
                f"{', '.join(extra)} too"
            )
    return tuple(notes)
