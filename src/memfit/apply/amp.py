"""The training step under the plan's precision: ``torch.autocast`` for ``*-mixed`` and
``torch.amp.GradScaler`` for ``16-mixed`` (Micikevicius et al. 2018: fp16 gradients need loss
scaling), exactly the step memfit's estimator traces (``memfit.estimate.trace.steps``)::

    amp = memfit.apply.AmpStep(plan, device_type="cuda")
    with amp.autocast():
        loss = model(**batch).loss
    amp.backward(loss)
    amp.step(optimizer)            # unscale (fp16), step, update the scale
    optimizer.zero_grad(set_to_none=True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memfit.apply.precision import AUTOCAST_DTYPE, check_precision
from memfit.apply.target import PlanLike, resolve
from memfit.spec import PRECISION_RULES


class AmpStep:
    """Autocast + loss scaling for one plan. ``scaler`` is a ``torch.amp.GradScaler`` for
    ``16-mixed`` and None otherwise; ``dtype`` the autocast dtype (None: no autocast)."""

    def __init__(self, plan: PlanLike, *, device_type: str = "cuda") -> None:
        precision = resolve(plan).workload.run_precision
        check_precision(precision, torch.device(device_type))
        self.precision = precision
        self.device_type = device_type
        self.dtype: torch.dtype | None = AUTOCAST_DTYPE.get(precision)
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(device_type) if PRECISION_RULES[precision].grad_scaler else None
        )

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward's context: ``torch.autocast(device_type, dtype)`` for ``amp-*``."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale the gradients before clipping them (a no-op without a scaler)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; with a scaler: skipped on inf/nan gradients, then the scale is
        updated."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


def training_step(
    model: torch.nn.Module,
    batch: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    amp: AmpStep,
    *,
    set_to_none: bool = True,
) -> float:
    """One step as memfit's estimator runs it: forward (autocast), backward (scaled), optimizer
    step, ``zero_grad``. Returns the loss. Models without a built-in loss use the mean of their
    first output (as the estimator does)."""
    with amp.autocast():
        out = model(**batch)
    loss = _loss(out)
    amp.backward(loss)
    value = float(loss.detach())
    del out, loss
    if optimizer is not None:
        amp.step(optimizer)
        optimizer.zero_grad(set_to_none=set_to_none)
    else:
        model.zero_grad(set_to_none=set_to_none)
    return value


def _loss(out: Any) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    first = out if isinstance(out, torch.Tensor) else out[0]
    return first.mean()
