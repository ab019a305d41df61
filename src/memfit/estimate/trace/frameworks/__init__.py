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
unsloth     (none)                 not installable here: see :data:`UNSUPPORTED`
==========  =====================  ====================================================

This module imports neither torch nor a framework: :func:`missing` answers from the import
system's finder, so the CLI can route (or say what to install) in microseconds.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from memfit.errors import MissingDependencyError
from memfit.hardware.catalog import get_gpu

#: Framework → (importable top-level package, the memfit extra that installs it).
EXTRAS = {"torchtune": ("torchtune", "torchtune"), "litgpt": ("litgpt", "litgpt")}

#: Frameworks memfit cannot run on this kind of machine, and exactly why (checked with pip
#: against torch 2.13.0+cpu / transformers 5.23, docs/frameworks.md).
UNSUPPORTED = {
    "torchtitan": "torchtitan 0.3.0 (the newest on PyPI) pins datasets<4.8 (which needs fsspec "
    "<=2026.2, older than torch 2.13's environment here) and its model package imports triton "
    "(torchtitan/distributed/minimal_async_ep/kernels.py), a CUDA compiler; its Llama is built "
    "for torchrun with a DeviceMesh. memfit estimates torchtitan jobs with Hugging Face's Llama "
    "and its own FSDP2 model (--engine trace --shard fsdp)",
    "unsloth": "unsloth 2026.10.9 (the newest on PyPI) requires transformers<=5.17.0 (memfit's "
    "environment pins 5.23: installing it would downgrade transformers), plus xformers and "
    "triton for its CUDA kernels; memfit estimates Unsloth jobs with transformers' model and "
    "the job's settings",
}


def missing(framework: str) -> str | None:
    """None when ``framework``'s package can be imported, else the one-line reason."""
    if framework in UNSUPPORTED:
        return f"{framework} cannot be traced: {UNSUPPORTED[framework]}"
    package, extra = EXTRAS[framework]
    if importlib.util.find_spec(package) is None:
        how = f"pip install 'memfit[{extra}]'" + (
            " && pip install --no-deps litgpt==0.5.13" if framework == "litgpt" else ""
        )
        return (
            f"{framework} is not installed: {how} to trace the job through its own model and step"
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
    framework: str, data: dict[str, Any], workload: Any, *, gpu: Any = None, **options: Any
) -> Any:
    """The :class:`~memfit.estimate.result.MemoryEstimate` of the job ``data`` (the parsed
    recipe / config, overrides applied) describes, traced through ``framework``'s own code.
    ``options``: the framework engine's own (LitGPT: ``bnb_version``)."""
    require(framework)
    if isinstance(gpu, str):
        gpu = get_gpu(gpu)
    if framework == "torchtune":
        from memfit.estimate.trace.frameworks.torchtune import trace_torchtune

        return trace_torchtune(data, workload, gpu=gpu)
    from memfit.estimate.trace.frameworks.litgpt import trace_litgpt

    return trace_litgpt(data, workload, gpu=gpu, **options)


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
