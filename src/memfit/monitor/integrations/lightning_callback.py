"""A PyTorch Lightning ``Callback`` that runs a :class:`memfit.Monitor` over ``Trainer.fit()``.

::

    trainer = L.Trainer(callbacks=[MemfitLightningCallback("run.jsonl", estimate=est)])

One monitor step per optimizer step (every ``accumulate_grad_batches`` training batches), with
``samples`` counted from the batches' leading dimension. Lightning reports exceptions to callbacks,
so an OOM inside ``fit()`` gets the monitor's OOM analysis (and ``oom_report=`` if given).
"""

from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from memfit.monitor.runtime import Monitor


def _batch_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor found in ``batch``."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (list, tuple)) or isinstance(batch, dict):
        for item in items:
            n = _batch_size(item)
            if n is not None:
                return n
    return None


class MemfitLightningCallback(Callback):  # type: ignore[misc]
    def __init__(self, log: str | os.PathLike[str] = "run.jsonl", **monitor_kwargs: Any) -> None:
        super().__init__()
        self.log_path = log
        self.monitor_kwargs = monitor_kwargs
        self.monitor: Monitor | None = None
        self._samples = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        kw = {"model": pl_module, "optimizer": optimizers[0] if optimizers else None}
        self.monitor = Monitor(self.log_path, **{**kw, **self.monitor_kwargs}).__enter__()
        self._samples = 0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.monitor is None:
            return
        self._samples += _batch_size(batch) or 0
        if (batch_idx + 1) % max(1, int(getattr(trainer, "accumulate_grad_batches", 1))):
            return
        self.monitor.step(samples=self._samples or None)
        self._samples = 0

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.monitor is not None:
            self.monitor.__exit__(type(exception), exception, exception.__traceback__)
            self.monitor = None

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.__exit__(None, None, None)
            self.monitor = None
