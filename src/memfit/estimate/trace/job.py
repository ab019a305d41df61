"""A Hugging Face job as the trace engine traces it: the checks, the prepared workload, the layer
stacks with their target counts, and the config and workload of one run at given layer counts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from memfit.errors import NotModelledError
from memfit.estimate import sharding
from memfit.estimate.pipeline import (
    check_freeze_depth,
    check_generation,
    check_gpu,
    check_positions,
    check_tp,
    prepare_workload,
)
from memfit.estimate.trace import build
from memfit.models import media
from memfit.spec import WorkloadSpec

#: Workload settings the trace engine does not model yet, with their default value.
UNSUPPORTED_DEFAULTS: dict[str, Any] = {}
#: Optimizer names the trace engine cannot run (all of ``spec.OPTIMIZERS`` run today).
UNSUPPORTED_OPTIMIZERS: tuple[str, ...] = ()


def reject_unsupported(workload: WorkloadSpec) -> None:
    """NotModelledError naming the settings the trace engine does not model."""
    bad = [
        f"{k}={getattr(workload, k)!r}"
        for k, default in UNSUPPORTED_DEFAULTS.items()
        if getattr(workload, k) != default
    ]
    if workload.optimizer in UNSUPPORTED_OPTIMIZERS:
        bad.append(f"optimizer={workload.optimizer!r}")
    if bad:
        raise NotModelledError(
            f"the trace engine does not model {', '.join(bad)} yet", engine="trace"
        )


@dataclass(frozen=True)
class Job:
    """The buildable config, the prepared workload (and the notes saying what changed), the
    task, and the layer stacks with their target, period and prefix counts (frozen layers as
    a stack of their own, ``frozen``)."""

    config: dict[str, Any]
    workload: WorkloadSpec
    notes: list[str]
    task: str
    stacks: list[build.LayerVar]
    targets: dict[str, int]
    period: dict[str, int]
    prefix: dict[str, int]

    @property
    def traced(self) -> WorkloadSpec:
        """The workload whose step is traced (:func:`memfit.estimate.sharding.
        traced_step_workload`: under ZeRO, ``adamw-fused`` runs torch's ``adamw`` step)."""
        return sharding.traced_step_workload(self.workload)


def prepare_job(
    config: dict[str, Any], workload: WorkloadSpec, gpu: Any, trust_remote_code: bool
) -> Job:
    """The job of ``config`` and ``workload``, checked (SpecError / NotModelledError)."""
    config = media.buildable(config)  # DETR without timm: models/media.py
    workload, prepared_notes = prepare_workload(config, workload)
    reject_unsupported(workload)
    check_gpu(workload, gpu)
    task = build.resolve_task(config, workload.task)
    check_generation(workload, task)
    check_positions(config, workload, task)
    check_tp(config, workload, engine="trace")
    stacks = build.layer_plan(config, trust_remote_code)
    targets = {v.name: v.count for v in stacks}
    period = {v.name: v.period for v in stacks}
    prefix = {v.name: v.prefix for v in stacks}
    check_freeze_depth(workload, stacks[0].count if stacks else 0)
    if workload.freeze_layers:
        first = stacks[0].name
        targets["frozen"] = workload.freeze_layers
        targets[first] -= workload.freeze_layers
        period["frozen"] = period[first]
    return Job(config, workload, prepared_notes, task, stacks, targets, period, prefix)


def run_config(
    config: dict[str, Any],
    workload: WorkloadSpec,
    stacks: list[build.LayerVar],
    counts: dict[str, int],
    trust_remote_code: bool,
) -> tuple[dict[str, Any], WorkloadSpec]:
    """The config with ``counts`` layers (frozen ones part of the first stack) and the workload
    with its frozen layers: what one run traces."""
    layer_counts = dict(counts)
    frozen = layer_counts.pop("frozen", 0)
    if frozen:
        layer_counts[stacks[0].name] += frozen
    cfg = (
        build.with_layer_counts(config, stacks, layer_counts, trust_remote_code)
        if stacks
        else config
    )
    return cfg, dataclasses.replace(workload, freeze_layers=frozen)
