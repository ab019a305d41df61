"""Which layer program a config runs, and which task its architecture name implies."""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.families import LlamaProgram
from memfit.estimate.analytic.families_clip import ClipProgram
from memfit.estimate.analytic.families_enc import BertProgram, ViTProgram
from memfit.estimate.analytic.families_falcon import BloomProgram, falcon_program
from memfit.estimate.analytic.families_gpt import (
    BigCodeProgram,
    GPT2Program,
    NeoXProgram,
    OPTProgram,
    PhiProgram,
)
from memfit.estimate.analytic.families_moe import Gemma2Program, MixtralProgram, Phi3Program
from memfit.estimate.analytic.families_t5 import T5Program
from memfit.estimate.tasks import resolve_task as resolve_task  # the trace engine's rules

PROGRAMS: dict[str, Any] = {
    "llama": LlamaProgram,
    "gpt2": GPT2Program,
    "bigcode": BigCodeProgram,
    "neox": NeoXProgram,
    "opt": OPTProgram,
    "bert": BertProgram,
    "phi3": Phi3Program,
    "mixtral": MixtralProgram,
    "gemma2": Gemma2Program,
    "vit": ViTProgram,
    "phi": PhiProgram,
    "falcon": falcon_program,
    "bloom": BloomProgram,
    "t5": T5Program,
    "clip": ClipProgram,
}


def program_for(arch: Arch, task: str, *, lora_rank: int | None = None) -> Any:
    cls = PROGRAMS.get(arch.family)
    if cls is None:
        raise SpecError(
            f"the analytic engine has no layer program for model_type {arch.model_type!r} yet; "
            "use --engine trace"
        )
    prog = cls(arch)
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
