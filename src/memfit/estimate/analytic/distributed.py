"""One data-parallel rank's view of a training step or a generation: DDP, ZeRO-1/2/3, FSDP2,
offload (``--gpus``, ``--shard``, ``--offload``).

The single-GPU phases (``engine.py``) are rewritten point by point, as the trace engine rewrites
its timeline (``trace/rank_replay.py``) or, for FSDP2, as its real trace allocates; the sizes and
defaults come from :mod:`memfit.estimate.sharding` (DeepSpeed's code defaults, DDP's buckets):

* ``ddp``: the reducer's flat bucket copies of every gradient, held for the process's life.
* ``zero1``/``zero2``: optimizer states partitioned (fp32 with fp32 master weights when the
  parameters are 16-bit); the contiguous-gradient bucket (``reduce_bucket_size`` elements) during
  backward; the step converts the rank's gradient partition to fp32. ``zero2`` copies each
  gradient into the bucket as it is produced and keeps only its partition.
* ``zero3``: parameters of at least ``stage3_param_persistence_threshold`` elements partitioned;
  each module's parameters gathered around its forward and backward, with the modules that follow
  prefetched while they fit in ``stage3_prefetch_bucket_size`` (simulated over the model's module
  order; each block gets the most it ever holds gathered); bucket and gradient partition from the
  start.
* ``fsdp`` (FSDP2, ``fully_shard`` per decoder block and on the root): every parameter sharded on
  dim 0; the root (embeddings, final norm, LM head) unsharded from its forward to the end of
  backward; in forward the running block and the next one being all-gathered (flat buffer and
  copy-out); in backward the running and prefetched blocks and the running block's unsharded
  gradients (the reduce-scatter input). States and gradients 1/dp in the parameters' dtype.
* ``offload``: what DeepSpeed (ZeRO-Offload / ZeRO-Infinity) or FSDP2's CPUOffloadPolicy move to
  host RAM leaves the device and is summed into ``host_bytes``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit.estimate import sharding
from memfit.estimate.analytic.graph import GRADS, PARAMS, TEMP, Vec, one, vadd
from memfit.estimate.analytic.step import BlockProfile
from memfit.hardware.cuda_allocator import round_size, segment_size

#: Optimizers DeepSpeed runs as its fused multi-tensor Adam (no parameter-sized temporaries);
#: the trace engine's rule (``rank_replay.DEEPSPEED_FUSED_ADAM``).
DEEPSPEED_FUSED_ADAM = sharding.DEEPSPEED_ADAM
#: Unsharded copies of a decoder block FSDP2 holds at once in forward (the running block, and the
#: next one's all-gather output while it is copied out into its parameters) and in backward (the
#: running block and the prefetched one).
FSDP_FWD_BLOCKS = 3
FSDP_BWD_BLOCKS = 2


@dataclass
class Param:
    shape: tuple[int, ...]
    elem_bytes: int
    trainable: bool
    fwd_point: int = -1  # its block's first forward point that uses it
    bwd_point: int = -1

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        return self.numel * self.elem_bytes


@dataclass
class RankView:
    """Rewrites of the single-GPU points. ``fwd_extra``/``bwd_extra``: bytes added to every
    point of a stack (gathered parameters, transient gradients), by stack index."""

    params_bytes: int
    grads: str  # "keep" | "drop" (ZeRO-2/3) | "shard" (FSDP)
    grad_shard_scale: float = 1.0  # FSDP2 mixed precision: fp32 shards of 16-bit gradients
    grad_fixed_bytes: int = 0  # partitions, buckets held in every phase
    bwd_bucket_bytes: int = 0  # ZeRO-1/2's bucket, backward only
    states_bytes: int = 0
    opt_temp_bytes: int = 0
    single_opt_temp_bytes: int = 0  # the one-GPU step's temporaries (replaced)
    opt_grad_bytes: int = 0  # the step's fp32 gradient partition
    fwd_extra: dict[int, Vec] = field(default_factory=dict)
    bwd_extra: dict[int, Vec] = field(default_factory=dict)
    #: extras at one point only, by (stack, point index), instead of the stack's
    fwd_at: dict[tuple[int, int], Vec] = field(default_factory=dict)
    bwd_at: dict[tuple[int, int], Vec] = field(default_factory=dict)
    #: backward extras of the stack's block run last (its first), by stack index, instead of
    #: ``bwd_extra`` (FSDP2: nothing left to prefetch)
    bwd_last_extra: dict[int, Vec] = field(default_factory=dict)
    #: bytes taken off the backward extras at every point but the last of the block run first
    #: in backward (the model's last: stack index -> (bytes, the block's number of backward
    #: points, whether the stack's one block is also the one run last)). FSDP2: its fp32
    #: reduce-scatter input exists only from its ``post_backward``, after its last op; before,
    #: the block holds its unsharded 16-bit gradients (at most the block's) and no earlier
    #: block's input (each later block runs beside the one before it, kept by
    #: ``comm_ctx.reduce_scatter_states``)
    bwd_relief: dict[int, tuple[int, int, bool]] = field(default_factory=dict)
    #: bytes added to the end of backward, a point of its own (FSDP2's root group reduce-scatters
    #: its gradients there, in the final backward callback)
    bwd_end_extra: Vec | None = None
    #: bytes added to the start of backward (before its first op), a point of its own (FSDP2
    #: gathers a root resharded after forward again there)
    bwd_start_extra: Vec | None = None
    #: FSDP2: segments the caching allocator takes again for the root group's two one-off
    #: buffers, whose earlier segments were carved up in between (:func:`fsdp_stranded_bytes`);
    #: reserved, never allocated at once (``analytic/reserved.py`` adds them)
    stranded_bytes: int = 0
    #: FSDP2: the root group's one-off buffers live at the end of backward (its unsharded
    #: parameters, and with trainable root parameters the fp32 reduce-scatter input and the
    #: largest unsharded gradient): single requests in segments of their own, which the
    #: fragmentation ratio does not scale (:func:`fsdp_reserved_extra`)
    root_held_bytes: int = 0
    #: FSDP2 with trainable root parameters and device-resident optimizer states: the segments
    #: backward and the next step add to the forward's (:func:`fsdp_segment_floor_bytes`)
    segment_floor_bytes: int = 0
    host_bytes: int = 0
    dp: int = 1
    #: FSDP2: the share of a trainable parameter's bytes rank 0 holds (its dim-0 shards padded
    #: to ``ceil(dim0 / dp)`` rows, :func:`fsdp_shard_ratio`); 0: ``1 / dp``
    shard_ratio: float = 0.0

    def point(self, v: Vec, *, backward: bool = False, optimizer: bool = False) -> Vec:
        if self.shard_ratio:
            shard = round(v[GRADS] * self.shard_ratio * self.grad_shard_scale)
        else:
            shard = round(-(-v[GRADS] // self.dp) * self.grad_shard_scale)
        grads = {"keep": v[GRADS], "drop": 0, "shard": shard}[self.grads]
        grads += self.grad_fixed_bytes
        if backward:
            grads += self.bwd_bucket_bytes
        temp = v[TEMP]
        if optimizer:
            grads += self.opt_grad_bytes
            temp += self.opt_temp_bytes - self.single_opt_temp_bytes
        return (self.params_bytes + v[PARAMS], grads, self.states_bytes, v[3], v[4], temp)

    def fwd(self, i: int, j: int, v: Vec) -> Vec:
        extra = self.fwd_at.get((i, j)) or self.fwd_extra.get(i)
        return vadd(self.point(v), extra) if extra else self.point(v)

    def bwd(self, i: int, j: int, v: Vec) -> Vec:
        extra = self.bwd_at.get((i, j)) or self.bwd_extra.get(i)
        p = self.point(v, backward=True)
        if extra and (i, j) not in self.bwd_at:
            extra = self._relieved(i, j, extra)
        return vadd(p, extra) if extra else p

    def bwd_last(self, i: int, j: int, v: Vec) -> Vec:
        """:meth:`bwd` for the stack's block run last in backward (its first in forward)."""
        if i not in self.bwd_last_extra or (i, j) in self.bwd_at:
            return self.bwd(i, j, v)
        extra = self._relieved(i, j, self.bwd_last_extra[i], last=True)
        return vadd(self.point(v, backward=True), extra)

    def _relieved(self, i: int, j: int, extra: Vec, *, last: bool = False) -> Vec:
        relief = self.bwd_relief.get(i)
        if relief is None or j >= relief[1] - 1 or (last and not relief[2]):
            return extra
        return vadd(extra, one(GRADS, -relief[0]))


def params_of(
    blocks: Sequence[BlockProfile], counts: Sequence[int], tied: bool
) -> list[list[Param]]:
    """Each stack's parameters (one block's), in creation order; a tied LM head's weight is the
    embedding's (dropped from the head)."""
    out = []
    for blk in blocks:
        points = blk.param_points or [(-1, -1)] * len(blk.params)
        out.append(
            [Param(s, b, t, f, k) for (s, b, t), (f, k) in zip(blk.params, points, strict=True)]
        )
    if tied and out[-1]:
        emb = out[0][0].shape if out[0] else None
        for k in range(len(out[-1]) - 1, -1, -1):
            if out[-1][k].shape == emb:
                del out[-1][k]
                break
    return out


def rank_view(
    *,
    shard: str,
    dp: int,
    offload: str,
    train: bool,
    optimizer: str,
    params: list[list[Param]],
    counts: Sequence[int],
    state_bytes: int,
    opt_temp_bytes: int,
    fsdp_masters: bool = False,
    reshard_after_forward: bool | int = True,
    hpz: int = 1,
    bwd_points: Sequence[int] = (),
) -> RankView:
    """Rank 0's view (see the module docstring). ``params``: per stack, one block's
    parameters; ``state_bytes``/``opt_temp_bytes``: the single GPU's optimizer states and step
    temporaries; ``dp``: the ranks the model is partitioned over (an HSDP shard group);
    ``fsdp_masters``: FSDP2 runs a MixedPrecisionPolicy over fp32 shards (the single-GPU
    points are the 16-bit model's); ``reshard_after_forward``: FSDP2's; ``hpz``: ZeRO++'s
    ``zero_hpz_partition_size`` (a secondary partition of every partitioned ZeRO-3 parameter);
    ``bwd_points``: per stack, its block's number of backward points (FSDP2 places the
    reduce-scatter input at the last one)."""
    trainable = [p for ps, c in zip(params, counts, strict=True) for p in ps * c if p.trainable]
    n_tr = sum(p.numel for p in trainable)
    pb = max((p.elem_bytes for p in trainable), default=4)
    if shard == "fsdp":
        full = sum(p.n_bytes * c for ps, c in zip(params, counts, strict=True) for p in ps)
        policy = FsdpPolicy(masters=fsdp_masters, reshard_after_forward=reshard_after_forward)
        view = _fsdp(dp, offload, params, counts, full, state_bytes, opt_temp_bytes, policy)
        relief = _fsdp_relief(params, policy.masters, dp)
        first = len(params) - 2  # the stack of the block run first in backward
        if relief and first > 0 and len(bwd_points) == len(params) and offload != "params":
            view.bwd_relief = {first: (relief, bwd_points[first], counts[first] == 1)}
        return view
    if shard == "ddp" or shard == "none":
        fixed = 0
        if shard == "ddp" and train:
            sizes = [p.n_bytes for p in reversed(trainable)]
            fixed = sum(_r512(n) for n in sharding.ddp_bucket_bytes(sizes))
        return RankView(
            params_bytes=0,
            grads="keep",
            grad_fixed_bytes=fixed,
            states_bytes=state_bytes,
            opt_temp_bytes=opt_temp_bytes,
            single_opt_temp_bytes=opt_temp_bytes,
        )
    stage = int(shard[-1])
    low = pb < 4
    scale = 4 / pb if low else 1.0
    part = sharding.partition_numel(n_tr, dp) if n_tr else 0
    offload_opt = offload in ("optimizer", "params")
    offload_params = offload == "params"
    states = round(-(-state_bytes // dp) * scale) + (
        part * sharding.FP32_MASTER_BYTES if low else 0
    )
    host = 0
    if offload_opt and train:
        host += states
        states = 0
    bucket = sharding.zero_ipg_bucket_numel(n_tr, stage=stage) * pb if train else 0
    view = RankView(
        params_bytes=0,
        grads="keep" if stage == 1 else "drop",
        states_bytes=states if train else 0,
        opt_temp_bytes=0
        if (offload_opt or optimizer in DEEPSPEED_FUSED_ADAM)
        else round(-(-opt_temp_bytes // dp) * scale),
        single_opt_temp_bytes=opt_temp_bytes,
        opt_grad_bytes=part * 4 if (low and not offload_opt and train) else 0,
        dp=dp,
    )
    if stage >= 2 and train and n_tr:
        if offload_opt:
            host += part * sharding.OFFLOAD_FP32_GRAD_BYTES
        else:
            view.grad_fixed_bytes += part * pb
        # the gradient just produced, before it is copied into the bucket and dropped
        for i, ps in enumerate(params):
            largest = max((p.n_bytes for p in ps if p.trainable), default=0)
            view.bwd_extra[i] = one(GRADS, largest)
    if stage == 3:
        view.grad_fixed_bytes += bucket
        full = sum(p.n_bytes * c for ps, c in zip(params, counts, strict=True) for p in ps)
        kept = sum(
            _zero3_rank_bytes(p, dp, offload_params) * c
            for ps, c in zip(params, counts, strict=True)
            for p in ps
        )
        secondary = sum(
            _r512(sharding.hpz_secondary_bytes(p.numel, p.elem_bytes, hpz)) * c
            for ps, c in zip(params, counts, strict=True)
            for p in ps
            if not sharding.zero3_persists(p.numel)
        )
        if offload_params:
            host += secondary  # DeepSpeed puts it on the parameters' remote device
            host += sum(
                _zero3_rank_bytes(p, dp, False) * c
                for ps, c in zip(params, counts, strict=True)
                for p in ps
                if not sharding.zero3_persists(p.numel)
            )
        else:
            kept += secondary
        view.params_bytes = kept - full
        fwd, bwd = _zero3_gathered(params, counts)
        for i in range(len(params)):
            view.fwd_extra[i] = one(PARAMS, fwd[i])
            view.bwd_extra[i] = vadd(view.bwd_extra.get(i, (0,) * 6), one(PARAMS, bwd[i]))  # type: ignore[arg-type]
    else:
        view.bwd_bucket_bytes = bucket
    if train:
        # The head's largest tensors (fp32 logits, log-probs, their gradients) live after the LM
        # head's forward has ended and before its backward starts: its gathered weight and its
        # gradient exist at the LM head's own forward and backward points only.
        head = len(params) - 1
        head_w: Param | None = max(params[head], key=lambda p: p.numel, default=None)
        fwd_x, bwd_x = view.fwd_extra.pop(head, None), view.bwd_extra.pop(head, None)
        if head_w is not None and fwd_x is not None and head_w.fwd_point >= 0:
            view.fwd_at[(head, head_w.fwd_point)] = fwd_x
        if head_w is not None and bwd_x is not None and head_w.bwd_point >= 0:
            view.bwd_at[(head, head_w.bwd_point)] = bwd_x
    view.host_bytes = host
    return view


def _zero3_rank_bytes(p: Param, dp: int, offloaded: bool) -> int:
    if sharding.zero3_persists(p.numel):
        return p.n_bytes
    return 0 if offloaded else sharding.partition_numel(p.numel, dp) * p.elem_bytes


def _zero3_gathered(
    params: list[list[Param]], counts: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Most bytes each stack holds gathered in forward and in backward: DeepSpeed's fetch of the
    running module plus the prefetch of the modules that follow while they fit in
    ``stage3_prefetch_bucket_size`` (and ``stage3_max_live_parameters``); a module's parameters
    are released when it finishes (``rank_replay._Zero`` applies the same rules to a trace)."""
    units = tuple(
        tuple((p.numel, p.n_bytes) for p in ps if not sharding.zero3_persists(p.numel))
        for ps in params
    )
    fwd, bwd = _gathered_walks(units, tuple(counts))
    return list(fwd), list(bwd)


@functools.lru_cache(maxsize=256)
def _gathered_walks(
    units: tuple[tuple[tuple[int, int], ...], ...], counts: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`_zero3_gathered` of each stack's partitioned parameters (numel, bytes) repeated
    ``counts`` times: a pure function of them, kept per process (a planner search runs the
    ZeRO-3 stacks of one model ~100 times with the same parameters, and each walk visits every
    parameter of the model: issue 32)."""
    seq: list[tuple[int, int, int]] = []  # (stack, numel, bytes) per partitioned parameter
    for i, (us, c) in enumerate(zip(units, counts, strict=True)):
        seq.extend([(i, numel, n_bytes) for numel, n_bytes in us] * c)
    return tuple(_walk(seq, len(units))), tuple(_walk(seq[::-1], len(units)))


def _walk(seq: list[tuple[int, int, int]], n_stacks: int) -> list[int]:
    d = sharding.DEEPSPEED_DEFAULTS
    most = [0] * n_stacks
    gathered: dict[int, tuple[int, int]] = {}  # position → (numel, bytes)
    for pos, (stack, numel, n_bytes) in enumerate(seq):
        gathered.setdefault(pos, (numel, n_bytes))
        budget = d["stage3_prefetch_bucket_size"]
        live = sum(n for n, _ in gathered.values())
        for ahead in range(pos + 1, len(seq)):
            need = seq[ahead][1]
            if need > budget:
                break
            if ahead not in gathered:
                if live + need > d["stage3_max_live_parameters"]:
                    break
                gathered[ahead] = (need, seq[ahead][2])
                live += need
            budget -= need
        most[stack] = max(most[stack], sum(b for _, b in gathered.values()))
        del gathered[pos]
    return most


@dataclass(frozen=True)
class FsdpPolicy:
    """How FSDP2 is applied: ``masters`` — a ``MixedPrecisionPolicy(param_dtype=16-bit,
    reduce_dtype=fp32)`` over fp32 sharded parameters (torchtitan's default,
    ``spec.rules.FSDP_MIXED_POLICY``); ``reshard_after_forward`` — ``fully_shard``'s."""

    masters: bool = False
    reshard_after_forward: bool | int = True

    def unsharded_bytes(self, n_blocks: int, layer_bytes: int, dp: int) -> tuple[int, int, int]:
        """Unsharded block parameters held in (a block's forward, a block's backward, the LM
        head's forward and backward) beyond the root. True: the
        running block and the next one's all-gather output with its copy-out (forward), the
        running and the prefetched block (backward). False: every finished block stays whole
        until its backward, which gathers nothing (at the forward/backward turn all
        ``n_blocks`` are whole). An int: finished blocks stay sharded over that many ranks
        (``fully_shard(reshard_after_forward=int)``), on top of True's gathers."""
        rf = self.reshard_after_forward
        fwd, bwd = FSDP_FWD_BLOCKS * layer_bytes, FSDP_BWD_BLOCKS * layer_bytes
        if rf is True or (rf is not False and rf >= dp):
            return fwd, bwd, 0
        if rf is False or rf == 1:
            # forward: the finished blocks, the running one and the next one's all-gather
            # output being copied out (the trace of 2- and 4-block Llamas holds n + 2 blocks)
            whole = n_blocks * layer_bytes
            return whole + (FSDP_FWD_BLOCKS - 1) * layer_bytes, max(bwd, whole), whole
        # at the last block's forward the other n - 1 hold their 1/rf post-forward shards
        kept = max(n_blocks - 1, 0) * -(-layer_bytes // rf)
        return fwd + kept, bwd + kept, kept


def _fsdp(
    dp: int,
    offload: str,
    params: list[list[Param]],
    counts: Sequence[int],
    full: int,
    state_bytes: int,
    opt_temp_bytes: int,
    policy: FsdpPolicy | None = None,
) -> RankView:
    """FSDP2: see the module docstring; ``full``: the single GPU's parameter bytes. Under a
    mixed-precision policy (``policy.masters``) the single-GPU points are the 16-bit model's
    (its activations and unsharded parameters); the shards of trainable parameters, their
    gradients and the optimizer states are fp32 (scaled by 4 / the 16-bit width), and each
    block's backward also holds the fp32 reduce-scatter input (``foreach_reduce`` copies the
    16-bit unsharded gradients into a ``reduce_dtype`` buffer)."""
    policy = policy or FsdpPolicy()
    width = max((p.elem_bytes for ps in params for p in ps if p.trainable), default=4)
    scale = sharding.FP32_MASTER_BYTES / width if policy.masters else 1.0
    # under the policy the model is fp32 at rest (torchtitan builds it so; the trace engine too):
    # every shard is fp32, the frozen base of an adapter job included
    shards = sum(
        sharding.fsdp_shard_numel(p.shape, dp)
        * (sharding.FP32_MASTER_BYTES if policy.masters else p.elem_bytes)
        * c
        for ps, c in zip(params, counts, strict=True)
        for p in ps
    )
    # unsharded parameters are views into their all-gather outputs, each of its padded shard x
    # the world size (``FSDPParam.init_all_gather_outputs`` / ``init_unsharded_param``, torch
    # 2.13.0 _fsdp_param.py), and the reduce-scatter input is padded alike (``foreach_reduce``'s
    # ``padded_unsharded_sizes``): a LoRA A matrix of rank 8 over 128 GPUs is gathered as 128
    # rows (:func:`fsdp_unsharded_bytes`)
    root = sum(fsdp_unsharded_bytes(p, dp) for p in params[0] + params[-1])
    layer = max((sum(fsdp_unsharded_bytes(p, dp) for p in ps) for ps in params[1:-1]), default=0)
    layer_grads = max(
        (sum(fsdp_unsharded_bytes(p, dp) for p in ps if p.trainable) for ps in params[1:-1]),
        default=0,
    )
    # the block's unsharded gradients as the reduce-scatter input: ``reduce_dtype`` (fp32) wide
    # under a mixed-precision policy
    reduce_input = round(layer_grads * scale)
    ratio = fsdp_shard_ratio(params, counts, dp)
    states = round(state_bytes * ratio * scale)
    temp = round(opt_temp_bytes * ratio * scale)
    n_layers = sum(c for c in counts[1:-1])
    fwd_blocks, bwd_blocks, at_head = policy.unsharded_bytes(n_layers, layer, dp)
    # The root group (embeddings, final norm, LM head: ``fully_shard(model)``), torch 2.13.0
    # (pytorch/pytorch cf30153c, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):
    # in forward ``wait_for_unshard`` keeps a group's all-gather output until the next group's
    # copy-out (implicit prefetch), so the first block's copy-out holds the root's all-gather
    # output beside the root and the block's own gather (placed at the embeddings' points,
    # just before); the root's ``post_backward`` runs in the final backward callback, so its
    # 16-bit unsharded gradients (the LM head's from its backward on) live to the end of
    # backward, where ``reshard()`` frees the root's parameters and ``foreach_reduce``
    # (_fsdp_collectives.py) copies the gradients into a ``reduce_dtype`` reduce-scatter
    # input before they are freed. The view counts every gradient as a shard (below): the
    # root's are added unsharded, less their shard.
    root_grads = sum(p.n_bytes for p in params[0] + params[-1] if p.trainable)
    head_grads = sum(p.n_bytes for p in params[-1] if p.trainable)
    first_gather = (FSDP_FWD_BLOCKS - 1) * layer  # the first block's all-gather and copy-out
    view = RankView(
        params_bytes=shards - full,
        grads="shard",
        grad_shard_scale=scale,
        states_bytes=states,
        opt_temp_bytes=temp,
        single_opt_temp_bytes=opt_temp_bytes,
        dp=dp,
        shard_ratio=ratio,
    )
    last = len(params) - 1
    # the root's all-gather output: every parameter's padded shard x the world size (a
    # parameter of fewer rows than ranks, such as ViT's (1, 197, 768) position embeddings, is
    # gathered dp times whole: 19 MiB at 64 GPUs)
    root_gather = sum(
        sharding.fsdp_shard_numel(p.shape, dp) * dp * p.elem_bytes for p in params[0] + params[-1]
    )
    for i in range(len(params)):
        in_block = 0 < i < last
        # blocks kept unsharded after their forward are still held at the LM head; memfit
        # places the most a stack holds at every point of it (the safe side)
        held_fwd = fwd_blocks if in_block else at_head * (i == last)
        held_bwd = bwd_blocks if in_block else at_head * (i == last)
        if i == 0 and last > 1:  # the root's all-gather output and the first block's gather
            held_fwd = root_gather + first_gather
        view.fwd_extra[i] = one(PARAMS, root + held_fwd)
        if in_block:
            # the previous block's all-gather output is freed at this block's copy-out, in its
            # pre-forward (``FSDPParamGroup.wait_for_unshard``): the rest of its forward holds
            # its own parameters and its own all-gather output (kept until the next group's
            # copy-out) (torch 2.13.0, _fsdp_param_group.py; the trace of llama-2-7b cut to 2
            # layers peaks at the second block's copy-out, the first block's activations saved)
            view.fwd_at[(i, 0)] = view.fwd_extra[i]
            view.fwd_extra[i] = one(PARAMS, root + held_fwd - layer)
        held_head = head_grads - _shard_bytes(head_grads, ratio, scale)
        view.bwd_extra[i] = vadd(
            one(PARAMS, root + held_bwd),
            one(GRADS, (reduce_input if in_block else 0) + held_head),
        )
        if in_block and i == 1 and policy.reshard_after_forward is True:
            # the model's first block runs last in backward: no block before it to prefetch
            # (``FSDPState._pre_backward`` prefetches the group that runs next; the root is
            # already whole), so its backward holds itself only (torch 2.13.0; the trace of
            # llama-2-7b cut to 2 layers peaks there with the root and one block whole)
            view.bwd_last_extra[i] = vadd(
                view.bwd_extra[i], one(PARAMS, -(FSDP_BWD_BLOCKS - 1) * layer)
            )
    if last > 0 and policy.reshard_after_forward is not False:
        # the root resharded after forward (``fully_shard(model, reshard_after_forward=True)``,
        # as torchtitan and memfit's trace call it) is gathered again where backward starts,
        # its all-gather output beside its copy-out and the loss's saved logits until the
        # copy-out ends (the trace of qwen3-8b lora_fsdp cut to 2 layers peaks there)
        view.bwd_start_extra = one(PARAMS, root + root_gather)
    if root_grads:
        # the reduce-scatter input beside (a) the root's unsharded gradients at their copy-in, or
        # (b) once they are freed, the reduce-scatter output (the root's gradient shards, in the
        # view's point) and the last one of them, which ``foreach_reduce``'s loop over
        # ``zip(fsdp_params, unsharded_grads)`` (world size > 1) leaves bound to its variable
        # ``unsharded_grad`` until the function returns (torch 2.13.0, _fsdp_collectives.py,
        # pytorch/pytorch cf30153c): (b) is the larger where the LM head's gradient exceeds the
        # unsharded part, at 2 GPUs (llama-3.1-8b mixed_fsdp cut to 2 layers: the trace's peak
        # holds the reduce input, its output and the LM head's bf16 gradient, 1 002 MiB)
        unsharded = root_grads - _shard_bytes(root_grads, ratio, scale)
        held = max(unsharded, _last_grad_bytes(params[0] + params[-1]) if dp > 1 else 0)
        root_input = sum(fsdp_unsharded_bytes(p, dp) for p in params[0] + params[-1] if p.trainable)
        view.bwd_end_extra = one(GRADS, held + round(root_input * scale))
    if last > 0:
        root_params = params[0] + params[-1]
        reduce_bytes = sum(
            fsdp_unsharded_bytes(p, dp) // p.elem_bytes * round(p.elem_bytes * scale)
            for p in root_params
            if p.trainable
        )
        regathered = policy.reshard_after_forward is not False
        view.stranded_bytes = fsdp_stranded_bytes(
            gather_bytes=root_gather,
            reduce_bytes=reduce_bytes,
            regathered=regathered,
            states_on_device=offload != "params",
        )
        largest_grad = max((p.n_bytes for p in root_params if p.trainable), default=0)
        view.root_held_bytes = root + (reduce_bytes + largest_grad if reduce_bytes else 0)
        if reduce_bytes and offload != "params":
            view.segment_floor_bytes = fsdp_segment_floor_bytes(
                gather_bytes=root_gather if regathered else 0,
                reduce_bytes=reduce_bytes,
                grad_bytes=largest_grad,
            )
        if offload == "params" and 0 < i < last:  # the reduce-scatter output before its D2H copy
            out = _shard_bytes(layer_grads, ratio, scale)
            view.bwd_extra[i] = vadd(view.bwd_extra[i], one(GRADS, out))
    if offload == "params":
        grad_shards = sum(
            sharding.fsdp_shard_numel(p.shape, dp) * round(p.elem_bytes * scale) * c
            for ps, c in zip(params, counts, strict=True)
            for p in ps
            if p.trainable
        )
        view.host_bytes = shards + grad_shards + states + temp
        view.params_bytes = -full
        view.states_bytes = 0
        view.opt_temp_bytes = 0
        view.grads = "drop"
    return view


def fsdp_stranded_bytes(
    *, gather_bytes: int, reduce_bytes: int, regathered: bool, states_on_device: bool
) -> int:
    """Reserved bytes a training step under FSDP2 holds beyond its fragmentation ratio: one more
    segment for each of the root group's (embeddings, final norm, LM head: ``fully_shard(model)``)
    two one-off buffers, the largest single requests of a step, whose first segment the caching
    allocator has carved up by the time the buffer is requested again. Source: torch 2.13.0
    (pytorch/pytorch cf30153c), ``torch/distributed/fsdp/_fully_shard/``:

    - ``gather_bytes``: the root's all-gather output (``_fsdp_collectives.foreach_all_gather``:
      one flat buffer of every parameter's dim-0-padded shard x world size, ``param_dtype``
      wide). Requested in forward and again at the start of backward where the root reshards
      after forward (``regathered``: ``fully_shard(model, reshard_after_forward=True)`` as
      torchtitan and memfit's trace call it; ``_fsdp_state._lazy_init`` keeps the root whole
      only when the argument is left to its default). In between, the blocks' all-gather
      outputs and copy-outs are placed by best fit in the forward's freed buffer, so the
      backward's request takes a new segment.
    - ``reduce_bytes``: the root's reduce-scatter input (``foreach_reduce``: its unsharded
      gradients, padded, copied into one ``reduce_dtype`` buffer, fp32 under torchtitan's
      policy), allocated in the final backward callback
      (``_fsdp_state._root_post_backward_final_callback``). After it is freed, the first
      optimizer step creates the Adam states lazily (``torch.optim.AdamW``'s first ``step``),
      and best fit places them in that freed segment (``states_on_device``; FSDP2's
      CPUOffloadPolicy keeps them on the host): the next step's request takes a new segment.

    Each is counted at its segment size (``cuda_allocator.segment_size``). Found in the trace
    engine's allocator replay of the fast-path grid's FSDP2 rows (docs/accuracy.md, "Fast path:
    FSDP2"; one stream, as ``allocator/caching.py`` models): olmo-2-7b, mistral-nemo-12b,
    llama-3.1-8b and qwen3-8b cut to 2 layers take both segments again, as does the 32-layer
    llama-3.1-8b at 4096 tokens; where the second step finds a hole for the reduce input
    (phi-4, qwen3-8b with checkpointing) or the head is tied, the rule lies over."""
    out = segment_size(round_size(gather_bytes)) if regathered and gather_bytes else 0
    if states_on_device and reduce_bytes:
        out += segment_size(round_size(reduce_bytes))
    return out


def fsdp_unsharded_bytes(p: Param, dp: int) -> int:
    """Bytes of ``p`` unsharded under FSDP2 over ``dp`` ranks: its all-gather output, every
    rank's dim-0 shard padded to ``ceil(dim0 / dp)`` rows, x ``dp`` (the unsharded parameter is
    a view into it: torch 2.13.0 ``FSDPParam.init_all_gather_outputs``, ``_fsdp_param.py``).
    ``p.n_bytes`` where ``dp`` divides dim 0."""
    return sharding.fsdp_shard_numel(p.shape, dp) * dp * p.elem_bytes


def fsdp_segment_floor_bytes(*, gather_bytes: int, reduce_bytes: int, grad_bytes: int) -> int:
    """The segments a training step under FSDP2 adds to its forward's where the root group's
    buffers outweigh the blocks' (many GPUs, a large vocabulary): the least it reserves is the
    forward's peak plus these (:func:`fsdp_reserved_extra`). Found segment by segment in the
    trace engine's allocator replay (one stream, ``allocator/caching.py``) of the fast-path
    grid's rows (docs/accuracy.md, "FSDP2: the root group's segments at any GPU count"): after
    the forward's segments (the shards, the root's all-gather output and copy-out, the first
    block's gather and copy-out) the step takes new segments only for

    - ``gather_bytes``: the root's all-gather output requested again where backward starts
      (0 where the root stays unsharded after forward), the forward's copy carved up by then;
    - ``grad_bytes``: the largest of the root's unsharded 16-bit gradients (the LM head's or
      the embeddings'), produced in backward while the root is whole;
    - ``reduce_bytes`` twice: the root's fp32 reduce-scatter input in the final backward
      callback, and again in the next step where the first optimizer step's lazily created
      Adam states or the next forward's gathers were placed in its freed segment by best fit
      (phi-4 cut to 2 layers takes it again at 12, 24, 32, 128 GPUs and not at 8, 16, 64:
      which free block best fit picks cannot be told from the sizes, so both are counted).

    Each at its segment size (``cuda_allocator.segment_size``)."""
    out = 2 * segment_size(round_size(reduce_bytes)) if reduce_bytes else 0
    for n in (gather_bytes, grad_bytes):
        out += segment_size(round_size(n)) if n else 0
    return out


def fsdp_reserved_extra(
    view: RankView, *, peak_bytes: int, forward_bytes: int, ratio: float
) -> int:
    """The bytes the analytic reserved rule adds to ``peak_bytes`` x its ratio under FSDP2
    (``reserved_rule(stranded_bytes=...)``), chosen so that the top of the range (``ratio``:
    ``RESERVED_RATIO["train"]``'s high end) is the larger of

    - the ratio rule with the root's buffers taken out of the scaled bytes: ``ratio`` x (peak -
      ``root_held_bytes``) + ``root_held_bytes`` + the segments taken again
      (:func:`fsdp_stranded_bytes`). The root's buffers are single requests in segments of
      their own (the replay's segment lists), never fragmented; never below ``ratio`` x peak,
      since the stranded segments outweigh ``(ratio - 1)`` x the held bytes;
    - the segment floor: the forward's peak (``forward_bytes``) + the segments backward and the
      next step add (:func:`fsdp_segment_floor_bytes`), what the replay reserves where the root
      dominates (phi-4 / olmo-2-7b full fine-tunes over 12-128 GPUs: the ratio rule was up to
      14 % under there).

    At the answer shown (``ratio`` the median) the same rule with that ratio.
    ``view.stranded_bytes`` where the view holds none of these."""
    held = min(view.root_held_bytes, peak_bytes)
    by_ratio = view.stranded_bytes - round((ratio - 1) * held)
    by_floor = forward_bytes + view.segment_floor_bytes - round(ratio * peak_bytes)
    if not view.segment_floor_bytes:
        by_floor = 0
    return max(0, by_ratio, by_floor)


def _fsdp_relief(params: list[list[Param]], masters: bool, dp: int = 1) -> int:
    """What a block's backward holds less than at its ``post_backward`` before its last op:
    the fp32 reduce-scatter input (``foreach_reduce``, torch 2.13.0 _fsdp_collectives.py,
    allocated in the group's ``post_backward`` after the block's backward ran) beyond the
    running block's unsharded 16-bit gradients, which are all the block holds of it while its
    ops run (at most the block's; the rank view counts the input at every point otherwise).
    0 without a mixed-precision policy (the input is the gradients' own width)."""
    if not masters:
        return 0
    padded = max(
        (sum(fsdp_unsharded_bytes(p, dp) for p in ps if p.trainable) for ps in params[1:-1]),
        default=0,
    )
    layer_grads = max((sum(p.n_bytes for p in ps if p.trainable) for ps in params[1:-1]), default=0)
    width = max((p.elem_bytes for ps in params for p in ps if p.trainable), default=4)
    return round(padded * sharding.FP32_MASTER_BYTES / width) - layer_grads


def _last_grad_bytes(root_params: Sequence[Param]) -> int:
    """Bytes of the unsharded gradient of the root group's last trainable parameter in
    registration order (``fully_shard`` manages a module's parameters in
    ``named_parameters()`` order: embeddings, final norm, LM head), 0 without one."""
    trainable = [p for p in root_params if p.trainable]
    return trainable[-1].n_bytes if trainable else 0


def _shard_bytes(n_bytes: int, ratio: float, scale: float) -> int:
    """The view's shard of ``n_bytes`` of single-GPU gradients (``RankView.point``)."""
    return round(n_bytes * ratio * scale)


def fsdp_shard_ratio(params: list[list[Param]], counts: Sequence[int], dp: int) -> float:
    """The share of the trainable parameters' elements rank 0 holds under FSDP2: each
    parameter's dim 0 chunked into ``dp`` pieces, rank 0's padded to ``ceil(dim0 / dp)`` rows
    (torch 2.13.0 ``FSDPParam._init_sharded_param``, ``_fsdp_param.py``: the gradient shard is
    a view of that size into the reduce-scatter output, ``foreach_reduce``; the Adam states are
    ``zeros_like`` it). Above ``1 / dp`` where dim 0 is not a multiple of ``dp``: a LoRA A
    matrix (rank rows) over more GPUs than its rank holds a whole row, 1/8 of it at rank 8 on
    16-64 GPUs (vit-base lora_fsdp cut to 2 layers: -3.3 / -6.7 / -12.7 % under the trace at
    16 / 32 / 64 GPUs with ``1 / dp``). ``1 / dp`` without trainable parameters."""
    total = padded = 0
    for ps, c in zip(params, counts, strict=True):
        for p in ps:
            if p.trainable:
                total += p.numel * c
                padded += sharding.fsdp_shard_numel(p.shape, dp) * c
    return padded / total if total else 1 / dp


def _r512(n: int) -> int:
    return -(-n // 512) * 512


# ----------------------------------------------------------------------------- tensor parallel
#: Model types the tensor-parallel split applies to (``sharding.TP_MODEL_TYPES``, shared with the
#: trace engine).
TP_MODEL_TYPES = sharding.TP_MODEL_TYPES


def per_rank_config(config: dict[str, Any], tp: int) -> dict[str, Any]:
    """One tensor-parallel rank's model (``sharding.tp_per_rank_config``)."""
    return sharding.tp_per_rank_config(config, tp)


__all__ = ["Param", "RankView", "params_of", "per_rank_config", "rank_view"]
