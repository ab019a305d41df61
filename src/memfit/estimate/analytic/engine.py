"""Run a family's program through a training step or a generation, phase by phase.

Chain programs (an embedding block, identical layers, a head) go through ``simulate_train`` /
``simulate_infer``; a program whose model is not one chain (T5's encoder-decoder, CLIP's two
towers) defines its own ``simulate`` and composes its blocks with the same pieces
(``training_step``, ``run_stacks``, the rank view).

Returns :class:`Simulated`: each phase's peak as a component vector (see ``graph.py``), the
parameter counts, and what the optimizer keeps. Pure Python; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from memfit.estimate.analytic.distributed import RankView, params_of, rank_view
from memfit.estimate.analytic.families import Shared, Work
from memfit.estimate.analytic.graph import (
    ACTS,
    DTYPE_BYTES,
    GRADS,
    KV,
    PARAMS,
    STATES,
    TEMP,
    Vec,
    one,
    vadd,
)
from memfit.estimate.analytic.ops import PARAM_DTYPE, Ops
from memfit.estimate.analytic.optimizer import optimizer_bytes
from memfit.estimate.analytic.step import BlockProfile, Stack, run_block, run_stacks
from memfit.estimate.quant import LINEAR_SUBCLASSES
from memfit.spec import WorkloadSpec

#: Bytes of one int64 token id (``input_ids``, ``labels``).
ID_BYTES = DTYPE_BYTES["i64"]


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
    """Set a block's ``--quant`` settings on its :class:`Ops` (``kbit_workload`` explains
    ``quant_dtype``)."""
    o.quant = quant_format(model_type, wl)
    o.quant_group_size = wl.quant_group_size
    o.quant_dtype = wl.quant_compute_dtype


def kbit_workload(wl: WorkloadSpec) -> WorkloadSpec:
    """The workload the programs run for ``prepare_kbit``: peft casts every unquantized half
    parameter to fp32 (embeddings, norms, LM head, LoRA's base biases), so the model runs as an
    fp32 model around quantized layers that still compute in the loaded dtype. GPTQ and torchao
    (fp8) models are left as they are, as are AMP ones (their parameters are fp32 already)."""
    if (
        not wl.prepare_kbit
        or wl.quant in ("int4-gptq", "fp8")
        or wl.precision not in HALF_PRECISIONS
    ):
        return wl
    return replace(
        wl, precision="fp32", prepare_kbit=False, quant_compute_dtype=PARAM_DTYPE[wl.precision]
    )


#: Precisions whose parameters are half precision (what peft's casts change).
HALF_PRECISIONS = ("bf16", "fp16")


def hidden_dtype(precision: str) -> str:
    """The residual stream's dtype: the parameters' (fp32 under AMP: fp32 embeddings plus half
    matmul outputs promote to fp32)."""
    return PARAM_DTYPE[precision]


def _block(prog: Any, kind: str, wl: WorkloadSpec, w: Work, **kw: Any) -> BlockProfile:
    a = prog.a
    h = a.hidden
    frozen = kw.pop("frozen", False)
    in_rg = kw.pop("in_rg", True)
    tied = kw.pop("tied", False)
    lm_head_trainable = kw.pop("lm_head_trainable", True)
    freeze_tokens = kw.pop("freeze_tokens", False)
    casts_exist = kw.pop("casts_exist", False)
    cached_casts = kw.pop("cached_casts", 0)

    def build(o: Ops) -> tuple[Any, list[Any]]:
        o.lm_head_trainable = lm_head_trainable
        o.casts_exist = casts_exist
        configure_quant(o, prog.a.model_type, wl)
        o.in_repeated_block = kind == "layer"
        o.batch = w.batch
        if kind == "embed":
            o.tied_embedding = tied
            o.freeze_token_embedding = freeze_tokens
            x, _ = prog.embed(o, w)
            return None, [x]
        x = o.g.input(w.tokens * h, hidden_dtype(wl.precision), rg=in_rg)
        if kind == "head":
            outs = prog.head(o, x, w)
            if cached_casts:  # the model returns, autocast exits: its cached weight casts go
                o.g.touch(o.g.input(cached_casts, "u8", rg=False))
            return x, outs[-1:]  # backward starts from the loss
        sh: Shared = prog.shared_for_layer(o, w, hidden_dtype(wl.precision))
        out = x
        for i in range(prog.period):
            out = prog.layer(o, out, w, sh, i)
            o.release_layer_locals()
        # The caller's ``hidden_states`` (the loop variable) references the input until the
        # layer returns.
        o.g.touch(x)
        o.g.hold(out)
        return x, [out]

    lora = (wl.lora_rank, wl.lora_targets) if wl.lora_rank and wl.is_train else None
    return run_block(
        build,
        precision=wl.precision,
        train=w.train,
        frozen=frozen,
        lora=lora,
        checkpointing=wl.checkpointing if kind == "layer" else "none",
        existing_grads=not wl.zero_grad_set_to_none,
        **kw,
    )


def simulate_train(prog: Any, wl: WorkloadSpec, task: str) -> Simulated:
    a = prog.a
    s = prog.q_len(wl.seq_len)
    w = Work(
        batch=wl.batch_size,
        q_len=s,
        kv_len=s,
        impl=wl.attention,
        task=task,
        train=True,
        use_cache=prog.use_cache and wl.checkpointing == "none",
        checkpointed=wl.checkpointing != "none",
    )
    frozen = wl.freeze_layers
    lora = wl.lora_rank is not None
    tied_grad = a.tie and not lora and not frozen
    embed = _block(prog, "embed", wl, w, freeze_tokens=bool(frozen), tied=tied_grad)
    n_periods = a.n_layers // prog.period
    stacks = []
    # freeze_layers freezes the token embedding only (get_input_embeddings): learned positions
    # stay trainable, so the frozen layers still carry gradients through to them.
    emb_rg = embed.out_rg
    if frozen:
        stacks.append(Stack(_block(prog, "layer", wl, w, frozen=True, in_rg=emb_rg), frozen))
    if n_periods - frozen > 0:
        first_rg = emb_rg
        trainable = _block(prog, "layer", wl, w, in_rg=True)
        if not first_rg:
            # The first trainable layer's input needs no gradient (frozen embeddings below).
            stacks.append(Stack(_block(prog, "layer", wl, w, in_rg=False), 1))
            stacks.append(Stack(trainable, n_periods - frozen - 1))
        else:
            stacks.append(Stack(trainable, n_periods - frozen))
    head = _block(
        prog,
        "head",
        wl,
        w,
        frozen=lora,
        lm_head_trainable=not (a.tie and (frozen or lora)),
        cached_casts=cast_cache_bytes(stacks),
    )
    blocks = [embed] + [s.profile for s in stacks] + [head]
    counts = [1] + [s.count for s in stacks] + [1]
    n_params = sum(b.n_params * c for b, c in zip(blocks, counts, strict=True))
    n_train = sum(b.n_trainable * c for b, c in zip(blocks, counts, strict=True))
    param_bytes = sum(b.param_bytes * c for b, c in zip(blocks, counts, strict=True))
    grad_bytes = sum(b.grad_bytes * c for b, c in zip(blocks, counts, strict=True))
    if a.tie:
        tied = a.vocab * prog.embed_dim
        n_params -= tied
        param_bytes -= tied * DTYPE_BYTES[PARAM_DTYPE[wl.precision]]
        if tied_grad:
            n_train -= tied
            grad_bytes -= tied * DTYPE_BYTES[PARAM_DTYPE[wl.precision]]
    param_bytes += prog.buffer_bytes(wl.precision)
    shapes = _trainable_shapes(blocks, counts)
    if tied_grad:
        shapes.remove(((a.vocab, prog.embed_dim), PARAM_DTYPE[wl.precision]))
    embeddings = [e for b in blocks for e in b.embedding_shapes]
    opt = optimizer_bytes(wl.optimizer or "none", shapes, grad_bytes, embedding_shapes=embeddings)
    inputs = prog.input_bytes(wl.batch_size, s, True)
    all_stacks = [Stack(embed, 1), *stacks, Stack(head, 1)]
    view = _rank_view(wl, blocks, counts, a.tie, opt) if _distributed(wl) else None
    return training_step(
        all_stacks,
        wl,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        opt=opt,
        inputs=inputs,
        view=view,
        n_params=n_params,
        n_trainable=n_train,
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
    held = grad_bytes if not wl.zero_grad_set_to_none else 0
    static = _state(param_bytes, opt.state_bytes, held, inputs)
    pts, cur = run_stacks(static, stacks, backward=False, point=view.fwd if view else None)
    bpts, _ = run_stacks(cur, stacks, backward=True, point=view.bwd if view else None)
    optim = vadd(
        _state(param_bytes, opt.state_bytes, grad_bytes, inputs), one(TEMP, opt.temp_bytes)
    )
    info: dict[str, Any] = {
        "optimizer_state_bytes": opt.state_bytes,
        "paged_bytes": opt.paged_bytes,
    }
    if view is not None:
        static, optim = view.point(static), view.point(optim, optimizer=True)
        cur = view.point(cur, backward=True)
        info["host_bytes"] = view.host_bytes
        info["optimizer_state_bytes"] = view.states_bytes
    return Simulated(
        candidates={"forward": [static, *pts], "backward": [cur, *bpts], "optimizer": [optim]},
        n_params=n_params,
        n_trainable=n_trainable,
        info=info,
    )


def _state(param_bytes: int, state_bytes: int, grad_bytes: int, inputs: int) -> Vec:
    return vadd(
        vadd(one(PARAMS, param_bytes), one(STATES, state_bytes)),
        vadd(one(GRADS, grad_bytes), one(ACTS, inputs)),
    )


def _distributed(wl: WorkloadSpec) -> bool:
    return wl.gpus > 1 or wl.shard != "none" or wl.offload != "none"


def _rank_view(
    wl: WorkloadSpec, blocks: list[BlockProfile], counts: list[int], tied: bool, opt: Any
) -> RankView:
    return rank_view(
        shard=str(wl.shard),
        dp=wl.dp,
        offload=wl.offload,
        train=wl.is_train,
        optimizer=wl.optimizer or "none",
        params=params_of(blocks, counts, tied),
        counts=counts,
        state_bytes=opt.state_bytes if opt is not None else 0,
        opt_temp_bytes=opt.temp_bytes if opt is not None else 0,
    )


def _trainable_shapes(
    blocks: list[BlockProfile], counts: list[int]
) -> list[tuple[tuple[int, ...], str]]:
    out: list[tuple[tuple[int, ...], str]] = []
    for b, c in zip(blocks, counts, strict=True):
        out.extend(b.trainable_shapes * c)
    return out


def _infer_blocks(
    prog: Any, wl: WorkloadSpec, w: Work, *, casts_exist: bool = False
) -> list[Stack]:
    """``casts_exist``: a later pass of a generation under autocast, whose weight casts the
    first pass left in autocast's cache."""
    a = prog.a
    embed = _block(prog, "embed", wl, w, casts_exist=casts_exist)
    layer = _block(prog, "layer", wl, w, casts_exist=casts_exist)
    head = _block(prog, "head", wl, w, casts_exist=casts_exist)
    return [Stack(embed, 1), Stack(layer, a.n_layers // prog.period), Stack(head, 1)]


def cast_cache_bytes(stacks: list[Stack]) -> int:
    """Bytes of the weight casts autocast keeps cached after these inference stacks."""
    return sum(st.profile.cast_bytes * st.count for st in stacks)


def simulate_infer(prog: Any, wl: WorkloadSpec, task: str) -> Simulated:
    """Inference: one forward (classifiers, encoders), or ``generate()`` for causal LMs: a
    prefill of ``seq_len`` tokens keeping the last position's logits, then ``new_tokens - 1``
    decode steps; the last one (cache at its final length) is the decode peak."""
    b, s = wl.batch_size, prog.q_len(wl.seq_len)
    inputs = prog.input_bytes(b, s, False)
    generative = task == "causal-lm"
    w = Work(
        batch=b,
        q_len=s,
        kv_len=s,
        impl=wl.attention,
        task=task,
        train=False,
        use_cache=generative and prog.use_cache,
        logits_to_keep=1 if generative else 0,
    )
    stacks = _infer_blocks(prog, wl, w)
    n_params = sum(st.profile.n_params * st.count for st in stacks)
    param_bytes = sum(st.profile.param_bytes * st.count for st in stacks)
    if prog.a.tie:
        n_params -= prog.a.vocab * prog.embed_dim
        param_bytes -= prog.a.vocab * prog.embed_dim * DTYPE_BYTES[PARAM_DTYPE[wl.precision]]
    param_bytes += prog.buffer_bytes(wl.precision)
    static = vadd(one(PARAMS, param_bytes), one(ACTS, inputs))
    view = None
    if _distributed(wl):
        blocks = [st.profile for st in stacks]
        view = _rank_view(wl, blocks, [st.count for st in stacks], prog.a.tie, None)
    pts, cur = run_stacks(static, stacks, backward=False, point=view.fwd if view else None)
    first = "prefill" if generative else "forward"
    phases = {first: [static if view is None else view.point(static), *pts]}
    if generative:
        casts = one(ACTS, cast_cache_bytes(stacks))
        phases["decode"] = _decode_points(prog, wl, task, vadd(static, casts), cur, view)
    info = {"host_bytes": view.host_bytes} if view is not None else {}
    return Simulated(candidates=phases, n_params=n_params, n_trainable=0, info=info)


def _decode_points(
    prog: Any, wl: WorkloadSpec, task: str, static: Vec, after_prefill: Vec, view: Any = None
) -> list[Vec]:
    """After the prefill the model output (its last-position logits) is dropped and one token id
    per sequence is kept; each decode step grows every layer's cache by one token. ``static``
    includes the weight casts autocast caches for the whole generation."""
    b, s = wl.batch_size, wl.seq_len
    a = prog.a
    token = one(ACTS, b * ID_BYTES)
    cache = after_prefill[KV]
    start = vadd(vadd(static, one(KV, cache)), token)
    if view is not None:
        start = view.point(start)
    if wl.new_tokens <= 1:
        return [start]
    total = s + wl.new_tokens - 1
    w = Work(
        batch=b,
        q_len=1,
        kv_len=total,
        impl=wl.attention,
        task=task,
        train=False,
        use_cache=prog.use_cache,
        logits_to_keep=1,
    )
    stacks = _infer_blocks(prog, wl, w, casts_exist=True)
    per_layer_token = stacks[1].profile.fwd_end[KV] // prog.period
    kv_before = per_layer_token * (total - 1) * a.n_layers if prog.use_cache else 0
    base = vadd(vadd(static, one(KV, kv_before)), token)
    pts, _ = run_stacks(base, stacks, backward=False, point=view.fwd if view else None)
    return [start, *pts]


def simulate(prog: Any, wl: WorkloadSpec, task: str) -> Simulated:
    """Run ``prog`` through ``wl``. A program whose model is not one chain of identical layers
    (encoder-decoder, two-tower) composes its own step: it defines ``simulate(wl, task)``."""
    wl = kbit_workload(wl)
    custom = getattr(prog, "simulate", None)
    if custom is not None:
        return custom(wl, task)  # type: ignore[no-any-return]
    if wl.is_train:
        return simulate_train(prog, wl, task)
    return simulate_infer(prog, wl, task)


__all__ = ["Simulated", "simulate", "training_step"]
