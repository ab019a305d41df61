"""Which layer program a config runs, and which task its architecture name implies."""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.families import LlamaProgram
from memfit.estimate.analytic.families_enc import BertProgram, ViTProgram
from memfit.estimate.analytic.families_falcon import BloomProgram, FalconProgram
from memfit.estimate.analytic.families_gpt import (
    BigCodeProgram,
    GPT2Program,
    NeoXProgram,
    OPTProgram,
    PhiProgram,
)
from memfit.estimate.analytic.families_moe import Gemma2Program, MixtralProgram, Phi3Program

#: Vision model types (memfit's trace: ``VISION_TYPES`` in trace/build.py).
VISION_TYPES = ("vit", "deit", "beit", "swin", "convnext", "dinov2", "resnet")

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
    "falcon": FalconProgram,
    "bloom": BloomProgram,
}


def resolve_task(config: dict[str, Any], task: str) -> str:
    """The task ``auto`` means, from ``model_type`` and ``architectures`` — the same rules as the
    trace engine (``trace/build.py:resolve_task``), without importing it (it needs torch)."""
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
