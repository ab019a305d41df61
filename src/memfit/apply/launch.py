"""Multi-GPU plans: one process cannot shard a model across GPUs, so the launcher does it. This
module writes the configuration files ``memfit plan`` renders (:mod:`memfit.plan.export`:
DeepSpeed JSON for ZeRO-1/2/3 with offload, accelerate's FSDP config) and says how to launch.
:func:`memfit.apply_plan_` applies the per-rank techniques (precision, LoRA, checkpointing…)
inside each process; sharding itself is done by DeepSpeed / FSDP under the launcher.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.apply.target import PlanLike, resolve
from memfit.plan import export
from memfit.userwrites import write_text

DEEPSPEED_FILE = "ds_config.json"
ACCELERATE_FSDP_FILE = "accelerate_fsdp.yaml"


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """The files written and the command that starts ``script`` with them."""

    files: dict[str, Path] = field(default_factory=dict)
    command: str = ""
    notes: list[str] = field(default_factory=list)


def write_launch_configs(
    plan: PlanLike, directory: str | os.PathLike[str], *, script: str = "train.py"
) -> LaunchConfig:
    """Write the plan's DeepSpeed / accelerate FSDP config into ``directory`` (created) and return
    the launch command. Single-GPU plans without offload need no file (``python script``)."""
    target = resolve(plan)
    s, w = target.settings, target.workload
    out = Path(directory)
    files: dict[str, Path] = {}
    notes: list[str] = []
    if s.shard in ("zero1", "zero2", "zero3"):
        out.mkdir(parents=True, exist_ok=True)
        path = out / DEEPSPEED_FILE
        write_text(path, json.dumps(export.deepspeed_config(s), indent=2) + "\n", what="config")
        files["deepspeed"] = path
        command = f"deepspeed --num_gpus {s.gpus} {script}"
    elif s.shard == "fsdp":
        out.mkdir(parents=True, exist_ok=True)
        path = out / ACCELERATE_FSDP_FILE
        write_text(path, _yaml(export.fsdp_config(s)), what="config")
        files["accelerate_fsdp"] = path
        command = f"accelerate launch --config_file {path} {script}"
    elif w.gpus > 1:
        command = f"torchrun --nproc_per_node {s.gpus} {script}"
    else:
        command = f"python {script}"
    if s.tp > 1:
        notes.append(
            f"tp {s.tp}: tensor parallelism is set up by the training framework (torchtitan, "
            "Megatron, transformers' tp_plan='auto' under torchrun); memfit writes no config for it"
        )
    return LaunchConfig(files=files, command=command, notes=notes)


def _yaml(data: dict[str, Any]) -> str:
    try:
        import yaml
    except ImportError:  # JSON is valid YAML 1.2, which accelerate's yaml loader reads
        return json.dumps(data, indent=2) + "\n"
    return str(yaml.safe_dump(data, sort_keys=False))
