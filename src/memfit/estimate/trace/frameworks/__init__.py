"""Frameworks' own models and training steps, traced on fake tensors (issue 15 part 2).

The same architecture trained through another framework is another program: torchtune builds its
own ``TransformerDecoder`` and runs its recipe's step (chunked cross-entropy, its activation
checkpointing and offloading, the optimizer fused into backward); LitGPT builds its own ``GPT``
and quantizes with Lightning's ``BitsandbytesPrecision``, which converts every ``nn.Linear``
(the LM head too) where transformers leaves the output embeddings alone. memfit answers for those
jobs by running that framework's code, when it is installed:

==========  =====================  ====================================================
framework   extra                  what runs
==========  =====================  ====================================================
torchtune   ``memfit[torchtune]``  its model builder + the recipe's step (torchtune.py)
litgpt      ``memfit[litgpt]``     ``litgpt.GPT`` / ``litgpt.lora.GPT`` + finetune step
torchtitan  (none)                 not installable here: see :data:`UNSUPPORTED`
unsloth     (none)                 needs an NVIDIA GPU at import: see :data:`UNSUPPORTED`
==========  =====================  ====================================================

This module imports neither torch nor a framework: :func:`missing` answers from the import
system's finder, so the CLI can route (or say what to install) in microseconds.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from memfit.errors import MissingDependencyError

#: Framework → (importable top-level package, the memfit extra that installs it).
EXTRAS = {"torchtune": ("torchtune", "torchtune"), "litgpt": ("litgpt", "litgpt")}

#: Frameworks memfit cannot run on this kind of machine, and exactly why (checked with pip
#: against torch 2.13.0+cpu / transformers 5.23, docs/frameworks.md).
UNSUPPORTED = {
    "torchtitan": "torchtitan 0.3.0 (the newest on PyPI) needs spmd_types==0.2.3 and "
    "torch_checkpointing and builds its Llama only inside `torchrun` with a real process group "
    "and DeviceMesh over CUDA/NCCL; memfit estimates torchtitan jobs with Hugging Face's Llama "
    "and its own FSDP2 model (--engine trace --shard fsdp2)",
    "unsloth": "unsloth 2026.10.9 raises at import without an NVIDIA GPU (its Triton kernels), "
    "pins transformers<=5.17.0 (memfit's tests pin 5.23) and pulls xformers/triton; memfit "
    "estimates Unsloth jobs with transformers' model and the job's settings",
}


def missing(framework: str) -> str | None:
    """None when ``framework``'s package can be imported, else the one-line reason."""
    if framework in UNSUPPORTED:
        return f"{framework} cannot be traced: {UNSUPPORTED[framework]}"
    package, extra = EXTRAS[framework]
    if importlib.util.find_spec(package) is None:
        return (
            f"{framework} is not installed: pip install 'memfit[{extra}]' to trace the job "
            f"through {framework}'s own model and step"
        )
    return None


def require(framework: str) -> None:
    reason = missing(framework)
    if reason is not None:
        raise MissingDependencyError(reason)


#: What each framework engine says answered (the ``engine_reason`` of its estimate).
ANSWERED_BY = {
    "torchtune": "torchtune's model + recipe step",
    "litgpt": "LitGPT's model + finetune step",
}


def estimate_with_framework(
    framework: str, data: dict[str, Any], workload: Any, *, gpu: Any = None
) -> Any:
    """The :class:`~memfit.estimate.result.MemoryEstimate` of the job ``data`` (the parsed
    recipe / config, overrides applied) describes, traced through ``framework``'s own code."""
    require(framework)
    if framework == "torchtune":
        from memfit.estimate.trace.frameworks.torchtune import trace_torchtune

        return trace_torchtune(data, workload, gpu=gpu)
    from memfit.estimate.trace.frameworks.litgpt import trace_litgpt

    return trace_litgpt(data, workload, gpu=gpu)


def finish(est: Any, workload: Any, framework: str, notes: list[str]) -> Any:
    """``est`` (from :func:`memfit.trace_step`) as the job's estimate: the job's workload, the
    engine named by the framework, and what the framework run assumed."""
    import dataclasses

    return dataclasses.replace(
        est,
        workload=workload.normalized(),
        engine_reason=ANSWERED_BY[framework],
        trace={**est.trace, "framework": framework},
        notes=[*est.notes, *notes],
    )
