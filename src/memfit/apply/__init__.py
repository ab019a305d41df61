"""Apply a plan to a real model: one module per technique, each calling the ecosystem's own
library (torch autocast / GradScaler, transformers, peft, bitsandbytes, torchao, DeepSpeed /
accelerate configs).

>>> model = memfit.apply_plan_(model, plan)          # dtype, attention, freezing, checkpointing,
...                                                  # quantization, LoRA
>>> optimizer = memfit.build_optimizer(model, plan)  # AdamW, 8-bit, Lion, Adafactor, SGD
>>> amp = memfit.apply.AmpStep(plan, device_type="cuda")   # autocast + GradScaler for amp-*

Hugging Face Trainer: ``training_arguments(plan, output_dir=...)`` and ``PlanCallback(plan)``.
Batch size: ``memfit.find_batch_size(step_fn, make_batch=..., plan=...)``. docs/apply.md.
"""

from typing import Any

from memfit.apply.amp import AmpStep, training_step
from memfit.apply.batch_size import Attempt, BatchSizeResult, find_batch_size
from memfit.apply.launch import LaunchConfig, write_launch_configs
from memfit.apply.model import AppliedPlan, applied_plan, apply_plan_, verify_plan
from memfit.apply.optimizers import build_optimizer
from memfit.apply.quantization import from_pretrained_kwargs
from memfit.apply.requirements import UnsupportedHardwareError
from memfit.apply.target import PlanTarget, resolve

_LAZY = {"PlanCallback", "training_arguments"}  # need transformers: imported on first use


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from memfit.apply import hf_trainer

        return getattr(hf_trainer, name)
    raise AttributeError(f"module 'memfit.apply' has no attribute {name!r}")


__all__ = [
    "AmpStep",
    "AppliedPlan",
    "Attempt",
    "BatchSizeResult",
    "LaunchConfig",
    "PlanCallback",
    "PlanTarget",
    "UnsupportedHardwareError",
    "applied_plan",
    "apply_plan_",
    "build_optimizer",
    "find_batch_size",
    "from_pretrained_kwargs",
    "resolve",
    "training_arguments",
    "training_step",
    "verify_plan",
    "write_launch_configs",
]
