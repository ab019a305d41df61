"""What the rank rewrite reads of a traced step, kept apart from the tracker and the model.

:mod:`memfit.estimate.trace.rank_replay` replays a traced single-GPU step as rank 0 of a DDP,
ZeRO or offloaded job runs it. It needs the tracker's events with their raw sizes and marks, each
storage's owner (module, the phase it was born in, its component), the keys the tracker stopped
counting, the parameters' gradient keys, and a few facts of each parameter. A
:class:`RankTrace` holds exactly those, taken once after the step (:func:`snapshot`) while the
model is alive, so a rewrite reads no live tracker (whose weak references append frees as the
model dies) and no model: the same trace can serve every rank variant of a job whose traced step
is the same (:mod:`memfit.estimate.trace.step_memo`), and it pickles (a forked worker's trace
comes back to its parent with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from memfit.estimate.trace.distributed import DistTracker


@dataclass(frozen=True)
class Param:
    """One parameter storage of the traced model (its local shard under FSDP2)."""

    numel: int
    element_size: int
    trainable: bool
    module: str


@dataclass(frozen=True, kw_only=True)
class RankTrace:
    """A traced step as the rank rewrite reads it (see the module docstring).

    ``owners``: per tracker key, ``(module, phase born in, component)``. ``params``: per
    parameter storage key, in ``named_modules`` order (each parameter under the first module
    that holds it). ``ddp_sizes``: bytes of each trainable parameter in ``model.parameters()``
    order (what DDP's reducer buckets, in reverse)."""

    events: tuple[tuple[str, int, int], ...]
    marks: tuple[tuple[int, str, str], ...]
    raw: tuple[int, ...]
    ignored: frozenset[int]
    owners: dict[int, tuple[str, str, str]]
    grad_keys: frozenset[int]
    params: dict[int, Param]
    ddp_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        births = sum(1 for op, _k, _n in self.events if op == "a")
        if len(self.raw) < births:
            raise ValueError(f"raw sizes ({len(self.raw)}) must cover every birth ({births})")

    def module(self, key: int) -> str:
        return self.owners[key][0]

    def phase(self, key: int) -> str:
        return self.owners[key][1]

    def component(self, key: int) -> str:
        return self.owners[key][2]


def snapshot(tracker: DistTracker, model: torch.nn.Module) -> RankTrace:
    """The :class:`RankTrace` of ``tracker``'s step on ``model``, as they are now."""
    owners = {
        key: (st.module, st.phase, tracker.component_of(key))
        for key, st in tracker.storages.items()
    }
    return RankTrace(
        events=tuple(tracker.events or ()),
        marks=tuple(tracker.marks),
        raw=tuple(tracker.raw),
        ignored=frozenset(tracker._ignored),
        owners=owners,
        grad_keys=frozenset(tracker.grad_keys),
        params=_param_keys(tracker, model),
        ddp_sizes=tuple(
            p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
        ),
    )


def _param_keys(tracker: DistTracker, model: torch.nn.Module) -> dict[int, Param]:
    out: dict[int, Param] = {}
    for mod_name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            local = getattr(p, "_local_tensor", p)
            key = tracker._key_of.get(local.untyped_storage())
            if key is not None and key not in out:
                out[key] = Param(local.numel(), local.element_size(), p.requires_grad, mod_name)
    return out
