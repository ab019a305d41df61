"""Compose block profiles into the phases of a training step or a generation run.

A training step (the one memfit's trace runs, second iteration, so optimizer states exist)::

    forward:   static + embed → L layers → head (logits, fp32 log-probs, loss)
    backward:  head → L layers (reverse) → embed; parameter gradients accumulate
    optimizer: parameters + gradients + states + the optimizer's temporaries

``static`` = parameters (+ buffers) + optimizer states + gradients kept from the previous step
(``zero_grad(set_to_none=False)``) + the input ids. Every layer of a stack has the same profile,
so the live bytes at point ``p`` of layer ``k`` are ``start + k · net + p``: linear in ``k``, the
maximum over the stack is at its first or last layer. This is exact for identical layers and costs
the same for 2 or 80 layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from memfit.estimate.analytic.graph import (
    ACTS,
    DTYPE_BYTES,
    GRADS,
    PARAMS,
    SAC_POLICIES,
    STATES,
    TEMP,
    ZERO,
    Graph,
    Tensor,
    Vec,
    one,
    vadd,
    vscale,
)
from memfit.estimate.analytic.ops import Ops

Build = Callable[[Ops], tuple[Tensor | None, list[Tensor]]]
#: What a block's forward saves under each ``--checkpointing`` (:meth:`Graph.forward`).
CHECKPOINT_POLICY = {
    "none": "all",
    "full": "none",
    "selective": "matmul",
    "selective-op": "alternate-mm",
}


@dataclass
class BlockProfile:
    fwd: list[Vec]
    fwd_end: Vec
    bwd: list[Vec] = field(default_factory=list)
    bwd_end: Vec = ZERO
    param_bytes: int = 0
    grad_bytes: int = 0  # trainable parameters' bytes (their gradients)
    n_params: int = 0
    n_trainable: int = 0
    out_rg: bool = False  # the block's output requires grad
    #: (shape, dtype) of each trainable parameter (optimizer states are per tensor)
    trainable_shapes: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    embedding_shapes: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    #: every parameter in creation (forward) order: (shape, bytes per element, trainable)
    params: list[tuple[tuple[int, ...], int, bool]] = field(default_factory=list)
    #: per parameter (as ``params``): its first forward and backward point (-1: none)
    param_points: list[tuple[int, int]] = field(default_factory=list)
    #: weight casts the block leaves in autocast's cache (inference, checkpointed training)
    cast_bytes: int = 0
    #: bytes the checkpoint keeps for the recomputation (the block's input; host_checkpoint.py)
    checkpoint_bytes: int = 0
    #: inference: the forward's allocations and frees in order (``Graph.events``), for the
    #: caching allocator's replay (:mod:`memfit.estimate.analytic.replay`); None in training
    events: list[tuple[str, int, int]] | None = None


def run_block(
    build: Build,
    *,
    precision: str,
    train: bool,
    frozen: bool = False,
    lora: tuple[int, tuple[str, ...] | str] | None = None,
    checkpointing: str = "none",
    backward: bool = True,
    existing_grads: bool = False,
    setup: Callable[[Ops], None] | None = None,
    step_temp: Callable[[Tensor], int] | None = None,
) -> BlockProfile:
    """Record ``build`` and replay it. ``build`` returns the block input (or None) and the outputs
    gradients flow back from (their gradients are counted by the caller). ``step_temp``: the
    optimizer steps each parameter in backward (``optimizer_in_bwd``), allocating
    ``step_temp(param)`` bytes while it runs (``Graph.step_in_backward``)."""

    recorded: list[Ops] = []

    def record() -> tuple[Graph, Tensor | None, list[Tensor]]:
        g = Graph(grad_enabled=train)
        o = Ops(g, precision=precision, train=train, frozen=frozen, lora=lora)
        o.existing_grads = existing_grads
        if step_temp is not None:
            g.step_in_backward, g.step_temp_bytes = True, step_temp
        if not train:  # inference: its order kept for the allocator's replay
            g.events = []
        if setup is not None:
            setup(o)
        x, outs = build(o)
        recorded.append(o)
        return g, x, outs

    g, x, outs = record()
    policy = CHECKPOINT_POLICY[checkpointing]
    ckpt = checkpointing != "none" and train and any(t.rg for t in outs)
    ckpt_bytes = x.n_bytes if ckpt and x is not None else 0
    if ckpt and x is not None:
        g.hold(x)  # torch.utils.checkpoint keeps the block's inputs for the recomputation
    cast_bytes = recorded[0].held_cast_bytes
    if ckpt:
        # Autocast caches the casts of the weights that require grad until it exits (the end
        # of the forward: the caller frees ``cast_bytes``); nothing else keeps them here.
        casts = list(recorded[0].cast_cache.values())
        g.hold(*casts)
        cast_bytes += sum(t.n_bytes for t in casts)
    fwd, fwd_end = g.forward(save_policy=policy if ckpt else "all")
    prof = BlockProfile(fwd=fwd, fwd_end=fwd_end, out_rg=any(t.rg for t in outs))
    prof.events = g.events
    prof.cast_bytes = cast_bytes
    prof.checkpoint_bytes = ckpt_bytes
    _count_params(prof, g)
    if not (backward and train and any(t.rg for t in outs)):
        return prof
    if ckpt:  # recorded again: the recomputation its backward runs
        g, x, outs = record()
        args = [x] if x is not None else []
        stored = policy if policy in SAC_POLICIES else False
        g.recomputation(args + recorded[-1].checkpoint_args, stored=stored)
    bwd = g.backward([t for t in outs if t.rg], existing_grads=existing_grads)
    prof.bwd, prof.bwd_end = bwd[:-1], bwd[-1]
    if not ckpt:
        prof.param_points = [
            (g.fwd_point_of.get(id(p), -1), g.bwd_point_of.get(id(p), -1)) for p in g.params
        ]
    return prof


def _count_params(prof: BlockProfile, g: Graph) -> None:
    for p in g.params:
        n_bytes = p.numel * DTYPE_BYTES[p.dtype] if p.stored_bytes is None else p.stored_bytes
        prof.param_bytes += n_bytes
        prof.n_params += p.numel
        prof.params.append((p.shape, DTYPE_BYTES[p.dtype], p.trainable))
        if p.trainable:
            prof.n_trainable += p.numel
            prof.grad_bytes += n_bytes
            prof.trainable_shapes.append((p.shape, p.dtype))
            if p.is_embedding:
                prof.embedding_shapes.append((p.shape, p.dtype))


@dataclass
class Stack:
    profile: BlockProfile
    count: int


def run_stacks(
    start: Vec,
    stacks: list[Stack],
    *,
    backward: bool,
    point: Callable[[int, int, Vec], Vec] | None = None,
    last_point: Callable[[int, int, Vec], Vec] | None = None,
) -> tuple[list[Vec], Vec]:
    """Points of a sequence of stacks (reversed for backward), from ``start``. ``point(i, j, v)``
    rewrites point ``v``, the ``j``-th of stack ``i`` (a multi-GPU rank's view,
    ``distributed.py``); ``last_point`` (default ``point``) those of the stack's block run
    last (backward: its first block)."""
    points: list[Vec] = []
    cur = start
    order = list(enumerate(stacks))
    for i, st in reversed(order) if backward else order:
        pts, net = (
            (st.profile.bwd, st.profile.bwd_end)
            if backward
            else (
                st.profile.fwd,
                st.profile.fwd_end,
            )
        )
        if st.count <= 0:
            continue
        for k in {0, st.count - 1}:
            b0, b1, b2, b3, b4, b5 = vadd(cur, vscale(net, k))
            # vadd(base, p) for each point, inline (a planner search adds ~10^6 of them)
            shifted = [
                (b0 + p[0], b1 + p[1], b2 + p[2], b3 + p[3], b4 + p[4], b5 + p[5]) for p in pts
            ]
            rewrite = last_point if last_point is not None and k == st.count - 1 else point
            if rewrite is None:
                points.extend(shifted)
            else:
                points.extend([rewrite(i, j, v) for j, v in enumerate(shifted)])
        cur = vadd(cur, vscale(net, st.count))
    return points, cur


def peak(points: list[Vec], floor: Vec) -> Vec:
    """The point with the most live bytes (``floor``: the phase's state when it starts)."""
    best = floor
    best_total = sum(floor)
    for p in points:
        t = sum(p)
        if t > best_total:
            best, best_total = p, t
    return best


__all__ = [
    "ACTS",
    "GRADS",
    "PARAMS",
    "STATES",
    "TEMP",
    "BlockProfile",
    "Stack",
    "one",
    "peak",
    "run_block",
    "run_stacks",
]
