"""The step composer: block profiles → the phases of a training step or of one forward pass.

Public, for every program that composes its own step (``engine.py`` for chain programs; T5's
encoder-decoder and CLIP's two towers compose theirs from the same pieces):

* :func:`run_workload_block` — record and replay one block under a workload (its precision,
  ``--quant`` format, LoRA, checkpointing for repeated layers, ``zero_grad`` setting);
* :func:`totals` — parameter counts and bytes of a list of :class:`~.step.Stack` s;
  :func:`trainable_shapes`, :func:`embedding_shapes` — what the optimizer keeps states for;
* :func:`training_step` — forward, backward and optimizer phases from the step's static bytes;
* :func:`forward_pass` — one forward pass (inference) from the parameters and inputs;
* :func:`is_distributed`, :func:`rank_view_for` — one data-parallel rank's view of the points
  (``distributed.py``);
* :func:`cast_cache_bytes`, :func:`hidden_dtype`, :func:`configure_quant`, :data:`ID_BYTES`.

Everything returns byte counts as component vectors (``graph.py``); :class:`Simulated` is what
every program's ``simulate`` returns to the API. Pure Python; no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import NotModelledError
from memfit.estimate.analytic.distributed import (
    Param,
    RankView,
    fsdp_reserved_extra,
    params_of,
    rank_view,
)
from memfit.estimate.analytic.graph import (
    ACTS,
    DTYPE_BYTES,
    GRADS,
    PARAMS,
    STATES,
    TEMP,
    Tensor,
    Vec,
    one,
    vadd,
)
from memfit.estimate.analytic.host_checkpoint import (
    OFFLOADED,
    checkpoints_on_host,
    recompute_mode,
)
from memfit.estimate.analytic.ops import PARAM_DTYPE, Ops
from memfit.estimate.analytic.optimizer import step_temp_in_backward
from memfit.estimate.analytic.reserved import RESERVED_RATIO
from memfit.estimate.analytic.step import BlockProfile, Stack, run_block, run_stacks
from memfit.estimate.analytic.unsloth import UNSLOTH_MODEL_TYPES
from memfit.estimate.optim_states import CUDA_MIN_BLOCK_BYTES
from memfit.estimate.quant import LINEAR_SUBCLASSES
from memfit.spec import PRECISION_RULES, WorkloadSpec

#: Bytes of one int64 token id (``input_ids``, ``labels``).
ID_BYTES = DTYPE_BYTES["i64"]
#: What ``torch.amp.GradScaler`` keeps on the device in a ``16-mixed`` step (the precision's
#: ``grad_scaler``), as 0-d tensors of one caching-allocator block each (``CUDA_MIN_BLOCK_BYTES``),
#: by point of the step (torch/amp/grad_scaler.py, torch 2.13.0): ``static`` — ``_scale``
#: (float32) and ``_growth_tracker`` (int32), created by the first ``scale()``
#: (``_lazy_init_scale_growth_tracker``) and kept for the run; ``backward`` — the scaled loss
#: ``outputs * self._scale`` that ``.backward()`` runs from; ``unscale`` — inside ``unscale_``,
#: ``inv_scale`` (``_scale.double().reciprocal().float()``) and ``found_inf``, and the copies
#: ``_unscale_grads_`` takes of both (``_MultiDeviceReplicator.get``: ``.to(device,
#: copy=True)``) for ``_amp_foreach_non_finite_check_and_unscale_``, which unscales the
#: gradients in place; ``optimizer`` — the ``found_inf`` copy kept per optimizer
#: (``found_inf_per_device``) through ``optimizer.step()`` until ``update()``.
GRAD_SCALER_BLOCKS = {"static": 2, "backward": 1, "unscale": 4, "optimizer": 1}
#: A block's recorded body: its input (None for embeddings) and the outputs gradients flow from.
Body = Callable[[Ops], tuple[Tensor | None, list[Tensor]]]


@dataclass
class Simulated:
    """``candidates``: per phase, every point that can be the phase's peak (the peak is the one
    with the most bytes; the batch API keeps them to re-evaluate at other batch sizes)."""

    candidates: dict[str, list[Vec]]
    n_params: int
    n_trainable: int
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def quant_format(model_type: str, wl: WorkloadSpec) -> str | None:
    """The ``--quant`` format the model's Linear layers get (None: none; transformers leaves
    a model's ``nn.Linear`` subclasses unquantized, ``quant.LINEAR_SUBCLASSES``)."""
    if wl.quant == "none" or model_type in LINEAR_SUBCLASSES:
        return None
    return str(wl.quant)


def configure_quant(o: Ops, model_type: str, wl: WorkloadSpec) -> None:
    """Set a block's ``--quant`` settings on its :class:`Ops` (``engine.kbit_workload``
    explains ``quant_dtype``)."""
    o.quant = quant_format(model_type, wl)
    o.quant_group_size = wl.quant_group_size
    o.quant_dtype = wl.quant_compute_dtype
    o.quant_experts = wl.quant_experts


def hidden_dtype(precision: str) -> str:
    """The residual stream's dtype: the parameters' (fp32 under AMP: fp32 embeddings plus half
    matmul outputs promote to fp32)."""
    return PARAM_DTYPE[precision]


def run_workload_block(
    wl: WorkloadSpec,
    body: Body,
    *,
    model_type: str,
    batch: int,
    train: bool,
    repeated: bool = False,
    frozen: bool = False,
    casts_exist: bool = False,
) -> BlockProfile:
    """Record ``body`` as one block of ``wl`` and replay it (``step.run_block``). ``repeated``:
    one of the model's repeated layers (checkpointed under ``wl.checkpointing``; GPTQ/AWQ
    quantize only those); ``frozen``: its parameters are frozen; ``casts_exist``: a later pass of
    a generation under autocast, whose weight casts an earlier pass cached."""

    def build(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
        configure_quant(o, model_type, wl)
        o.in_repeated_block = repeated
        o.batch = batch
        o.casts_exist = casts_exist
        o.saved_modules = saved_module_roles(wl)
        o.lora_dropout = wl.lora_dropout if wl.lora_rank and wl.is_train else 0.0
        if wl.kernels == "unsloth" and wl.is_train and model_type in UNSLOTH_MODEL_TYPES:
            o.kernels = "unsloth"
        return body(o)

    lora = (wl.lora_rank, wl.lora_targets) if wl.lora_rank and wl.is_train else None
    prof = run_block(
        build,
        precision=wl.run_precision,
        train=train,
        frozen=frozen,
        lora=lora,
        checkpointing=recompute_mode(wl.checkpointing) if repeated else "none",
        existing_grads=holds_grads(wl),
        step_temp=step_temp_in_backward(wl.optimizer or "none") if wl.optimizer_in_bwd else None,
    )
    if repeated and wl.checkpointing == OFFLOADED and prof.checkpoint_bytes:
        prof = checkpoints_on_host(prof)
    return prof


#: Shardings whose rank keeps no per-parameter ``.grad`` of its own between backward passes:
#: DeepSpeed ZeRO-2/3 copy each gradient into the reduce bucket as it is produced and point
#: ``param.grad`` at the bucket (``grad_reduc.data = new_grad_tensor.data``, or clear it), and
#: with the optimizer offloaded accumulate the micro-batches on the host
#: (``copy_grads_in_partition`` -> ``async_accumulate_grad_in_cpu_via_gpu``;
#: deepspeed/runtime/zero/stage_1_and_2.py at deepspeedai/DeepSpeed edaa722). The rank view
#: (``distributed.rank_view``: gradients ``drop``) counts each new gradient once, as it is
#: produced.
GRADS_IN_BUCKETS = ("zero2", "zero3")


def holds_grads(wl: WorkloadSpec) -> bool:
    """Whether backward sums each new gradient into one the parameter already holds
    (``zero_grad(set_to_none=False)``, gradient accumulation): the new one is then a temporary.
    Not with the optimizer stepped in backward, nor under :data:`GRADS_IN_BUCKETS`, where the
    rank holds no gradient of its own (counting the new one as a temporary there as well counted
    it twice: the LM head's, +16.7 % on olmo-2-7b's ZeRO-2-offload row of the fast-path grid)."""
    if wl.zero_grad_set_to_none or wl.optimizer_in_bwd:
        return False
    return not (wl.is_train and wl.shard in GRADS_IN_BUCKETS)


#: peft ``modules_to_save`` names the chain programs model, by role: the input embedding and the
#: LM head as the families of transformers name them (Llama ``embed_tokens``, GPT-2 ``wte``,
#: BLOOM / Falcon ``word_embeddings``, GPT-NeoX ``embed_in`` / ``embed_out``).
SAVED_MODULE_ROLES = {
    "embed_tokens": "embed",
    "wte": "embed",
    "word_embeddings": "embed",
    "embed_in": "embed",
    "lm_head": "head",
    "embed_out": "head",
}


def saved_module_roles(wl: WorkloadSpec) -> frozenset[str]:
    """The roles of ``wl``'s LoRA ``modules_to_save`` (training with LoRA only); a name the
    analytic engine does not model is refused by :func:`check_saved_modules` first."""
    if not (wl.lora_rank and wl.is_train):
        return frozenset()
    return frozenset(SAVED_MODULE_ROLES[n.rsplit(".", 1)[-1]] for n in wl.lora_modules_to_save)


def check_saved_modules(wl: WorkloadSpec, *, tied: bool, chain: bool) -> None:
    """NotModelledError where the analytic engine cannot model ``wl``'s ``modules_to_save``:
    other modules than the embedding / LM head, tied embeddings (peft wraps each side of the
    tie), programs that are not one chain, distributed ranks."""
    names = wl.lora_modules_to_save if wl.lora_rank and wl.is_train else ()
    if not names:
        return
    why = ""
    unknown = [n for n in names if n.rsplit(".", 1)[-1] not in SAVED_MODULE_ROLES]
    if unknown:
        why = f"modules_to_save {', '.join(unknown)} (it models the embedding and the LM head)"
    elif tied:
        why = "modules_to_save on a model with tied embeddings"
    elif not chain:
        why = "modules_to_save on an encoder-decoder / two-tower model"
    elif is_distributed(wl):
        why = "modules_to_save across ranks"
    if why:
        raise NotModelledError(
            f"the analytic engine does not model {why}; the trace engine runs peft's "
            "ModulesToSaveWrapper (--engine trace)",
            engine="analytic",
        )


@dataclass(frozen=True, kw_only=True)
class Totals:
    """Parameter counts and bytes of a model's stacks (each block times its count)."""

    n_params: int
    n_trainable: int
    param_bytes: int
    grad_bytes: int


def totals(stacks: list[Stack]) -> Totals:
    """Sums over ``stacks``; a weight two blocks share (tied embeddings) is counted by both:
    the caller subtracts it."""
    return Totals(
        n_params=sum(st.profile.n_params * st.count for st in stacks),
        n_trainable=sum(st.profile.n_trainable * st.count for st in stacks),
        param_bytes=sum(st.profile.param_bytes * st.count for st in stacks),
        grad_bytes=sum(st.profile.grad_bytes * st.count for st in stacks),
    )


def trainable_shapes(stacks: list[Stack]) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every trainable parameter (optimizer states are per tensor)."""
    return [sh for st in stacks for sh in st.profile.trainable_shapes * st.count]


def embedding_shapes(stacks: list[Stack]) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every trainable ``nn.Embedding`` weight (8-bit optimizers keep them
    32-bit)."""
    return [e for st in stacks for e in st.profile.embedding_shapes * st.count]


def cast_cache_bytes(stacks: list[Stack]) -> int:
    """Bytes of the weight casts autocast keeps cached after these stacks."""
    return sum(st.profile.cast_bytes * st.count for st in stacks)


def is_distributed(wl: WorkloadSpec) -> bool:
    """Whether ``wl`` runs on more than one GPU or offloads (a rank view rewrites the points)."""
    return wl.gpus > 1 or wl.shard != "none" or wl.offload != "none"


def rank_view_for(
    wl: WorkloadSpec,
    stacks: list[Stack],
    *,
    tied: bool,
    opt: Any = None,
    params: list[list[Param]] | None = None,
) -> RankView:
    """One data-parallel rank's view of ``stacks`` (``distributed.rank_view``). ``params``: the
    stacks' parameters when the caller drops shared ones itself (default ``params_of``)."""
    blocks = [st.profile for st in stacks]
    counts = [st.count for st in stacks]
    return rank_view(
        shard=str(wl.shard),
        dp=wl.dp_shard,
        fsdp_masters=wl.fsdp_policy is not None,
        reshard_after_forward=wl.reshard_after_forward,
        hpz=wl.zero_hpz_partition_size,
        offload=wl.offload,
        train=wl.is_train,
        optimizer=wl.optimizer or "none",
        params=params if params is not None else params_of(blocks, counts, tied),
        counts=counts,
        state_bytes=opt.state_bytes if opt is not None else 0,
        opt_temp_bytes=opt.temp_bytes if opt is not None else 0,
        # the first block's relief in backward (distributed.RankView.bwd_relief) is checked
        # against the trace without activation checkpointing only: with it, the rows at 8 GPUs
        # fall under the trace (llama-2-7b mixed_ckpt_fsdp -1.3 %, vit-base -5.3 %), so the
        # reduce-scatter input stays at every point there
        bwd_points=[len(b.bwd) for b in blocks] if wl.checkpointing == "none" else (),
    )


def training_step(
    stacks: list[Stack],
    wl: WorkloadSpec,
    *,
    param_bytes: int,
    grad_bytes: int,
    opt: Any,
    inputs: int,
    view: RankView | None,
    n_params: int,
    n_trainable: int,
) -> Simulated:
    """The phases of one training step through ``stacks`` (in forward order): forward and
    backward from the step's static bytes (parameters, optimizer states, gradients kept from the
    previous step, the inputs), then the optimizer step; ``view``: one data-parallel rank's
    rewrite of every point."""
    in_bwd = wl.optimizer_in_bwd
    if in_bwd and view is not None:
        raise NotModelledError(
            "optimizer_in_bwd is modelled on one GPU without sharding or offload: use "
            "--gpus 1 --shard none, or drop --optimizer-in-bwd",
            engine="analytic",
        )
    held = grad_bytes if not (wl.zero_grad_set_to_none or in_bwd) else 0
    scaler = _grad_scaler_bytes(wl)
    static = vadd(_state(param_bytes, opt.state_bytes, held, inputs), scaler["static"])
    pts, cur = run_stacks(static, stacks, backward=False, point=view.fwd if view else None)
    cur = vadd(cur, scaler["backward"])  # the scaled loss backward() runs from
    bpts, end = run_stacks(
        cur,
        stacks,
        backward=True,
        point=view.bwd if view else None,
        last_point=view.bwd_last if view else None,
    )
    # optimizer_in_bwd: every parameter stepped in backward (Graph.step_in_backward); the
    # optimizer phase holds the gradients backward left (a tied weight's, stepped last)
    optim = (
        _state(param_bytes, opt.state_bytes, end[GRADS], inputs)
        if in_bwd
        else vadd(
            _state(param_bytes, opt.state_bytes, grad_bytes, inputs), one(TEMP, opt.temp_bytes)
        )
    )
    optim = vadd(optim, vadd(scaler["static"], scaler["optimizer"]))
    # 16-mixed: GradScaler.unscale_ before the step is a point of its own (its temporaries, the
    # step's not yet allocated)
    unscale = (
        [vadd(_state(param_bytes, opt.state_bytes, grad_bytes, inputs), scaler["unscale"])]
        if PRECISION_RULES[wl.run_precision].grad_scaler
        else []
    )
    info: dict[str, Any] = {
        "optimizer_state_bytes": opt.state_bytes,
        "paged_bytes": opt.paged_bytes,
    }
    if view is not None:
        if view.bwd_end_extra is not None:  # a point of its own at the end of backward
            bpts = [*bpts, vadd(view.point(end, backward=True), view.bwd_end_extra)]
        static, optim = view.point(static), view.point(optim, optimizer=True)
        unscale = [view.point(p, optimizer=True) for p in unscale]
        cur = view.point(cur, backward=True)
        if view.bwd_start_extra is not None:  # a point of its own at the start of backward
            cur = vadd(cur, view.bwd_start_extra)
        info["host_bytes"] = view.host_bytes
        info["optimizer_state_bytes"] = view.states_bytes
    candidates = {
        "forward": [static, *pts],
        "backward": [cur, *bpts],
        "optimizer": [optim, *unscale],
    }
    if view is not None and view.stranded_bytes:  # FSDP2's root buffers
        peak = max(sum(v) for vs in candidates.values() for v in vs)
        forward = max(sum(v) for v in candidates["forward"])
        mid, _low, high = RESERVED_RATIO["train"]
        # what the reserved rule adds at the top of its range and at the answer shown
        info["fsdp_stranded_bytes"] = fsdp_reserved_extra(
            view, peak_bytes=peak, forward_bytes=forward, ratio=high
        )
        info["fsdp_stranded_point_bytes"] = fsdp_reserved_extra(
            view, peak_bytes=peak, forward_bytes=forward, ratio=mid
        )
        # the segments taken again alone (distributed.fsdp_stranded_bytes)
        info["fsdp_segments_again_bytes"] = view.stranded_bytes
    return Simulated(
        candidates=candidates,
        n_params=n_params,
        n_trainable=n_trainable,
        info=info,
    )


def _grad_scaler_bytes(wl: WorkloadSpec) -> dict[str, Vec]:
    """:data:`GRAD_SCALER_BLOCKS` as vectors by point (``unscale`` with the state): its state
    counted with the optimizer's (as the trace labels it), the rest as temporaries; all zero where
    the step's precision runs no GradScaler (``PRECISION_RULES``: only ``16-mixed``)."""
    n = GRAD_SCALER_BLOCKS if PRECISION_RULES[wl.run_precision].grad_scaler else {}
    return {
        "static": one(STATES, n.get("static", 0) * CUDA_MIN_BLOCK_BYTES),
        "backward": one(TEMP, n.get("backward", 0) * CUDA_MIN_BLOCK_BYTES),
        "unscale": vadd(
            one(STATES, n.get("static", 0) * CUDA_MIN_BLOCK_BYTES),
            one(TEMP, n.get("unscale", 0) * CUDA_MIN_BLOCK_BYTES),
        ),
        "optimizer": one(TEMP, n.get("optimizer", 0) * CUDA_MIN_BLOCK_BYTES),
    }


def _state(param_bytes: int, state_bytes: int, grad_bytes: int, inputs: int) -> Vec:
    return vadd(
        vadd(one(PARAMS, param_bytes), one(STATES, state_bytes)),
        vadd(one(GRADS, grad_bytes), one(ACTS, inputs)),
    )


@dataclass(frozen=True, kw_only=True)
class ForwardPass:
    """One forward pass: ``points`` (the static bytes first, as the rank sees them), the live
    bytes when it ends (single-GPU view), its static bytes and the rank view (None: one GPU)."""

    points: list[Vec]
    end: Vec
    static: Vec
    view: RankView | None

    @property
    def info(self) -> dict[str, Any]:
        return {"host_bytes": self.view.host_bytes} if self.view is not None else {}


def forward_pass(
    stacks: list[Stack], wl: WorkloadSpec, *, param_bytes: int, inputs: int, tied: bool
) -> ForwardPass:
    """Inference through ``stacks`` from the parameters and the inputs (``tied``: the model's
    embedding is its LM head's weight, one parameter)."""
    static = vadd(one(PARAMS, param_bytes), one(ACTS, inputs))
    view = rank_view_for(wl, stacks, tied=tied) if is_distributed(wl) else None
    pts, cur = run_stacks(static, stacks, backward=False, point=view.fwd if view else None)
    first = static if view is None else view.point(static)
    return ForwardPass(points=[first, *pts], end=cur, static=static, view=view)


__all__ = [
    "ID_BYTES",
    "Body",
    "ForwardPass",
    "Simulated",
    "Totals",
    "cast_cache_bytes",
    "configure_quant",
    "embedding_shapes",
    "forward_pass",
    "hidden_dtype",
    "is_distributed",
    "quant_format",
    "rank_view_for",
    "run_workload_block",
    "totals",
    "trainable_shapes",
    "training_step",
]
