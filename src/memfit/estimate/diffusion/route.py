"""Which engine answers a diffusion pipeline's inference call (torch-free).

:func:`estimate_pipeline` reads the tree, then, under ``--engine auto`` (the default) or
``derived``, answers from the shipped forms of a bundled pipeline
(:mod:`memfit.estimate.diffusion.derived`: no torch, no trace); a job whose records are not all
shipped, ``--engine trace`` and ``--confirm`` go to the trace
(:mod:`memfit.estimate.diffusion.pipelines`, torch and diffusers, imported only then). Both kinds
of answer are kept in the trace cache (:func:`memfit.estimate.diffusion.answer.kept_answer`),
each under its own key, so a repeated call is a cache read and ``--engine trace`` never reads a
derived answer.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from memfit.estimate.diffusion.answer import NotDerived, PipelineEstimate, kept_answer, read_tree
from memfit.estimate.diffusion.derived import derived_pipeline
from memfit.spec.diffusion import DiffusionJob


def engine_asked() -> str:
    """``trace`` under ``--engine trace`` or ``--confirm``, else the engine asked (``auto`` and
    ``derived`` read the shipped forms; any other engine has no pipeline program: the trace).
    The policy module is imported only where a command set either (memfit.estimate.options), so
    a default command reads neither here."""
    policy = sys.modules.get("memfit.estimate.policy")
    if policy is None:
        return "auto"
    if policy.confirming():
        return "trace"
    return str(policy.active().engine)


def estimate_pipeline(
    root: Path, job: DiffusionJob, *, name: str, gpu: Any = None
) -> PipelineEstimate:
    """The call ``job`` of the pipeline at ``root``: each component's forward, the stages
    composed; with ``gpu`` (a catalog record) the answer carries THE verdict on it (``fits``).
    Derived where the forms are shipped, else traced (module docstring)."""
    index, configs = read_tree(root)
    parts = {"pipeline": {"index": index, "configs": configs}, "job": repr(job), "gpu": repr(gpu)}
    if engine_asked() in ("auto", "derived"):
        try:
            est = kept_answer(
                {**parts, "engine": "derived"},
                lambda: derived_pipeline(root, index, configs, job, name=name, gpu=gpu),
            )
            return est if est.name == name else replace(est, name=name)
        except NotDerived:
            pass  # a record is not shipped: the trace answers

    def run() -> PipelineEstimate:
        from memfit.estimate.diffusion.pipelines import traced_pipeline

        return traced_pipeline(root, index, configs, job, name=name, gpu=gpu)

    est = kept_answer(parts, run)
    return est if est.name == name else replace(est, name=name)
