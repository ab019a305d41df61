"""Which analytic family a config.json is: ``model_type`` → its declaration.

Every family the analytic engine models is one entry of :data:`FAMILIES`: a
:class:`~memfit.estimate.analytic.decoder.DecoderFamily` declared over the block vocabulary
(``families.py``, ``families_gpt.py``, ``families_falcon.py``) or a
:class:`~memfit.estimate.analytic.decoder.CustomFamily` whose program composes its own step
(``families_enc.py``, ``families_t5.py``, ``families_clip.py``). A declaration names the
model_types it covers, how its config is read (``read_arch``) and the program that runs it
(``program_for``). Every declaration at the top level of a family module is registered: adding
a family is declaring it and testing it against the trace (docs/decisions.md, "Analytic
families").
"""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic import (
    families,
    families_clip,
    families_deepseek,
    families_enc,
    families_falcon,
    families_gpt,
    families_gptoss,
    families_t5,
    families_whisper,
)
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.decoder import CustomFamily, DecoderFamily
from memfit.estimate.tasks import resolve_task as resolve_task  # the trace engine's rules

Family = DecoderFamily | CustomFamily
#: The modules whose declarations are the analytic engine's families.
FAMILY_MODULES = (
    families,
    families_gpt,
    families_falcon,
    families_enc,
    families_t5,
    families_clip,
    families_deepseek,
    families_gptoss,
    families_whisper,
)


def _declared() -> tuple[Family, ...]:
    """Every family declared at the top level of ``FAMILY_MODULES``, in module order (a
    declaration another module imports, e.g. as ``like=``, counts once)."""
    seen: dict[int, Family] = {}
    for module in FAMILY_MODULES:
        for value in vars(module).values():
            if isinstance(value, DecoderFamily | CustomFamily):
                seen.setdefault(id(value), value)
    return tuple(seen.values())


#: Every family with closed forms.
FAMILIES: tuple[Family, ...] = _declared()
#: model_type → its family's declaration.
BY_MODEL_TYPE: dict[str, Family] = {mt: f for f in FAMILIES for mt in f.model_types}
#: model_type → family name (the Arch's ``family``).
FAMILY_OF: dict[str, str] = {mt: f.name for mt, f in BY_MODEL_TYPE.items()}
_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}


def supports(config: dict[str, Any] | None) -> bool:
    """Whether the analytic engine has closed forms for this config.json dict's ``model_type``
    (the workload may still name a setting not modelled)."""
    if not config:
        return False
    return str(config.get("model_type", "")) in BY_MODEL_TYPE


def family_of(model_type: str) -> Family:
    """The declaration of ``model_type``; SpecError listing the supported ones otherwise."""
    family = BY_MODEL_TYPE.get(model_type)
    if family is None:
        raise SpecError(
            f"the analytic engine has no closed forms for model_type {model_type!r} "
            f"(supported: {', '.join(sorted(BY_MODEL_TYPE))}); use --engine trace"
        )
    return family


def read_arch(config: dict[str, Any]) -> Arch:
    """The :class:`Arch` of a config.json dict; SpecError naming the model_type otherwise."""
    model_type = str(config.get("model_type", ""))
    return family_of(model_type).read(config)


def program_for(arch: Arch, task: str, *, lora_rank: int | None = None) -> Any:
    """The program that runs ``arch`` for ``task``; SpecError for what it does not model."""
    family = _BY_NAME.get(arch.family)
    if family is None:
        raise SpecError(
            f"the analytic engine has no layer program for model_type {arch.model_type!r} yet; "
            "use --engine trace"
        )
    prog = family.make(arch)
    if arch.n_experts and lora_rank:
        raise SpecError(
            f"lora_rank with a mixture-of-experts model ({arch.model_type!r}) is not modelled by "
            "the analytic engine (peft's targets among 3-D expert weights); use --engine trace"
        )
    tasks = getattr(prog, "tasks", ("causal-lm",))
    if task not in tasks:
        raise SpecError(
            f"task ({task!r}) is not modelled by the analytic engine for {arch.model_type!r} "
            f"(modelled: {', '.join(tasks)}); use --engine trace"
        )
    return prog


__all__ = [
    "BY_MODEL_TYPE",
    "FAMILIES",
    "FAMILY_OF",
    "Family",
    "family_of",
    "program_for",
    "read_arch",
    "resolve_task",
    "supports",
]
