"""Muon as large runs use it: ``torch.optim.Muon`` on the 2-D hidden weights, AdamW on the rest.

``torch.optim.Muon`` (torch >= 2.9, ``torch/optim/_muon.py``) refuses any parameter that is not a
2-D matrix, and its documentation says the input embedding, the output layer and the gains /
biases belong to a standard optimizer such as AdamW (as Keller Jordan's Muon and Moonlight's
"Muon is Scalable for LLM Training", arXiv:2502.16982, run it). :class:`MuonWithAdamW` is that
pair as one optimizer: the real ``torch.optim.Muon`` (momentum buffer per matrix; its
Newton-Schulz iteration in bf16 allocates per matrix in turn) and the real foreach
``torch.optim.AdamW`` for the embeddings, the output head and every non-matrix parameter; its
``state`` holds both, so the trace labels every state tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from memfit.errors import SpecError

#: Learning rates (they do not change memory): Muon's default, and a usual AdamW one.
MUON_LR = 0.02
ADAMW_LR = 3e-4


def adamw_group(model: torch.nn.Module | None) -> list[torch.Tensor]:
    """The matrices Muon leaves to AdamW: every ``nn.Embedding`` weight and the output head."""
    if model is None:
        return []
    out = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is not None and isinstance(getattr(head, "weight", None), torch.Tensor):
        out.append(head.weight)
    return out


class MuonWithAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` over the hidden matrices, then foreach ``AdamW`` over the rest."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        model: torch.nn.Module | None = None,
        *,
        lr: float = MUON_LR,
        adamw_lr: float = ADAMW_LR,
    ) -> None:
        muon_cls = getattr(torch.optim, "Muon", None)
        if muon_cls is None:
            raise SpecError(
                f"optimizer 'muon' needs torch.optim.Muon (torch >= 2.9); torch "
                f"{torch.__version__} lacks it: upgrade torch or use --engine analytic"
            )
        params = list(params)
        to_adamw = {id(p) for p in adamw_group(model)}
        matrices = [p for p in params if p.ndim == 2 and id(p) not in to_adamw]
        rest = [p for p in params if not (p.ndim == 2 and id(p) not in to_adamw)]
        super().__init__(params, {"lr": lr})
        self.inner: list[torch.optim.Optimizer] = []
        if matrices:
            self.inner.append(muon_cls(matrices, lr=lr))
        if rest:
            self.inner.append(torch.optim.AdamW(rest, lr=adamw_lr, foreach=True))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for opt in self.inner:
            opt.step()
            self.state.update(opt.state)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.inner:
            opt.zero_grad(set_to_none=set_to_none)
