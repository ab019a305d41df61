"""The rules of pipeline, context and expert parallelism in a job description (pure Python).

The fields (:class:`~memfit.spec.ParallelSpec` and :class:`~memfit.spec.WorkloadSpec` names) and
how the frameworks spell them:

==================  ===================================  ========================================
field               torchtitan ``[parallelism]`` key     Megatron-core argument
==================  ===================================  ========================================
pp                  pipeline_parallel_degree             --pipeline-model-parallel-size
pp_schedule         pipeline_parallel_schedule           (1F1B; --virtual-pipeline-... size)
pp_virtual_stages   (stages per rank of a looped one)    --virtual-pipeline-model-parallel-size
cp                  context_parallel_degree              --context-parallel-size
cp_rotate           context_parallel_rotate_method       (--cp-comm-type p2p / all_gather / a2a)
ep                  expert_parallel_degree               --expert-model-parallel-size
etp                 expert_tensor_parallel_degree        --expert-tensor-parallel-size
sequence_parallel   (always on with tp > 1)              --sequence-parallel
async_tp            enable_async_tensor_parallel         (none: --tp-comm-overlap is TE's, other)
==================  ===================================  ========================================

``sequence_parallel``: tensor parallelism also splits the norms' and the residual stream's
tensors along the sequence (Korthikanti et al. 2022, §4.2.2). torchtitan's TP plan always does it
(``SequenceParallel()`` on the norms, ``Shard(1)`` layouts between the blocks: ``apply_tp`` in
``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370, no switch to turn it off);
Megatron-core only with ``--sequence-parallel`` (off by default). memfit: off unless set.

``async_tp``: torch's micro-pipelined tensor parallelism (torchtitan's
``parallelism.enable_async_tensor_parallel``, ``maybe_enable_async_tp`` in
``torchtitan/distributed/tensor_parallel.py`` at 238fa9953): Inductor's ``micro_pipeline_tp``
pass fuses the sequence-parallel all-gathers and reduce-scatters with the matmuls next to them,
which run through a SymmetricMemory workspace per tensor-parallel group. It needs
torch.compile of the model (torchtitan raises "Async TP requires 'model' in
--compile.components and --compile.enable") and sequence parallelism (there is nothing to fuse
without its all-gathers); the workspace is sized in
:func:`memfit.estimate.parallel.memory.symm_mem_workspace_bytes`.

``float8``: torchao's ``Float8Linear`` on the transformer blocks' linears, as torchtitan applies it
(``[quantize.linear.float8]`` / ``float8.recipe_name``: ``tensorwise``, its default, or
``rowwise``); ``float8_all_gather``: FSDP2 all-gathers those weights in fp8
(``enable_fsdp_float8_all_gather``, tensorwise only). Both are answered by the per-rank closed
form (:mod:`memfit.estimate.parallel.memory`), on GPUs with fp8 matrix cores only.

The GPUs of a job are ``dp x cp x pp x tp`` (torchtitan's ``ParallelDims``; Megatron's
``initialize_model_parallel``): ``dp = gpus / (tp * pp * cp)``. Expert parallelism borrows its
ranks from the data-, context- and tensor-parallel ones (experts are sharded over ``ep`` of the
``dp * cp * tp`` ranks of a pipeline stage, each expert over ``etp`` of them), so ``ep * etp``
must divide ``dp * cp * tp`` and ``etp`` is 1 or ``tp`` (torchtitan's ``ParallelDims`` checks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Pipeline schedules by memfit's names: ``gpipe`` (all forwards, then all backwards; Huang et
#: al. 2019), ``1f1b`` (PipeDream-flush; Narayanan et al. 2021), ``interleaved-1f1b`` (looped
#: virtual stages, Megatron's interleaved schedule), ``zbv`` (zero-bubble V shape; Qi et al.,
#: arXiv:2401.10241 §6), ``dualpipev`` (the V-shape cut of DeepSeek's DualPipe).
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv", "dualpipev")
#: torchao's Float8 training recipes memfit models (``Float8LinearRecipeName``, torchao 0.18
#: ``torchao/float8/config.py``); ``none``: no Float8.
FLOAT8_RECIPES = ("none", "tensorwise", "rowwise")
#: torchtitan's / torch.distributed.pipelining's class names (``get_schedule_class``) accepted
#: for ``pp_schedule`` (any case), resolved once to memfit's name.
PP_SCHEDULE_ALIASES = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved1f1b": "interleaved-1f1b",
    "zbvzerobubble": "zbv",
    "zero-bubble": "zbv",
    "zb-v": "zbv",
    "dualpipe-v": "dualpipev",
}
#: Schedules that place two model chunks on each rank in a V (stage ``i`` and ``2 pp - 1 - i``):
#: the first rank holds both the embeddings and the output head.
V_SCHEDULES = ("zbv", "dualpipev")
#: How ring attention moves K/V between the ``cp`` ranks (torchtitan's
#: ``context_parallel_rotate_method``): ``allgather`` gathers the whole sequence's K/V of a
#: layer at once; ``alltoall`` passes one chunk at a time around the ring.
CP_ROTATES = ("allgather", "alltoall")
#: The most stages / ranks of one kind memfit reasons about.
MAX_DEGREE = 1 << 16


def resolve_schedule(value: Any) -> Any:
    """memfit's name of a schedule name (torchtitan's spellings accepted); anything else as given,
    for the field rule to refuse."""
    if isinstance(value, str):
        key = value.strip().lower()
        if key in PP_SCHEDULES:
            return key
        return PP_SCHEDULE_ALIASES.get(key.replace("_", ""), PP_SCHEDULE_ALIASES.get(key, value))
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _degree(name: str, value: Any) -> str | None:
    if not _is_int(value) or value < 1:
        return f"{name} ({value!r}) must be a positive integer (1: not used)"
    return (
        f"{name} ({value}) is more ranks than memfit models (max {MAX_DEGREE})"
        if (value > MAX_DEGREE)
        else None
    )


def _one_of(allowed: tuple[str, ...], hint: str) -> Callable[[str, Any], str | None]:
    def check(name: str, value: Any) -> str | None:
        return None if value in allowed else f"{name} ({value!r}) must be one of {hint}"

    return check


#: One check per field (merged into :data:`memfit.spec.rules.FIELD_RULES`).
PARALLEL_FIELD_RULES: dict[str, Callable[[str, Any], str | None]] = {
    "pp": _degree,
    "pp_schedule": _one_of(
        PP_SCHEDULES,
        ", ".join(PP_SCHEDULES) + " (or torchtitan's names: Interleaved1F1B, "
        "ZBVZeroBubble, DualPipeV)",
    ),
    "pp_virtual_stages": _degree,
    "cp": _degree,
    "cp_rotate": _one_of(CP_ROTATES, ", ".join(CP_ROTATES)),
    "ep": _degree,
    "etp": _degree,
    "sequence_parallel": lambda name, value: (
        None if isinstance(value, bool) else f"{name} ({value!r}) must be True or False"
    ),
    "async_tp": lambda name, value: (
        None if isinstance(value, bool) else f"{name} ({value!r}) must be True or False"
    ),
    "float8": _one_of(FLOAT8_RECIPES, ", ".join(FLOAT8_RECIPES) + " (torchao's recipe names)"),
    "float8_all_gather": lambda name, value: (
        None if isinstance(value, bool) else f"{name} ({value!r}) must be True or False"
    ),
}

#: The defaults: a job that uses none of these.
PARALLEL_DEFAULTS: dict[str, Any] = {
    "pp": 1,
    "pp_schedule": "1f1b",
    "pp_virtual_stages": 1,
    "cp": 1,
    "cp_rotate": "allgather",
    "ep": 1,
    "etp": 1,
    "sequence_parallel": False,
    "async_tp": False,
    "float8": "none",
    "float8_all_gather": False,
}


def model_parallel_size(values: dict[str, Any]) -> int:
    """``tp * pp * cp``: the GPUs one data-parallel replica spans (1 where a field is invalid)."""
    size = 1
    for name in ("tp", "pp", "cp"):
        v = values.get(name, 1)
        size *= v if _is_int(v) and v >= 1 else 1
    return size


def parallel_layout_rules(values: dict[str, Any]) -> list[str]:
    """The rules between the layout fields (valid values assumed checked field by field)."""
    if any(_degree(n, values.get(n, 1)) for n in ("gpus", "tp", "pp", "cp", "ep", "etp")):
        return []
    gpus, tp, pp, cp = values["gpus"], values.get("tp", 1), values["pp"], values["cp"]
    ep, etp = values["ep"], values["etp"]
    schedule, virtual = values["pp_schedule"], values["pp_virtual_stages"]
    p: list[str] = []
    if (pp > 1 or cp > 1) and gpus % (tp * pp * cp):
        p.append(
            f"tp x pp x cp ({tp} x {pp} x {cp} = {tp * pp * cp}) must divide gpus ({gpus}): "
            "each data-parallel replica spans tp x pp x cp GPUs; change --gpus or a degree"
        )
    if schedule == "interleaved-1f1b" and pp > 1 and virtual < 2:
        p.append(
            f"pp_schedule 'interleaved-1f1b' needs pp_virtual_stages >= 2 (got {virtual}): the "
            "model chunks each rank holds (Megatron's --virtual-pipeline-model-parallel-size)"
        )
    if schedule != "interleaved-1f1b" and _is_int(virtual) and virtual > 1:
        p.append(
            f"pp_virtual_stages ({virtual}) applies to pp_schedule 'interleaved-1f1b' only "
            f"(got {schedule!r}; zbv and dualpipev hold two chunks per rank by design)"
        )
    if schedule in V_SCHEDULES and pp < 2:
        p.append(f"pp_schedule {schedule!r} needs pp >= 2 (got {pp}): a V over the ranks")
    if etp not in (1, tp):
        p.append(
            f"etp ({etp}) must be 1 or tp ({tp}): experts are tensor-parallel over all or none "
            "of the tensor-parallel ranks (torchtitan's expert_tensor_parallel_degree)"
        )
    elif ep > 1 and gpus % (tp * pp * cp) == 0:
        borrow = (gpus // (tp * pp * cp)) * cp * tp
        if borrow % (ep * etp):
            p.append(
                f"ep x etp ({ep} x {etp}) must divide dp x cp x tp ({borrow}): expert "
                "parallelism borrows its ranks from the data-, context- and tensor-parallel "
                "ones of a pipeline stage"
            )
    return p


def parallel_job_rules(values: dict[str, Any]) -> list[str]:
    """The rules between the layout and the job's shape and techniques."""
    pp, cp, ep = values.get("pp", 1), values.get("cp", 1), values.get("ep", 1)
    sp = values.get("sequence_parallel") is True
    if sp and values.get("tp", 1) == 1:
        return [
            "sequence_parallel with tp 1: sequence parallelism splits what tensor parallelism "
            "leaves whole over the tp ranks; set --tp > 1 or drop --sp"
        ]
    f8 = values.get("float8", "none")
    p: list[str] = async_tp_rules(values)
    if values.get("float8_all_gather") is True and (
        f8 != "tensorwise" or values.get("shard") != "fsdp"
    ):
        p.append(
            f"float8_all_gather with float8 {f8!r} and shard {values.get('shard')!r}: FSDP2's "
            "fp8 all-gather needs --float8 tensorwise and --shard fsdp (torchao supports it "
            "for tensorwise scaling only)"
        )
    if not all(_is_int(v) for v in (pp, cp, ep)) or (
        max(pp, cp, ep) <= 1 and not sp and f8 == "none"
    ):
        return p
    what = (
        "pp/cp/ep > 1" if max(pp, cp, ep) > 1 else ("sequence_parallel" if sp else f"float8 {f8!r}")
    )
    if values.get("mode") == "infer":
        p.append(
            f"{what.replace(' > 1', f' ({pp}/{cp}/{ep})')} with mode 'infer': memfit models "
            "pipeline, context, expert, sequence parallelism and Float8 for training; for "
            "serving use `memfit vllm` (--tp, --pp)"
        )
        return p
    seq = values.get("seq_len")
    if cp > 1 and _is_int(seq) and seq % (2 * cp):
        p.append(
            f"seq_len ({seq}) must be a multiple of 2 x cp ({2 * cp}): load-balanced causal "
            "context parallelism cuts the sequence into 2 x cp chunks (torchtitan's "
            "context_parallel needs it); pad --seq or change --cp"
        )
    if cp > 1 and values.get("attention") == "eager":
        p.append(
            "attention 'eager' with cp > 1: ring attention runs the SDPA kernels (flash / "
            "memory-efficient / cuDNN); use --attention sdpa or flash"
        )
    for name in ("offload", "quant"):
        if values.get(name, "none") != "none":
            p.append(
                f"{name} ({values[name]!r}) with {what}: the parallel closed form models "
                f"full training without {name}; drop --{name} or use pp = cp = ep = 1"
            )
    if values.get("checkpointing") == "offload":
        p.append(
            f"checkpointing 'offload' with {what}: Unsloth's host-RAM checkpoints are a one-GPU "
            "technique the parallel closed form does not model; use --checkpointing full, "
            "selective or selective-op"
        )
    if values.get("loss", "full") != "full":
        p.append(
            f"loss ({values['loss']!r}) with {what}: the parallel closed form models the full "
            "cross-entropy; drop --loss or use pp = cp = ep = 1 without --sp / --float8"
        )
    if values.get("lora_rank") is not None:
        p.append(
            f"lora_rank with {what}: the parallel closed form models full training; drop "
            "--lora-rank or use pp = cp = ep = 1"
        )
    if values.get("shard") in ("zero2", "zero3") and pp > 1:
        p.append(
            f"shard {values['shard']!r} with pp {pp}: DeepSpeed's pipeline engine supports ZeRO "
            "stage 0-1 only; use --shard zero1 (or fsdp, as torchtitan runs FSDP2 with PP)"
        )
    return p


def async_tp_rules(values: dict[str, Any]) -> list[str]:
    """What async tensor parallelism needs, as torchtitan checks it (``maybe_enable_async_tp``)
    and as there is something to fuse: tp > 1, sequence parallelism, torch.compile, training."""
    if values.get("async_tp") is not True:
        return []
    p: list[str] = []
    if values.get("tp", 1) == 1:
        p.append(
            "async_tp with tp 1: async tensor parallelism overlaps the tensor-parallel "
            "collectives with the matmuls; set --tp > 1 or drop --async-tp"
        )
    elif values.get("sequence_parallel") is not True:
        p.append(
            "async_tp without sequence_parallel: torch's micro-pipelined TP fuses the "
            "sequence-parallel all-gathers and reduce-scatters (torchtitan's TP always shards "
            "the sequence); add --sp"
        )
    if values.get("compile") is not True:
        p.append(
            "async_tp without compile: async TP is an Inductor pass (torchtitan raises "
            "\"Async TP requires 'model' in --compile.components and --compile.enable\"); add "
            "--compile or drop --async-tp"
        )
    if values.get("mode") == "infer":
        p.append("async_tp with mode 'infer': memfit models async TP for training only")
    return p


def is_parallel_job(values: Any) -> bool:
    """Whether a job (a WorkloadSpec or a mapping) uses pp, cp or ep > 1, sequence parallelism
    or Float8 training (the per-rank closed form answers those; the one-GPU engines run tensor
    parallelism as a narrower model, which cannot split the sequence, and have no Float8
    linear)."""
    get = values.get if isinstance(values, dict) else lambda k, d=1: getattr(values, k, d)
    sp = get("sequence_parallel", False) is True and get("tp", 1) != 1
    f8 = get("float8", "none") not in ("none", None)
    return sp or f8 or any(get(k, 1) != 1 for k in ("pp", "cp", "ep"))
