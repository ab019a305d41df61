"""A job of every kind from a parsed command line: one home for the builders the doors share.

:mod:`memfit.flags` holds the one table of the job flags and builds the text step
(:func:`~memfit.flags.workload_from_args`); this module builds the other kinds from the same
parsed flags, refusing a flag that means nothing to the kind (set, not ignored):

=====================  ==============================  =====================================
kind (memfit.spec)     builder                         its flags
=====================  ==============================  =====================================
``WorkloadSpec``       ``flags.workload_from_args``    the table's rows (``flags_for``)
``DiffusionJob``       :func:`diffusion_job`           the table's ``pipeline`` rows
``DiffusionTrainJob``  :func:`diffusion_train_job`     the training rows, ``--resolution``
``SeqRun``             :func:`seq_run_job`             ``--seq-dist`` and its step flags
``VllmConfig``         :func:`serving_job` /           ``vllm serve``'s own spellings
                       :func:`runtime_serving_job`     (``cli/vllm.py``, ``--runtime vllm``)
``SglangConfig``       :func:`sglang_job`              ``sglang.launch_server``'s spellings
                                                       (``cli/sglang.py``)
``LlamaCppJob``        :func:`llamacpp_job`            ``llama-server``'s own spellings
                                                       (``cli/llamacpp.py``)
=====================  ==============================  =====================================

:func:`job_from_flags` picks the builder by kind. Data and pure functions only: ``cli/`` parses
argv.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from memfit.errors import SpecError
from memfit.flags import workload_from_args
from memfit.spec import WorkloadSpec
from memfit.spec.diffusion import DiffusionJob, DiffusionTrainJob
from memfit.spec.llamacpp import LlamaCppJob
from memfit.spec.rules import resolve_precision
from memfit.spec.seqrun import SeqDist, SeqRun
from memfit.spec.serving import VllmConfig
from memfit.spec.sglang import SglangConfig

#: estimate flags that mean nothing to a pipeline run: refused when set, not ignored.
PIPELINE_REFUSED = {
    "lora_rank": None,
    "checkpointing": None,
    "shard": None,
    "optimizer": None,
    "compile": None,
}

#: flags of the inference pipeline that mean nothing to a training run: refused when set
INFER_ONLY = (
    "height", "width", "steps", "pipeline_offload", "vae_slicing", "vae_tiling", "offload_type",
    "num_blocks_per_group", "use_stream", "layerwise_casting", "text_encoder_quant",
    "attention_slicing",
)  # fmt: skip
#: the training flags (flags.py), refused by inference
TRAIN_ONLY = ("resolution", "train_text_encoder", "cache_latents", "max_sequence_length")
#: estimate flags of text-model training that the diffusers scripts have no switch for
TRAIN_UNSUPPORTED = {
    "shard": ("none",),
    "offload": ("none",),
    "quant": ("none",),
    "tp": (1,),
    "gpus": (1,),
    "freeze": (0,),
    "grad_accum": (1,),
    "float8": ("none",),
    "compile": (False,),
}


def refuse_train_flags_in_inference(args: argparse.Namespace) -> None:
    """A diffusion training flag on an inference run: refused, not ignored."""
    for dest in TRAIN_ONLY:
        if getattr(args, dest, None) not in (None, False):
            raise SpecError(
                f"--{dest.replace('_', '-')} is a diffusion training flag: add --mode train "
                "(inference takes --height / --width)"
            )


def diffusion_job(args: argparse.Namespace) -> DiffusionJob:
    """The pipeline call the inference flags describe (``estimate PIPELINE --mode infer``)."""
    if getattr(args, "offload", None) not in (None, "none"):
        raise SpecError(
            "--offload is ZeRO/FSDP training offload; for a diffusion pipeline use "
            "--pipeline-offload model|sequential|group"
        )
    if args.pipeline_offload != "group":
        for dest in ("offload_type", "num_blocks_per_group", "use_stream"):
            if getattr(args, dest, None) not in (None, False):
                raise SpecError(
                    f"--{dest.replace('_', '-')} is a group-offload setting: add "
                    "--pipeline-offload group"
                )
    for dest in PIPELINE_REFUSED:
        value = getattr(args, dest, None)
        if value not in (None, "none", False):
            raise SpecError(f"--{dest.replace('_', '-')} does not apply to a diffusion pipeline")
    kwargs: dict[str, Any] = {
        "batch": args.batch,
        "precision": args.precision or "bf16",
        "vae_slicing": bool(args.vae_slicing),
        "vae_tiling": bool(args.vae_tiling),
        "use_stream": bool(getattr(args, "use_stream", False)),
        "attention_slicing": bool(getattr(args, "attention_slicing", False)),
        "drop_text_encoder_3": bool(getattr(args, "drop_text_encoder_3", False)),
        "quant": getattr(args, "quant", None) or "none",
    }
    for dest, key in (
        ("height", "height"),
        ("width", "width"),
        ("steps", "steps"),
        ("num_frames", "num_frames"),
        ("vae_precision", "vae_precision"),
        ("pipeline_offload", "offload"),
        ("offload_type", "offload_type"),
        ("num_blocks_per_group", "num_blocks_per_group"),
        ("layerwise_casting", "layerwise_casting"),
        ("text_encoder_quant", "text_encoder_quant"),
    ):
        if getattr(args, dest, None) is not None:
            kwargs[key] = getattr(args, dest)
    return DiffusionJob(**kwargs)


def diffusion_train_job(
    args: argparse.Namespace, *, lora_rank: int | None = None
) -> DiffusionTrainJob:
    """The diffusers training run the training flags describe (``--mode train``)."""
    for dest in INFER_ONLY:
        if getattr(args, dest, None) not in (None, False):
            raise SpecError(
                f"--{dest.replace('_', '-')} is a diffusion inference flag; training takes "
                "--resolution, --batch, --lora-rank, --checkpointing, --optimizer, --precision, "
                "--train-text-encoder, --cache-latents"
            )
    for dest, ok in TRAIN_UNSUPPORTED.items():
        value = getattr(args, dest, None)
        if value is not None and value not in ok:
            raise SpecError(
                f"--{dest.replace('_', '-')} {value}: the diffusers training scripts memfit "
                "models run one GPU without it; drop the flag"
            )
    ckpt = getattr(args, "checkpointing", None) or "none"
    if ckpt in ("selective", "selective-op"):
        raise SpecError(
            f"--checkpointing {ckpt}: the diffusers scripts have --gradient_checkpointing "
            "only (use full or none)"
        )
    if ckpt == "selective-layer":
        raise SpecError(
            "--checkpointing selective-layer: the diffusers scripts have --gradient_checkpointing "
            "only (use full or none)"
        )
    rank = getattr(args, "lora_rank", None) if lora_rank is None else lora_rank
    if isinstance(rank, list):
        rank = rank[0]
    kwargs: dict[str, Any] = {
        "batch": getattr(args, "batch", None) or 1,
        "lora_rank": rank,
        "checkpointing": ckpt == "full",
        "optimizer": getattr(args, "optimizer", None) or "adamw",
        "precision": resolve_precision(getattr(args, "precision", None), "train"),
        "train_text_encoder": bool(getattr(args, "train_text_encoder", False)),
        "cache_latents": bool(getattr(args, "cache_latents", False)),
    }
    for dest in ("resolution", "max_sequence_length"):
        if getattr(args, dest, None) is not None:
            kwargs[dest] = getattr(args, dest)
    targets = getattr(args, "lora_targets", None)
    if targets:
        parsed = tuple(t.strip() for t in str(targets).split(",") if t.strip())
        if parsed in ((), ("all-linear",)):
            raise SpecError("--lora-targets all-linear: name the denoiser's modules (to_q,to_k)")
        kwargs["lora_targets"] = parsed
    return DiffusionTrainJob(**kwargs)


def seq_run_job(args: argparse.Namespace, workload: WorkloadSpec, dist: SeqDist) -> SeqRun:
    """The variable-length run the --seq-dist flags describe over ``workload``'s steps."""
    return SeqRun(
        workload=workload,
        dist=dist,
        n_steps=args.run_steps,
        seed=args.seed,
        pad_to_multiple_of=args.pad_to_multiple_of,
        packing=args.packing,
        group_by_length=args.group_by_length,
    )


def serving_job(args: argparse.Namespace, gpus: int | None = None) -> VllmConfig:
    """The ``vllm serve`` configuration its flags describe (``memfit vllm``; ``gpus``: one replica
    over that many GPUs)."""
    tp, pp = args.tp, args.pp
    if gpus is not None and tp is None:
        tp = max(1, gpus // (pp or 1))
    tp, pp = tp or 1, pp or 1
    if gpus is not None and tp * pp != gpus:
        raise SpecError(
            f"--gpus ({gpus}) must equal --tensor-parallel-size x --pipeline-parallel-size "
            f"({tp} x {pp}); vLLM serves one replica on TP x PP GPUs"
        )
    return VllmConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        dtype=args.dtype,
        quantization=args.quantization,
        enforce_eager=args.enforce_eager,
        max_cudagraph_capture_size=getattr(args, "max_cudagraph_capture_size", None),
        cpu_offload_gb=args.cpu_offload_gb,
        vllm_version=args.vllm_version,
    )


def runtime_serving_job(args: argparse.Namespace, *, tp: int = 1, length: int | None) -> VllmConfig:
    """The vLLM server ``fit`` / ``plan`` / ``upgrade --runtime vllm`` size: their own flags."""
    quant = getattr(args, "quant", None)
    if quant not in (None, "none", "fp8"):
        raise SpecError(
            f"--quant {quant} with --runtime vllm: vLLM quantizes online only to fp8; for "
            f"{quant} pass the hub id of a checkpoint quantized that way (its config says so)"
        )
    return VllmConfig(
        tensor_parallel_size=tp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=length,
        quantization="fp8" if quant == "fp8" else None,
        vllm_version=args.vllm_version,
    )


def sglang_job(args: argparse.Namespace) -> SglangConfig:
    """The ``python -m sglang.launch_server`` configuration its flags describe
    (``memfit sglang``)."""
    return SglangConfig(
        tp_size=args.tp_size,
        dp_size=args.dp_size,
        ep_size=args.ep_size,
        enable_dp_attention=args.enable_dp_attention,
        mem_fraction_static=args.mem_fraction_static,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        max_total_tokens=args.max_total_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
        kv_cache_dtype=args.kv_cache_dtype,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        disable_cuda_graph=args.disable_cuda_graph,
        page_size=args.page_size,
        quantization=args.quantization,
        dtype=args.dtype,
        sglang_version=args.sglang_version or "0.5",
        attention_backend=getattr(args, "attention_backend", None),
    )


def _tensor_split(text: str | None) -> tuple[float, ...] | None:
    """``-ts 3,1`` (llama.cpp also takes ``3/1``) as shares; a bad share is a SpecError."""
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.replace("/", ",").split(","))
    except ValueError:
        raise SpecError(
            f"-ts ({text!r}) must be comma-separated shares, one per GPU (e.g. -ts 3,1)"
        ) from None


def llamacpp_job(args: argparse.Namespace) -> LlamaCppJob:
    """The ``llama-server`` configuration its flags describe (``memfit llama-server``)."""
    split = _tensor_split(args.tensor_split)
    gpus = args.gpus if args.gpus is not None else (len(split) if split else 1)
    return LlamaCppJob(
        n_gpu_layers=args.n_gpu_layers, ctx_size=args.ctx_size,
        cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
        flash_attn=args.flash_attn, batch_size=args.batch_size, ubatch_size=args.ubatch_size,
        n_parallel=args.parallel, kv_unified=True if args.kv_unified else None,
        tensor_split=split, n_gpus=gpus,
    )  # fmt: skip


#: kind -> its builder from parsed flags (the SeqRun's needs its workload and distribution).
BUILDERS: dict[type, Callable[..., Any]] = {
    WorkloadSpec: workload_from_args,
    DiffusionJob: diffusion_job,
    DiffusionTrainJob: diffusion_train_job,
    SeqRun: seq_run_job,
    VllmConfig: serving_job,
    SglangConfig: sglang_job,
    LlamaCppJob: llamacpp_job,
}


def job_from_flags(kind: type, args: argparse.Namespace, *extra: Any, **options: Any) -> Any:
    """The ``kind`` of job (a :mod:`memfit.spec` record class) the parsed flags describe."""
    builder = BUILDERS.get(kind)
    if builder is None:
        names = ", ".join(k.__name__ for k in BUILDERS)
        raise SpecError(f"kind ({kind!r}) must be one of {names}")
    return builder(args, *extra, **options)
