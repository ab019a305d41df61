"""Stand-ins for bitsandbytes optimizers: the exact device tensors they allocate, on fake tensors.

bitsandbytes is an optional dependency and its CUDA kernels do not run on FakeTensors; what its
optimizers allocate is simple enough to reproduce exactly. Each stand-in creates, lazily at a
parameter's first step as ``init_state`` does, the same state tensors (keys, dtypes, shapes,
device) as bitsandbytes 0.50 (``bitsandbytes/optim/optimizer.py``, ``Optimizer2State`` and
``Optimizer1State``):

- 8-bit AdamW, for a parameter with ``n >= min_8bit_size`` (4096) elements and no 32-bit override:
  ``state1``/``state2`` uint8 like the parameter, ``absmax1``/``absmax2`` fp32 of ⌈n/256⌉ blocks,
  ``qmap1``/``qmap2`` the optimizer's two 256-entry fp32 maps, copied to the GPU once and shared
  by every parameter; otherwise ``state1``/``state2`` fp32 like the parameter.
- Paged 8-bit AdamW: the same, but ``state1``/``state2`` of parameters with at least 10⁵ elements
  live in CUDA unified memory (``get_state_buffer``); they carry ``is_paged = True`` as
  bitsandbytes' own paged tensors do, which is how the trace reports them separately.
- Lion (32-bit): ``state1`` fp32 like the parameter, whatever the parameter's dtype.
- ``step`` is a Python int (no device memory).

The update allocates nothing: bitsandbytes' CUDA kernels (``optimizer32bit``,
``optimizerStatic8bitBlockwise``) dequantize, update and requantize each block in registers, in
place, with no workspace. (Its CPU kernels do allocate fp32 temporaries; tests that run the real
library on CPU compare the states, not the CPU step's temporaries.)

HF Trainer registers every ``nn.Embedding`` weight for 32-bit states when it builds a bitsandbytes
8-bit optimizer (``Trainer.create_optimizer``); :func:`make_bnb_optimizer` does the same.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from memfit.estimate.optim_states import (
    BNB_BLOCK_SIZE,
    BNB_MIN_8BIT_SIZE,
    BNB_PAGED_MIN_NUMEL,
    BNB_QMAP_ENTRIES,
)

#: The optimizer names this module provides.
BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit", "lion")


class _BnbStandIn(torch.optim.Optimizer):
    """Shared step loop: initialise a parameter's states at its first step, then count steps."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    self._init_state(p, state)
                state["step"] += 1  # the fused CUDA kernel updates in place: nothing allocated
        return loss

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        raise NotImplementedError


class AdamW8bitStandIn(_BnbStandIn):
    """``bnb.optim.AdamW8bit`` (``paged=False``) or ``bnb.optim.PagedAdamW8bit`` (``paged=True``).

    ``fp32_params``: parameters registered for 32-bit states (``GlobalOptimManager``
    ``optim_bits=32`` overrides, as HF Trainer does for embeddings).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        lr: float = 1e-3,
        paged: bool = False,
        fp32_params: Iterable[torch.Tensor] = (),
        min_8bit_size: int = BNB_MIN_8BIT_SIZE,
        block_size: int = BNB_BLOCK_SIZE,
    ) -> None:
        super().__init__(params, lr)
        self.paged = paged
        self.min_8bit_size = min_8bit_size
        self.block_size = block_size
        self._fp32_ids = {id(p) for p in fp32_params}
        self._qmaps: tuple[torch.Tensor, torch.Tensor] | None = None

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        n = p.numel()
        if id(p) in self._fp32_ids or n < self.min_8bit_size:
            state["state1"] = self._buffer(p, torch.float32)
            state["state2"] = self._buffer(p, torch.float32)
            return
        if self._qmaps is None:  # built on the host in __init__, copied to the GPU once
            self._qmaps = (_qmap(p.device), _qmap(p.device))
        blocks = -(-n // self.block_size)
        state["state1"] = self._buffer(p, torch.uint8)
        state["qmap1"] = self._qmaps[0]
        state["state2"] = self._buffer(p, torch.uint8)
        state["qmap2"] = self._qmaps[1]
        state["absmax1"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)
        state["absmax2"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        buf = torch.zeros_like(p, dtype=dtype, device=p.device)
        if self.paged and p.numel() >= BNB_PAGED_MIN_NUMEL:
            buf.is_paged = True  # type: ignore[attr-defined]
        return buf


class Lion32bitStandIn(_BnbStandIn):
    """``bnb.optim.Lion`` (optim_bits=32), what HF Trainer's ``optim="lion_32bit"`` builds."""

    def __init__(self, params: Iterable[torch.Tensor], *, lr: float = 1e-4) -> None:
        super().__init__(params, lr)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        state["state1"] = torch.zeros_like(p, dtype=torch.float32, device=p.device)


def _qmap(device: torch.device) -> torch.Tensor:
    return torch.zeros((BNB_QMAP_ENTRIES,), dtype=torch.float32, device=device)


def embedding_weights(model: torch.nn.Module | None) -> list[torch.Tensor]:
    """The weights HF Trainer gives 32-bit states under a bitsandbytes 8-bit optimizer."""
    if model is None:
        return []
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]


def make_bnb_optimizer(
    name: str, params: list[torch.nn.Parameter], model: torch.nn.Module | None = None
) -> torch.optim.Optimizer:
    """The stand-in for ``name`` (one of :data:`BNB_OPTIMIZERS`), configured as HF Trainer does."""
    if name == "lion":
        return Lion32bitStandIn(params)
    if name in ("adamw-8bit", "paged-adamw-8bit"):
        return AdamW8bitStandIn(
            params, paged=name.startswith("paged"), fp32_params=embedding_weights(model)
        )
    if name == "paged-adamw-32bit":  # every parameter under the 8-bit threshold: fp32 states
        return AdamW8bitStandIn(params, paged=True, min_8bit_size=sys.maxsize)
    raise ValueError(f"no bitsandbytes stand-in for optimizer {name!r}")


def paged_tensors(optimizer: Any) -> list[torch.Tensor]:
    """State tensors of ``optimizer`` that live in CUDA unified memory (``is_paged``)."""
    return [
        v
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and getattr(v, "is_paged", False)
    ]
