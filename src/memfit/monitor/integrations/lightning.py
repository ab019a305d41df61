"""Pre-flight for PyTorch Lightning: a ``Callback`` that estimates the live job at
``on_train_start`` — after Lightning's strategy has set up the model (its precision plugin has
converted it: ``bf16-true`` parameters are bf16 by then), the optimizers and the train
dataloader, and before the first batch — and warns (or raises, if asked) with the fix when it will
not fit on the device it runs on.

::

    trainer = lightning.Trainer(precision="bf16-mixed", callbacks=[MemfitLightningPreflight()])

What is read from the live run:

* the model: a Hugging Face model inside the ``LightningModule`` (itself or the first submodule
  with a transformers ``config``; peft-wrapped too) is estimated like :class:`MemfitPreflight`
  does (memfit's analytic engine, milliseconds). Any other module is **traced**: a copy of it on
  fake tensors runs ``training_step`` on the longest batch, ``backward()`` and the optimizer's
  ``step()`` (memfit.trace_step), so the estimate is the module's own code;
* the precision: ``trainer.precision`` (``bf16-mixed`` runs the traced step under bf16 autocast;
  ``*-true`` is already in the parameters' dtype);
* the longest batch among the first ``scan_batches`` of ``trainer.train_dataloader`` (a fresh
  iterator); the batch size is its leading dimension; ``accumulate_grad_batches``;
* the optimizer: ``trainer.optimizers[0]``, rebuilt on the fake parameters with its class and
  ``defaults`` (foreach as CUDA would pick it).

Like every memfit hook it runs inside the guard: a memfit failure is a warning and training goes
on; only ``raise_if_not_fit=True`` raises :class:`~memfit.errors.DoesNotFitError`.
"""

from __future__ import annotations

import copy
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from memfit.monitor.integrations.preflight import (
    LIGHTNING,
    PreflightBase,
    PreflightResult,
    live_job,
    run_preflight,
)
from memfit.spec import WorkloadSpec

#: torch optimizer classes → memfit's optimizer names (for the analytic path's workload).
OPTIMIZER_NAMES = {"AdamW": "adamw", "Adam": "adamw", "SGD": "sgd"}


class MemfitLightningPreflight(Callback, PreflightBase):  # type: ignore[misc]
    """Lightning ``Callback``: the pre-flight at ``on_train_start``.
    ``device_memory_bytes`` overrides the device's total (tests, or a share of a GPU)."""

    def __init__(
        self,
        *,
        raise_if_not_fit: bool = False,
        scan_batches: int = 64,
        device_memory_bytes: int | None = None,
    ) -> None:
        Callback.__init__(self)
        PreflightBase.__init__(
            self,
            raise_if_not_fit=raise_if_not_fit,
            scan_batches=scan_batches,
            device_memory_bytes=device_memory_bytes,
        )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.finish(self.guard.call("on_train_start", self._check, trainer, pl_module))

    def _check(self, trainer: Any, pl_module: Any) -> PreflightResult:
        batch = longest_batch_of(trainer.train_dataloader, max(1, self.scan_batches))
        if batch is None:
            raise ValueError("the train dataloader gave no batch with a tensor")
        bsz, seq = _dims(batch)
        precision = str(trainer.precision)
        accum = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        opt = optimizers[0] if optimizers else None
        hf = _hf_model(pl_module)
        seq_from = "longest of the first batches"
        if hf is not None:
            source, workload = live_job(
                hf,
                batch_size=bsz,
                grad_accum=accum,
                seq_len=seq,
                mixed=LIGHTNING.get(precision) if "mixed" in precision else None,
                checkpointing=bool(getattr(hf, "is_gradient_checkpointing", False)),
                optimizer=OPTIMIZER_NAMES.get(type(opt).__name__, "adamw"),
            )
            return run_preflight(
                source, workload, device_bytes=self.device_bytes(), seq_from=seq_from
            )
        return self._trace(pl_module, batch, opt, precision, bsz, seq, accum, seq_from)

    def _trace(
        self,
        pl_module: Any,
        batch: Any,
        opt: Any,
        precision: str,
        bsz: int,
        seq: int,
        accum: int,
        seq_from: str,
    ) -> PreflightResult:
        import torch

        from memfit.estimate.trace.user_step import trace_step

        module = _detached_copy(pl_module)
        autocast = (
            torch.bfloat16
            if precision.startswith("bf16-mixed")
            else torch.float16
            if precision.startswith("16-mixed")
            else None
        )

        def step(m: Any, optimizer: Any, data: Any) -> None:
            with torch.autocast(
                "cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None
            ):
                out = m.training_step(data, 0)
            loss = out["loss"] if isinstance(out, dict) else out
            loss.backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        factory = None
        if opt is not None:
            import inspect

            cls = type(opt)
            accepted = set(inspect.signature(cls.__init__).parameters)
            defaults = {k: v for k, v in opt.defaults.items() if k in accepted}
            if "foreach" in defaults and defaults.get("fused") is not True:
                defaults["foreach"] = True  # what torch picks for CUDA tensors

            def factory(params: list[Any]) -> Any:
                return cls(params, **defaults)

        est = trace_step(
            step, model=module, optimizer=factory, inputs=batch, name=type(pl_module).__name__
        )
        device = self.device_bytes()
        high = est.ranges.get("device_used_bytes", (0, est.device_used_bytes))[1]
        workload = WorkloadSpec(
            mode="train",
            batch_size=bsz,
            grad_accum=accum,
            seq_len=seq,
            precision=LIGHTNING.get(precision, "fp32"),
            optimizer=OPTIMIZER_NAMES.get(type(opt).__name__, "adamw"),
        )
        return PreflightResult(
            model_name=type(pl_module).__name__,
            workload=workload,
            estimate=est,
            device_bytes=device,
            fits=None if device is None else high <= device,
            seq_from=seq_from + ", traced through the module's training_step",
        )


def longest_batch_of(loader: Any, limit: int) -> Any:
    """The batch with the most elements among the first ``limit`` of ``loader``."""
    best, best_n = None, -1
    for i, batch in enumerate(loader or ()):
        if i >= limit:
            break
        n = sum(t.numel() for t in _tensors(batch))
        if n > best_n:
            best, best_n = batch, n
    return best


def _tensors(batch: Any) -> list[Any]:
    if hasattr(batch, "shape") and hasattr(batch, "numel"):
        return [batch]
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (list, tuple)) or isinstance(batch, dict):
        return [t for item in items for t in _tensors(item)]
    return []


def _dims(batch: Any) -> tuple[int, int]:
    """(batch size, sequence length): ``input_ids``' (B, S), else the first tensor's first two
    dimensions (B, S, ...)."""
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    shape = tuple((ids if ids is not None else _tensors(batch)[0]).shape)
    if ids is not None:
        return int(shape[0]), int(shape[-1])
    return (int(shape[0]) if shape else 1), (int(shape[1]) if len(shape) >= 2 else 1)


def _hf_model(pl_module: Any) -> Any:
    """The transformers model the LightningModule trains, if any."""
    for module in pl_module.modules():
        config = getattr(module, "config", None)
        from_hf = type(module).__module__.startswith(("transformers.", "peft."))
        if from_hf and hasattr(config, "to_dict"):
            return module
    return None


def _detached_copy(pl_module: Any) -> Any:
    """A copy of the module without its trainer (trace_step makes the parameters fake)."""
    trainer = getattr(pl_module, "_trainer", None)
    pl_module._trainer = None
    try:
        return copy.deepcopy(pl_module)
    finally:
        pl_module._trainer = trainer
