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

from memfit.monitor.guard import Guard
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
    """Never raises into ``fit()``; the monitor is closed on ``on_fit_end``, on ``on_exception``
    (the exception propagates unchanged) and, as a last resort, on ``teardown``."""

    def __init__(self, log: str | os.PathLike[str] = "run.jsonl", **monitor_kwargs: Any) -> None:
        super().__init__()
        Monitor(log, **monitor_kwargs)  # bad arguments fail here, not inside fit()
        self.log_path = log
        self.monitor_kwargs = monitor_kwargs
        self.monitor: Monitor | None = None
        self._samples = 0
        self._guard = Guard("lightning callback")

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._guard.call("fit_start", self._begin, trainer, pl_module)

    def _begin(self, trainer: Any, pl_module: Any) -> None:
        self._close(None, None)
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        kw = {"model": pl_module, "optimizer": optimizers[0] if optimizers else None}
        self.monitor = Monitor(self.log_path, **{**kw, **self.monitor_kwargs}).__enter__()
        self._samples = 0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.monitor is not None:
            self._guard.call("train_batch_end", self._batch_end, trainer, batch, batch_idx)

    def _batch_end(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        assert self.monitor is not None
        self._samples += _batch_size(batch) or 0
        if (batch_idx + 1) % max(1, int(getattr(trainer, "accumulate_grad_batches", 1))):
            return
        self.monitor.step(samples=self._samples or None)
        self._samples = 0

    def _close(self, exc_type: Any, exception: BaseException | None) -> None:
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            tb = None if exception is None else exception.__traceback__
            self._guard.call("close", monitor.__exit__, exc_type, exception, tb)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(type(exception), exception)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close(None, None)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._close(None, None)
