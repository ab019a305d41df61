"""A transformers ``TrainerCallback`` that runs a :class:`memfit.Monitor` over ``Trainer.train()``.

::

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[MemfitTrainerCallback("run.jsonl", estimate=est)])

One monitor step per optimizer step (``on_step_end``). ``samples`` is the per-device batch times
the gradient-accumulation steps; ``tokens`` is the growth of ``state.num_input_tokens_seen``
(set ``include_num_input_tokens_seen=True`` in TrainingArguments; summed over all processes).
An OOM escapes ``train()`` without a callback seeing it: wrap ``trainer.train()`` in
``memfit.oom_guard(model=model)`` for the report; the log keeps every step written before it.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from memfit.monitor.runtime import Monitor


class MemfitTrainerCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, log: str | os.PathLike[str] = "run.jsonl", **monitor_kwargs: Any) -> None:
        self.log_path = log
        self.monitor_kwargs = monitor_kwargs
        self.monitor: Monitor | None = None
        self._tokens_seen = 0
        self._samples_per_step: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        kw = {
            "model": kwargs.get("model"),
            "optimizer": kwargs.get("optimizer"),
            **self.monitor_kwargs,
        }
        self.monitor = Monitor(self.log_path, **kw).__enter__()
        self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        self._samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            return
        if self.monitor.optimizer is None:
            self.monitor.optimizer = kwargs.get("optimizer")
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        tokens = seen - self._tokens_seen if seen else None
        self._tokens_seen = seen
        self.monitor.step(tokens=tokens, samples=self._samples_per_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.__exit__(None, None, None)
            self.monitor = None
