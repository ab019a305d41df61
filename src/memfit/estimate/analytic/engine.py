"""Run a family's program through a training step or a generation, phase by phase.

Chain programs (an embedding block, identical layers, a head: ``decoder.ChainProgram``) go
through ``simulate_train`` / ``simulate_infer``; a program whose model is not one chain (T5's
encoder-decoder, CLIP's two towers) defines its own ``simulate`` and composes its blocks with the
same public pieces (``compose.py``: ``run_workload_block``, ``training_step``, ``forward_pass``,
the rank view).

Returns :class:`~memfit.estimate.analytic.compose.Simulated`: each phase's peak as a component
vector (see ``graph.py``), the parameter counts, and what the optimizer keeps. Pure Python; no
torch.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.estimate.analytic.blocks import Shared, Work
from memfit.estimate.analytic.compile import (
    UNCHANGED_POLICIES,
    compile_ratio,
    compiled_profile,
    recompute_ratio,
    workload_compile_problem,
)
from memfit.estimate.analytic.compose import (
    ID_BYTES,
    Simulated,
    cast_cache_bytes,
    check_saved_modules,
    embedding_shapes,
    forward_pass,
    hidden_dtype,
    holds_grads,
    is_distributed,
    rank_view_for,
    run_workload_block,
    totals,
    trainable_shapes,
    training_step,
)
from memfit.estimate.analytic.decoder import DecoderProgram
from memfit.estimate.analytic.graph import ACTS, DTYPE_BYTES, KV, Tensor, Vec, one, vadd
from memfit.estimate.analytic.host_checkpoint import (
    OFFLOADED,
    checkpoints_on_host,
    device_buffer_bytes,
)
from memfit.estimate.analytic.ops import PARAM_DTYPE, Ops
from memfit.estimate.analytic.optimizer import optimizer_bytes
from memfit.estimate.analytic.replay import REPLAYED_KEY, replayed_reserved_bytes
from memfit.estimate.analytic.step import BlockProfile, Stack, run_stacks
from memfit.estimate.cuda_reduce import current_device
from memfit.models.lora_targets import role_names
from memfit.spec import WorkloadSpec
from memfit.spec.rules import LAYER_SAC, SELECTIVE_AC_OPTION_DEFAULT, layer_sac_checkpointed


def kbit_workload(wl: WorkloadSpec) -> WorkloadSpec:
    """The workload the programs run for ``prepare_kbit``: peft casts every unquantized half
    parameter to fp32 (embeddings, norms, LM head, LoRA's base biases), so the model runs as an
    fp32 model around quantized layers that still compute in the loaded dtype. GPTQ and torchao
    (fp8) models are left as they are, as are AMP ones (their parameters are fp32 already)."""
    if (
        not wl.prepare_kbit
        or wl.quant in ("int4-gptq", "fp8")
        or wl.run_precision not in HALF_PRECISIONS
    ):
        return wl
    return replace(
        wl,
        precision="32-true",
        prepare_kbit=False,
        quant_compute_dtype=PARAM_DTYPE[wl.run_precision],
    )


#: Precisions whose parameters are half precision (what peft's casts change).
HALF_PRECISIONS = ("bf16-true", "16-true")


def _compile_measured(a: Any, wl: WorkloadSpec) -> bool:
    """Whether torch.compile's sets are measured for this layer: always for the policies
    ``api._check_compile`` let through; under full checkpointing (which it lets through for
    any layer) where the recomputed layer, as without checkpointing, is measured."""
    if wl.checkpointing not in UNCHANGED_POLICIES:
        return True
    problem = workload_compile_problem(a.model_type, wl, moe=a.n_experts > 0, checkpointing="none")
    return problem is None and wl.tp == 1 and a.q_dim == a.hidden


#: Workload fields no block reads (:func:`_block`, ``compose.run_workload_block``, the chain
#: programs, which see only :class:`Work` and :class:`Ops`): what the optimizer keeps, where
#: the states live, how the ranks share them and how many micro-batches an update sums are
#: the training step's (``compose.training_step``, the rank view), not a block's; the batch
#: a block runs is ``Work.batch``, the frozen layers reach it as its switches (``frozen``,
#: ``freeze_tokens``, ``lm_head_trainable``: ``compile.py`` reads ``freeze_layers`` itself,
#: and ``--compile`` blocks are not kept). ``optimizer``, ``shard`` and
#: ``zero_grad_set_to_none`` reach a block only through ``optimizer_in_bwd``,
#: ``compose.holds_grads`` and ``WorkloadSpec.run_precision`` (DeepSpeed ZeRO runs a
#: ``*-mixed`` job as a 16-bit model), which :func:`_block_key` keeps.
STEP_ONLY_FIELDS = frozenset(
    {
        "optimizer",
        "offload",
        "shard",
        "gpus",
        "grad_accum",
        "batch_size",
        "dp_replicate",
        "reshard_after_forward",
        "zero_hpz_partition_size",
        "fsdp_version",
        "freeze_layers",
        "zero_grad_set_to_none",
    }
)
#: ... and for the embedding and the layers, the training loss too: only the head computes it
#: (``blocks.lm_head_and_loss`` reads ``Work.loss``), so a fused or chunked cross-entropy's
#: candidates share the layers of the full one's.
HEAD_ONLY_FIELDS = STEP_ONLY_FIELDS | {"loss"}
#: Block profiles kept in this process, least recently used dropped first: a planner search
#: estimates ~30 stacks of one model, and stacks that differ only in the optimizer, its
#: offload or the sharding run the same blocks (issue 32: the web API's "nearest change that
#: fits"). A profile is never changed after it is built (``step.run_block``'s callers read it).
MAX_BLOCKS_KEPT = 512
_BLOCKS: OrderedDict[tuple[Any, ...], BlockProfile] = OrderedDict()


def _block_key(
    prog: Any, kind: str, wl: WorkloadSpec, w: Work, kw: dict[str, Any]
) -> tuple[Any, ...]:
    """Everything a block reads: the program (its class, architecture and family), the block,
    the pass (``w``; its loss for the head only), the switches ``kw``, the workload's fields
    but :data:`STEP_ONLY_FIELDS` (:data:`HEAD_ONLY_FIELDS` for the embedding and the layers)
    (with what ``optimizer`` and ``shard`` decide for a block) and the GPU the CUDA reductions'
    workspaces are sized for."""
    job = _job_key(wl, kind == "head")
    if kind != "head" and w.loss != "full":
        w = replace(w, loss="full")
    in_bwd = wl.optimizer if wl.optimizer_in_bwd else None
    return (
        wl.run_precision,
        type(prog),
        id(getattr(prog, "family", None)),
        repr(prog.a),
        kind,
        w,
        tuple(sorted(kw.items())),
        job,
        in_bwd,
        holds_grads(wl),
        current_device(),
    )


#: The last workloads' block-key parts (:func:`_job_key`): a simulation asks for 3 to 5 blocks
#: of one workload, and the repr of its ~50 fields was a fifth of a cached block's cost.
_JOB_KEYS: list[tuple[WorkloadSpec, tuple[str, ...], tuple[str, ...]]] = []


def _job_key(wl: WorkloadSpec, head: bool) -> tuple[str, ...]:
    """The workload's fields a block reads, as reprs: all but :data:`STEP_ONLY_FIELDS` for the
    head, but :data:`HEAD_ONLY_FIELDS` for the other blocks; the last workload's kept (the
    entry holds the workload itself, so ``is`` tells it)."""
    for entry in _JOB_KEYS:
        if entry[0] is wl:
            return entry[1] if head else entry[2]
    pairs = [(f.name, repr(getattr(wl, f.name))) for f in dataclasses.fields(wl)]
    head_key = tuple(r for name, r in pairs if name not in STEP_ONLY_FIELDS)
    body_key = tuple(r for name, r in pairs if name not in HEAD_ONLY_FIELDS)
    _JOB_KEYS[:] = [(wl, head_key, body_key)]
    return head_key if head else body_key


def _block(prog: Any, kind: str, wl: WorkloadSpec, w: Work, **kw: Any) -> BlockProfile:
    """One of a chain program's blocks (``kind``: embed, layer, head) under ``wl``; kept per
    :func:`_block_key` (``MAX_BLOCKS_KEPT``), except under ``--compile``, whose check reads
    more of the workload."""
    if wl.compile:
        return _run_block(prog, kind, wl, w, **kw)
    key = _block_key(prog, kind, wl, w, kw)
    found = _BLOCKS.get(key)
    if found is not None:
        _BLOCKS.move_to_end(key)
        return found
    if kind == "layer" and wl.checkpointing == OFFLOADED:
        # the layer recomputes as under full checkpointing and only its checkpoint goes to the
        # host (compose.run_workload_block reads the mode for nothing else; the programs see
        # Work, whose checkpointed / use_cache are the same): the full one's profile, moved
        full = _block(prog, kind, replace(wl, checkpointing="full"), w, **kw)
        prof = _BLOCKS[key] = checkpoints_on_host(full) if full.checkpoint_bytes else full
    else:
        prof = _BLOCKS[key] = _run_block(prog, kind, wl, w, **kw)
    while len(_BLOCKS) > MAX_BLOCKS_KEPT:
        _BLOCKS.popitem(last=False)
    return prof


def _run_block(prog: Any, kind: str, wl: WorkloadSpec, w: Work, **kw: Any) -> BlockProfile:
    """:func:`_block` without the memo."""
    a = prog.a
    h = a.hidden
    in_rg = kw.pop("in_rg", True)
    tied = kw.pop("tied", False)
    lm_head_trainable = kw.pop("lm_head_trainable", True)
    freeze_tokens = kw.pop("freeze_tokens", False)
    cached_casts = kw.pop("cached_casts", 0)
    hold_grads = kw.pop("hold_grads", False)

    def body(o: Ops) -> tuple[Tensor | None, list[Tensor]]:
        o.lm_head_trainable = lm_head_trainable
        if hold_grads:  # a tied LM head: its gradient waits for the embedding's (one step)
            o.g.step_in_backward = False
        if kind == "embed":
            o.tied_embedding = tied
            o.freeze_token_embedding = freeze_tokens
            x, _ = prog.embed(o, w)
            return None, [x]
        x = o.g.input(w.tokens * h, hidden_dtype(wl.run_precision), rg=in_rg)
        if kind == "head":
            outs = prog.head(o, x, w)
            if cached_casts:  # the model returns, autocast exits: its cached weight casts go
                o.g.touch(o.g.input(cached_casts, "u8", rg=False))
            return x, outs[-1:]  # backward starts from the loss
        sh: Shared = prog.shared_for_layer(o, w, hidden_dtype(wl.run_precision))
        out = x
        for i in range(prog.period):
            out = prog.layer(o, out, w, sh, i)
            o.release_layer_locals()
        # The caller's ``hidden_states`` (the loop variable) references the input until the
        # layer returns.
        o.g.touch(x)
        o.g.hold(out)
        return x, [out]

    prof = run_workload_block(
        wl,
        body,
        model_type=a.model_type,
        batch=w.batch,
        train=w.train,
        repeated=kind == "layer",
        **kw,
    )
    if kind == "layer" and w.train and wl.compile and _compile_measured(a, wl):
        # torch.compile's saved set and recomputed set (compile.py)
        dims = {"hidden": h, "kv": a.kv_dim, "ffn": a.ffn, "heads": a.n_heads}
        ratio = compile_ratio(a.model_type, wl.checkpointing, **dims)
        prof = compiled_profile(
            prof, ratio, recompute_ratio(a.model_type, wl.checkpointing, **dims)
        )
    return prof


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
        loss=wl.loss,
    )
    frozen = wl.freeze_layers
    lora = wl.lora_rank is not None
    tied_grad = a.tie and not lora and not frozen
    embed = _block(prog, "embed", wl, w, freeze_tokens=bool(frozen), tied=tied_grad)
    n_periods = a.n_layers // prog.period
    # freeze_layers freezes the token embedding only (get_input_embeddings): learned positions
    # stay trainable, so the frozen layers still carry gradients through to them.
    emb_rg = embed.out_rg
    if wl.checkpointing == LAYER_SAC:
        # transformers makes the embedding output require grad under any checkpointing of an
        # input_ids model (ChainProgram.input_ids): a plain frozen block then keeps what a
        # trainable one does (checked against the trace; under full checkpointing the blocks'
        # inputs are kept either way)
        input_grads = emb_rg or getattr(prog, "input_ids", False)
        stacks = _layer_sac_stacks(prog, wl, w, emb_rg=input_grads, n_periods=n_periods)
    else:
        stacks = _layer_stacks(prog, wl, w, emb_rg=emb_rg, n_periods=n_periods)
    head = _block(
        prog,
        "head",
        wl,
        w,
        frozen=lora,
        lm_head_trainable=not (a.tie and (frozen or lora)),
        cached_casts=cast_cache_bytes(stacks),
        hold_grads=tied_grad,
    )
    all_stacks = [Stack(embed, 1), *stacks, Stack(head, 1)]
    t = totals(all_stacks)
    n_params, n_train, param_bytes, grad_bytes = (
        t.n_params,
        t.n_trainable,
        t.param_bytes,
        t.grad_bytes,
    )
    if a.tie:
        tied = a.vocab * prog.embed_dim
        n_params -= tied
        param_bytes -= tied * DTYPE_BYTES[PARAM_DTYPE[wl.run_precision]]
        if tied_grad:
            n_train -= tied
            grad_bytes -= tied * DTYPE_BYTES[PARAM_DTYPE[wl.run_precision]]
    if lora and n_train == 0:
        raise _no_lora_module(a.model_type, wl.lora_targets)
    param_bytes += prog.buffer_bytes(wl.run_precision)
    shapes = trainable_shapes(all_stacks)
    if tied_grad:
        shapes.remove(((a.vocab, prog.embed_dim), PARAM_DTYPE[wl.run_precision]))
    embeddings = embedding_shapes(all_stacks)
    opt = optimizer_bytes(wl.optimizer or "none", shapes, grad_bytes, embedding_shapes=embeddings)
    inputs = prog.input_bytes(wl.batch_size, s, True)
    if wl.checkpointing == OFFLOADED:  # the GPU buffers the host checkpoints come back through
        inputs += device_buffer_bytes(max(st.profile.checkpoint_bytes for st in stacks))
    view = rank_view_for(wl, all_stacks, tied=a.tie, opt=opt) if is_distributed(wl) else None
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


def _layer_stacks(
    prog: Any, wl: WorkloadSpec, w: Work, *, emb_rg: bool, n_periods: int
) -> list[Stack]:
    """The repeated layers of a training job, in order: the frozen ones, then the trainable."""
    frozen = wl.freeze_layers
    stacks = []
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
    return stacks


def _layer_sac_stacks(
    prog: Any, wl: WorkloadSpec, w: Work, *, emb_rg: bool, n_periods: int
) -> list[Stack]:
    """torchtitan's per-layer SAC (``--checkpointing selective-layer``): the layers of the job
    under full checkpointing where ``rules.layer_sac_checkpointed`` says the block is wrapped,
    without checkpointing elsewhere, in order (runs of the same profile merged)."""
    every = wl.selective_ac_option
    if prog.period != 1 and every not in (0, 1):
        raise NotModelledError(
            f"checkpointing 'selective-layer' on {prog.a.model_type!r}: its layers are modelled "
            f"{prog.period} at a time (alternating kinds), and every {every}-th one checkpointed "
            "splits them; use --checkpointing full or none",
            engine="analytic",
        )
    by_policy = {
        policy: [
            st.profile
            for st in _layer_stacks(
                prog,
                replace(wl, checkpointing=policy, selective_ac_option=SELECTIVE_AC_OPTION_DEFAULT),
                w,
                emb_rg=emb_rg,
                n_periods=n_periods,
            )
            for _ in range(st.count)
        ]
        for policy in ("full", "none")
    }
    stacks: list[Stack] = []
    for i, wrapped in enumerate(layer_sac_checkpointed(n_periods, every)):
        prof = by_policy["full" if wrapped else "none"][i]
        if stacks and stacks[-1].profile is prof:
            stacks[-1].count += 1
        else:
            stacks.append(Stack(prof, 1))
    return stacks


def _no_lora_module(model_type: str, targets: Any) -> Exception:
    """LoRA targets that wrap no linear module: 0 trainable parameters is no LoRA at all (the
    trace engine's peft raises the same); the message lists the family's roles and names."""

    names = role_names(model_type)
    asked = targets if isinstance(targets, str) else ",".join(targets)
    return SpecError(
        f"lora_targets ({asked}) match no linear module of {model_type!r}: name roles "
        f"({', '.join(names)}, attention, mlp), its module names "
        f"({', '.join(sorted(set(names.values())))}), or all-linear"
    )


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


def simulate_infer(prog: Any, wl: WorkloadSpec, task: str) -> Simulated:
    """Inference: one forward (classifiers, encoders), or ``generate()`` for causal LMs: a
    prefill of ``seq_len`` tokens keeping the last position's logits, then ``new_tokens - 1``
    decode steps; the last one (cache at its final length) is the decode peak."""
    b, s = wl.batch_size, prog.q_len(wl.seq_len)
    inputs = prog.input_bytes(b, s, False)
    generative = task == "causal-lm"
    if generative:  # generate()'s (B, S) int64 position_ids, held in its model_kwargs
        inputs += b * s * ID_BYTES
    w = Work(
        batch=b,
        q_len=s,
        kv_len=s,
        impl=wl.attention,
        task=task,
        train=False,
        use_cache=generative and _generate_caches(prog),
        logits_to_keep=1 if generative else 0,
        batched_positions=generative,
    )
    stacks = _infer_blocks(prog, wl, w)
    t = totals(stacks)
    n_params, param_bytes = t.n_params, t.param_bytes
    if prog.a.tie:
        n_params -= prog.a.vocab * prog.embed_dim
        param_bytes -= prog.a.vocab * prog.embed_dim * DTYPE_BYTES[PARAM_DTYPE[wl.run_precision]]
    param_bytes += prog.buffer_bytes(wl.run_precision)
    fp = forward_pass(stacks, wl, param_bytes=param_bytes, inputs=inputs, tied=prog.a.tie)
    first = "prefill" if generative else "forward"
    phases = {first: fp.points}
    chunk = wl.prefill_chunk_size
    if generative and chunk is not None and chunk < s:
        phases[first] = _chunked_prefill_points(prog, wl, task, fp.static, fp.end[KV], fp.view)
    if generative:
        casts = one(ACTS, cast_cache_bytes(stacks))
        phases["decode"] = _decode_points(prog, wl, task, vadd(fp.static, casts), fp.end, fp.view)
    info = fp.info
    if prog.a.n_experts and fp.view is None and phases[first] is fp.points:
        # routed experts: the prefill's segments by the allocator's replay (replay.py)
        replayed = replayed_reserved_bytes(stacks, input_bytes=inputs)
        if replayed is not None:
            info = {**info, REPLAYED_KEY: replayed}
    return Simulated(candidates=phases, n_params=n_params, n_trainable=0, info=info)


def _chunked_prefill_points(
    prog: Any, wl: WorkloadSpec, task: str, static: Vec, cache_bytes: int, view: Any
) -> list[Vec]:
    """``generate(prefill_chunk_size=C)`` (``GenerationMixin._prefill``): the prompt split into
    chunks of C tokens, each a forward into the growing DynamicCache. The first chunk runs as a
    short prefill (``is_causal``, no mask); every later one attends C queries to the cache and
    itself, so transformers builds a (B, 1, C, past + C) bool mask, repeats grouped K/V heads and
    SDPA takes the memory-efficient kernel (``SdpaRouter``). Traced: the first chunk, the last
    full chunk and the final partial one; the previous chunk's output (its last-position logits)
    is alive while the next runs."""
    if view is not None or prog.window is not None or _custom_layer_inputs(prog):
        raise NotModelledError(
            "a chunked prefill is modelled by the analytic engine for one-GPU decoder models "
            "without a sliding window or family-specific masks; the trace engine models it",
            engine="analytic",
        )
    b, s, c = wl.batch_size, prog.q_len(wl.seq_len), int(wl.prefill_chunk_size or 0)
    n_full, rest = divmod(s, c)
    pasts = {0: c, c * (n_full - 1): c}
    if rest:
        pasts[s - rest] = rest
    prev_logits = b * prog.a.vocab * DTYPE_BYTES[hidden_dtype(wl.run_precision)]
    points: list[Vec] = [static]
    for past, q in pasts.items():
        w = Work(
            batch=b,
            q_len=q,
            kv_len=past + q,
            impl=wl.attention,
            task=task,
            train=False,
            use_cache=_generate_caches(prog),
            logits_to_keep=1,
            batched_positions=True,
        )
        stacks = _infer_blocks(prog, wl, w)
        base = vadd(static, one(KV, cache_bytes * past // s))
        if past:
            base = vadd(base, one(ACTS, prev_logits))
        pts, _ = run_stacks(base, stacks, backward=False)
        points.extend(pts)
    return points


def _generate_caches(prog: Any) -> bool:
    """Whether ``generate()`` keeps a KV cache for ``prog``'s model: always, whatever
    ``config.use_cache`` says. generate() reads ``generation_config.use_cache`` (default True):
    Qwen3-4B's config.json has ``use_cache: false``, its generation_config.json does not set it,
    and the published measurements grow by exactly its KV cache per prompt token
    (docs/accuracy.md §15). The trace engine passes ``use_cache=True`` the same way."""
    return prog is not None


def _custom_layer_inputs(prog: Any) -> bool:
    """Whether a family builds its own masks or per-layer inputs (the chunk's mask would not be
    the decoder blocks' one)."""

    cls = type(prog)
    return not isinstance(prog, DecoderProgram) or any(
        getattr(cls, name) is not getattr(DecoderProgram, name)
        for name in ("embed_masks", "shared_for_layer", "mask_dtype", "embed")
    )


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
    positions = one(ACTS, b * s * ID_BYTES)  # generate()'s position_ids, one more each step
    start = vadd(vadd(vadd(static, one(KV, cache)), token), positions)
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
        use_cache=_generate_caches(prog),
        logits_to_keep=1,
        batched_positions=True,
    )
    stacks = _infer_blocks(prog, wl, w, casts_exist=True)
    per_layer_token = stacks[1].profile.fwd_end[KV] // prog.period
    kv_before = per_layer_token * (total - 1) * a.n_layers if _generate_caches(prog) else 0
    positions = one(ACTS, b * total * ID_BYTES)
    base = vadd(vadd(vadd(static, one(KV, kv_before)), token), positions)
    pts, _ = run_stacks(base, stacks, backward=False, point=view.fwd if view else None)
    return [start, *pts]


def simulate(prog: Any, wl: WorkloadSpec, task: str) -> Simulated:
    """Run ``prog`` through ``wl``. A program whose model is not one chain of identical layers
    (encoder-decoder, two-tower) composes its own step: it defines ``simulate(wl, task)``."""
    wl = kbit_workload(wl)
    custom = getattr(prog, "simulate", None)
    a = getattr(prog, "a", None)
    check_saved_modules(wl, tied=bool(getattr(a, "tie", False)), chain=custom is None)
    if custom is not None:
        return custom(wl, task)  # type: ignore[no-any-return]
    if wl.is_train:
        return simulate_train(prog, wl, task)
    return simulate_infer(prog, wl, task)


__all__ = ["ID_BYTES", "Simulated", "kbit_workload", "simulate"]
