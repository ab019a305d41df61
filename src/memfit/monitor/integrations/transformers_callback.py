"""A transformers ``TrainerCallback`` that runs a :class:`memfit.Monitor` over ``Trainer.train()``.

::

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[MemfitTrainerCallback("run.jsonl", estimate=est)])

One monitor step per optimizer step (``on_step_end``). ``samples`` is the per-device batch times
the gradient-accumulation steps; ``tokens`` is the growth of ``state.num_input_tokens_seen``
(set ``include_num_input_tokens_seen=True`` in TrainingArguments; summed over all processes).

transformers tells callbacks nothing when ``train()`` raises, so the callback wraps *that
trainer's* ``train`` (an attribute on the instance, found when the Trainer calls ``on_init_end``;
no class is patched): when ``train()`` raises, the monitor is closed — tracker and patches undone,
an OOM analysed, the end record written — and the exception propagates unchanged. A callback added
later with ``trainer.add_callback`` gets no ``on_init_end``; it wraps ``train`` at the first
``on_train_begin`` for the calls after, and a monitor left open is closed at the next
``on_train_begin`` or at interpreter exit. The callback never raises into ``train()``.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from transformers import Trainer, TrainerCallback

from memfit.monitor.guard import Guard
from memfit.monitor.runtime import Monitor


def _find_trainer() -> Any:
    """The Trainer whose method is running up the stack (the one calling this callback)."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back  # type: ignore[assignment]
    return None


class MemfitTrainerCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, log: str | os.PathLike[str] = "run.jsonl", **monitor_kwargs: Any) -> None:
        Monitor(log, **monitor_kwargs)  # bad arguments fail here, not inside train()
        self.log_path = log
        self.monitor_kwargs = monitor_kwargs
        self.monitor: Monitor | None = None
        self._tokens_seen = 0
        self._samples_per_step: int | None = None
        self._guard = Guard("trainer callback")

    # ------------------------------------------------------------------ the train() wrapper
    def _wrap_train(self, trainer: Any) -> None:
        if trainer is None or getattr(trainer, "_memfit_train_wrapped", False):
            return
        original = trainer.train
        callback = self

        @functools.wraps(original)
        def train(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                callback._close(exc)
                raise

        trainer.train = train
        trainer._memfit_train_wrapped = True

    def _close(self, exc: BaseException | None) -> None:
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            tb = None if exc is None else exc.__traceback__
            self._guard.call("close", monitor.__exit__, type(exc) if exc else None, exc, tb)

    # ------------------------------------------------------------------ events
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._guard.call("find trainer", lambda: self._wrap_train(_find_trainer()))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._guard.call("train_begin", self._begin, args, state, kwargs)

    def _begin(self, args: Any, state: Any, kwargs: dict[str, Any]) -> None:
        if self.monitor is not None:  # a train() that raised without the wrapper seeing it
            self._close(RuntimeError("the previous train() ended without on_train_end"))
        self._wrap_train(_find_trainer())
        kw = {"model": kwargs.get("model"), "optimizer": kwargs.get("optimizer")}
        self.monitor = Monitor(self.log_path, **{**kw, **self.monitor_kwargs}).__enter__()
        self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        self._samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self._guard.call("step_end", self._step, state, kwargs)

    def _step(self, state: Any, kwargs: dict[str, Any]) -> None:
        assert self.monitor is not None
        if self.monitor.optimizer is None:
            self.monitor.optimizer = kwargs.get("optimizer")
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        tokens = seen - self._tokens_seen if seen else None
        self._tokens_seen = seen
        self.monitor.step(tokens=tokens, samples=self._samples_per_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close(None)
