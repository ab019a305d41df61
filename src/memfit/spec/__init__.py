"""Validated, frozen inputs: what job is being estimated.

A :class:`WorkloadSpec` says *what the user's job runs*. It is one flat keyword record (the public
API: ``WorkloadSpec(batch_size=4, lora_rank=16)``, ``w.batch_size``, ``dataclasses.replace``)
composed of three parts, each a record of its own that validates its fields:

- :class:`ShapeSpec` (``w.shape``): mode, batch, sequence, new tokens, task, gradient accumulation;
- :class:`TechniqueSpec` (``w.techniques``): precision, attention, checkpointing, optimizer,
  :class:`LoraSpec` (or None), freezing, :class:`QuantSpec`, ``zero_grad_set_to_none``;
- :class:`ParallelSpec` (``w.parallel``): GPUs, tensor parallelism, sharding, offload (and dp).

A WorkloadSpec is validated once in ``__post_init__`` and every problem is reported together,
each naming the field (by its flat name), the value and the rule. The rules live in one table
(:data:`FIELD_RULES`) that the records and the WorkloadSpec share, so a record and the workload
refuse a value with the same words. ``docs/decisions.md`` says why the flat fields are the inputs.

The other jobs share that vocabulary (precision names, checkpointing, optimizers): a diffusion
pipeline call (:class:`DiffusionJob`) and training run (:class:`DiffusionTrainJob`), a ``vllm
serve`` configuration (:class:`VllmConfig`), a ``llama-server`` one (:class:`LlamaCppJob`)
and a variable-length training run (:class:`SeqRun`
over a :class:`SeqDist`). :class:`MediaSpec` says what one image or audio sample is;
:class:`EstimateOptions` says how a job is answered (engine, caches, code), not what it is.
All are torch-free.
"""

from __future__ import annotations

from memfit.spec.diffusion import DiffusionJob, DiffusionTrainJob
from memfit.spec.llamacpp import LlamaCppJob
from memfit.spec.media import MediaSpec
from memfit.spec.options import EstimateOptions
from memfit.spec.parts import LoraSpec, ParallelSpec, QuantSpec, ShapeSpec, TechniqueSpec
from memfit.spec.rules import (  # FSDP2 (par-a)
    ATTENTIONS,
    CACHE_IMPLEMENTATIONS,
    CHECKPOINTING,
    COMPUTE_DTYPES,
    FIELD_RULES,
    FSDP_MIXED_POLICY,
    KERNELS,
    LOSSES,
    MAX_BATCH_SIZE,
    MAX_GPUS,
    MAX_GRAD_ACCUM,
    MAX_SEQ_LEN,
    MODES,
    OFFLOADS,
    OPTIMIZERS,
    PARTITIONING_SHARDS,
    PRECISION_ALIASES,
    PRECISION_NAMES,
    PRECISION_RULES,
    PRECISIONS,
    QUANTS,
    SHARDS,
    TASKS,
    UNSLOTH_DEFAULTS,
    Mode,
    PrecisionRule,
    default_precision,
    default_precision_note,
    fsdp_mixed_policy,
    precision_rule,
    resolve_precision,
    with_kernel_defaults,
)
from memfit.spec.seqrun import SeqDist, SeqRun, StepPlan
from memfit.spec.serving import VllmConfig
from memfit.spec.sglang import SglangConfig
from memfit.spec.workload import PARALLEL_FIELDS, SHAPE_FIELDS, TECHNIQUE_FIELDS, WorkloadSpec

#: Every kind of job memfit answers; ``memfit.api`` dispatches on the type (docs/job-kinds.md).
Job = (
    WorkloadSpec | SeqRun | DiffusionJob | DiffusionTrainJob | VllmConfig | SglangConfig
    | LlamaCppJob
)  # fmt: skip

__all__ = [
    "Job",
    "ATTENTIONS",
    "CACHE_IMPLEMENTATIONS",
    "CHECKPOINTING",
    "KERNELS",
    "LOSSES",
    "UNSLOTH_DEFAULTS",
    "with_kernel_defaults",
    "COMPUTE_DTYPES",
    "FIELD_RULES",
    "MAX_BATCH_SIZE",
    "MAX_GPUS",
    "MAX_GRAD_ACCUM",
    "MAX_SEQ_LEN",
    "MODES",
    "OFFLOADS",
    "OPTIMIZERS",
    "PARALLEL_FIELDS",
    "PARTITIONING_SHARDS",
    "PRECISIONS",
    "PRECISION_ALIASES",
    "PRECISION_NAMES",
    "PRECISION_RULES",
    "QUANTS",
    "SHAPE_FIELDS",
    "SHARDS",
    "TASKS",
    "TECHNIQUE_FIELDS",
    "DiffusionJob",
    "DiffusionTrainJob",
    "EstimateOptions",
    "LoraSpec",
    "MediaSpec",
    "Mode",
    "ParallelSpec",
    "PrecisionRule",
    "QuantSpec",
    "SeqDist",
    "SeqRun",
    "SglangConfig",
    "ShapeSpec",
    "StepPlan",
    "TechniqueSpec",
    "VllmConfig",
    "WorkloadSpec",
    "LlamaCppJob",
    "precision_rule",
    "default_precision",
    "default_precision_note",
    "resolve_precision",
    # FSDP2 (par-a)
    "FSDP_MIXED_POLICY",
    "fsdp_mixed_policy",
]
