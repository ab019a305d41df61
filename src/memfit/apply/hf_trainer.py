"""Hugging Face Trainer: the plan in two lines.

::

    model = memfit.apply_plan_(model, plan)             # dtype, attention, LoRA, quant, ckpt
    trainer = Trainer(model=model, args=memfit.apply.training_arguments(plan, output_dir="out"),
                      train_dataset=ds, callbacks=[memfit.apply.PlanCallback(plan)])

:func:`training_arguments` builds a real ``TrainingArguments`` from the keyword arguments
``memfit plan`` prints (:func:`memfit.plan.export.training_arguments_kwargs`): micro-batch and
accumulation, ``bf16``/``fp16`` autocast for ``amp-*``, checkpointing (non-reentrant), the ``optim``
name, and for ZeRO the DeepSpeed config file it writes. :class:`PlanCallback` checks at
``on_train_begin`` that the model, the optimizer the Trainer built and the arguments match the
plan (it turns on checkpointing and the attention implementation itself if they are missing), and
can run memfit's :class:`~memfit.Monitor` over the run.
"""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainingArguments

from memfit.apply import attention, checkpointing
from memfit.apply.launch import write_launch_configs
from memfit.apply.model import verify_plan
from memfit.apply.requirements import UnsupportedHardwareError, require_package
from memfit.apply.target import PlanLike, resolve
from memfit.errors import SpecError
from memfit.plan.export import training_arguments_kwargs

log = logging.getLogger(__name__)


def _checkpointing_key() -> str:
    """transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing``."""
    params = inspect.signature(TrainingArguments).parameters
    return (
        "activation_checkpointing"
        if "activation_checkpointing" in params
        else ("gradient_checkpointing")
    )


def training_arguments_dict(plan: PlanLike, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments :func:`training_arguments` passes (``overrides`` win)."""
    target = resolve(plan)
    if not target.workload.is_train:
        raise SpecError("training_arguments needs a training plan (mode 'train'); got 'infer'")
    kwargs = training_arguments_kwargs(target.settings)
    key = _checkpointing_key()
    # selective: the policy is a function TrainingArguments cannot serialise; apply_plan_ (or
    # PlanCallback) enables it on the model instead
    if kwargs.pop("gradient_checkpointing", False) and target.workload.checkpointing == "full":
        kwargs[key] = True
        kwargs[f"{key}_kwargs"] = {"use_reentrant": False}
    if "deepspeed" in kwargs:
        require_package("deepspeed", "deepspeed", f"shard {target.settings.shard!r} (ZeRO)")
        out = overrides.get("output_dir", "memfit-launch")
        kwargs["deepspeed"] = str(write_launch_configs(target, out).files["deepspeed"])
    if kwargs.get("bf16") and not _cuda_available():
        kwargs["use_cpu"] = True  # TrainingArguments refuses bf16 without a GPU unless told
    return {**kwargs, **overrides}


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def training_arguments(plan: PlanLike, **overrides: Any) -> TrainingArguments:
    """A ``transformers.TrainingArguments`` for ``plan``; ``overrides`` (``output_dir``,
    ``learning_rate``, …) are passed through and win over the plan's values."""
    kwargs = training_arguments_dict(plan, **overrides)
    try:
        return TrainingArguments(**kwargs)
    except ValueError as exc:
        message = str(exc).splitlines()[0]
        if "fp16" in message or "bf16" in message or "GPU" in message or "cuda" in message.lower():
            raise UnsupportedHardwareError(
                f"TrainingArguments refused the plan's precision here: {message}; run on a GPU "
                "that supports it or choose another precision"
            ) from exc
        raise SpecError(f"TrainingArguments refused the plan: {message}") from exc


class PlanCallback(TrainerCallback):  # type: ignore[misc]
    """Checks (and where it can, applies) the plan when training begins.

    ``strict``: raise a :class:`SpecError` listing every mismatch (default) instead of logging
    them. ``monitor_log``: a path to run :class:`memfit.Monitor` into (``monitor_kwargs`` go to
    it, e.g. ``estimate=``). ``problems`` holds what was found."""

    def __init__(
        self,
        plan: PlanLike,
        *,
        strict: bool = True,
        monitor_log: str | os.PathLike[str] | None = None,
        **monitor_kwargs: Any,
    ) -> None:
        self.target = resolve(plan)
        self.strict = strict
        self.problems: list[str] = []
        self.monitor: Any = None
        if monitor_log is not None:
            from memfit.monitor.integrations.transformers_callback import MemfitTrainerCallback

            self.monitor = MemfitTrainerCallback(Path(monitor_log), **monitor_kwargs)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        w = self.target.workload
        if model is not None:
            if w.checkpointing != "none" and not checkpointing.is_checkpointing(model):
                checkpointing.enable_checkpointing_(model, w.checkpointing)
            if attention.current_attention(model) not in (
                None,
                attention.HF_ATTENTION[w.attention],
            ):
                attention.set_attention_(model, w.attention)
            self.problems = verify_plan(model, self.target, optimizer=_unwrap(optimizer))
        self.problems += _argument_problems(args, self.target)
        if self.problems:
            message = "the run does not match the memfit plan: " + "; ".join(self.problems)
            if self.strict:
                raise SpecError.from_problems(self.problems) from None
            log.warning(message)
        if self.monitor is not None:
            self.monitor.on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.on_step_end(args, state, control, **kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.on_train_end(args, state, control, **kwargs)


def _unwrap(optimizer: Any) -> Any:
    """accelerate's ``AcceleratedOptimizer`` holds the real one under ``.optimizer``."""
    while optimizer is not None and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _argument_problems(args: Any, target: Any) -> list[str]:
    s = target.settings
    want = training_arguments_kwargs(s)
    p = []
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16"):
        expected = want.get(key, False if key in ("bf16", "fp16") else None)
        got = getattr(args, key, None)
        if expected is not None and got != expected:
            p.append(f"TrainingArguments.{key} is {got!r}; the plan says {expected!r}")
    optim = str(getattr(getattr(args, "optim", None), "value", getattr(args, "optim", "")))
    if optim != want["optim"]:
        p.append(f"TrainingArguments.optim is {optim!r}; the plan says {want['optim']!r}")
    return p
