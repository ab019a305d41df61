"""Trace the user's own step function: the estimate is only as right as the code path it runs.

::

    with torch.device("meta"):
        model = MyModel()
    est = memfit.trace_step(
        lambda model, opt, batch: train_step(model, opt, batch),
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, foreach=True),
        inputs={"x": torch.empty(32, 3, 224, 224)},
    )

The model may live on ``meta`` (recommended: nothing is allocated) or be a real CPU model (its
parameters are converted to fake copies; the user's model is left untouched). The optimizer is a
factory, called with the fake parameters. Inputs are tensors (real or meta; turned into fake ones)
or a callable returning them. Phases are found automatically: the step starts in ``forward``, any
``backward()`` switches to ``backward`` and ``optimizer.step()`` to ``optimizer``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from torch.utils._pytree import tree_map

from memfit.errors import SpecError, TraceError
from memfit.estimate.pipeline import assemble
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace import build, steps
from memfit.estimate.trace.engine import (
    cuda_emulation_for,
    engine_result,
    flatten_trace,
    replay_reserved,
)
from memfit.estimate.trace.tracker import StorageTracker
from memfit.spec import WorkloadSpec


def trace_step(
    step_fn: Callable[..., Any],
    *,
    model: torch.nn.Module,
    optimizer: Callable[[list[torch.nn.Parameter]], Any] | None = None,
    inputs: Any = None,
    n_steps: int = 2,
    gpu: Any = None,
    name: str | None = None,
    emulate_cuda: bool = True,
) -> MemoryEstimate:
    """Run ``step_fn(model, optimizer, inputs)`` ``n_steps`` times on fake tensors; estimate it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"model ({type(model).__name__}) must be a torch.nn.Module")
    if optimizer is not None and not callable(optimizer):
        raise SpecError(
            "optimizer must be a factory such as `lambda params: torch.optim.AdamW(params)`: "
            "memfit builds it on the fake parameters"
        )
    started = time.perf_counter()
    on_meta = all(p.device.type == "meta" for p in model.parameters())
    traced = model if on_meta else copy.deepcopy(model)
    fake = FakeTensorMode(allow_non_fake_inputs=False)
    build.meta_to_fake_(traced, fake)
    tracker = StorageTracker(device_type="cpu")
    with ExitStack() as stack:
        stack.enter_context(fake)
        # the SDPA kernel and dropout as CUDA runs them, transformers' real-tensor code paths
        router = stack.enter_context(
            cuda_emulation_for(WorkloadSpec(attention="sdpa"), emulate_cuda, gpu=gpu)
        )
        batch = _fake_inputs(inputs, fake)
        params = [p for p in traced.parameters() if p.requires_grad]
        opt = optimizer(params) if optimizer is not None and params else None
        if opt is not None:
            opt.register_step_pre_hook(lambda *_: tracker.set_phase("optimizer"))
        stack.enter_context(tracker)
        stack.enter_context(_backward_marks_phase(tracker))
        steps.label_model_state(tracker, traced)
        tracker.label(_tensors(batch), "activations")
        tracker.watch_modules(traced)
        paged: set[int] = set()  # paged optimizer states (bitsandbytes' paged optimizers)
        try:
            for _ in range(n_steps):
                tracker.set_phase("forward")
                step_fn(traced, opt, batch)
                paged |= steps.label_model_state(tracker, traced, opt)
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            raise TraceError(
                f"the step function failed on fake tensors: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300]}"
            ) from exc
        tracker.set_phase("end")
    n_params = sum(p.numel() for p in traced.parameters())
    n_trainable = sum(p.numel() for p in traced.parameters() if p.requires_grad)
    flat = flatten_trace(tracker, n_params, n_trainable, router, paged)
    workload = WorkloadSpec(mode="train" if "phase/backward/peak" in flat else "infer")
    flat["reserved"] = replay_reserved(tracker.events or [], gpu, workload.is_train)
    result = engine_result(
        flat,
        name=name or type(model).__name__,
        trace={"user_step": True, "wall_s": round(time.perf_counter() - started, 3)},
        notes=[],
    )
    return assemble(result, workload, gpu)


def _tensors(tree: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    tree_map(lambda t: out.append(t) if isinstance(t, torch.Tensor) else None, tree)
    return out


def _fake_inputs(inputs: Any, fake: Any) -> Any:
    if callable(inputs):
        inputs = inputs()

    def convert(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.device.type == "meta":
            return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype)
        return fake.from_tensor(t)

    return tree_map(convert, inputs)


class _backward_marks_phase:
    """Switch the tracker to ``backward`` whenever autograd's engine is entered."""

    def __init__(self, tracker: StorageTracker) -> None:
        self.tracker = tracker

    def __enter__(self) -> None:
        self._orig = torch.autograd.backward
        self._orig_tensor = torch.Tensor.backward
        tracker, orig = self.tracker, self._orig

        def backward(*args: Any, **kwargs: Any) -> Any:
            tracker.set_phase("backward")
            return orig(*args, **kwargs)

        def tensor_backward(self_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            tracker.set_phase("backward")
            return self._orig_tensor(self_, *args, **kwargs)

        torch.autograd.backward = backward  # type: ignore[assignment]
        torch.Tensor.backward = tensor_backward  # type: ignore[method-assign,assignment]

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.backward = self._orig  # type: ignore[assignment]
        torch.Tensor.backward = self._orig_tensor  # type: ignore[method-assign]
