"""``memfit estimate|fit|plan <pipeline> --mode train``: diffusion training (docs/diffusion.md).

The job's flags are memfit's own (``--batch``, ``--lora-rank``, ``--checkpointing full``,
``--optimizer adamw-8bit``, ``--precision bf16-mixed``) plus the scripts' ``--resolution``,
``--train-text-encoder`` and ``--cache-latents``; no ``--lora-rank`` means full fine-tuning, as
for text models.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from typing import Any

from memfit.errors import MissingDependencyError, SpecError
from memfit.estimate.verdict import EXIT_CODES
from memfit.jobflags import diffusion_train_job
from memfit.report.diffusion import render_training, render_training_fit, render_training_plan


def _api() -> Any:
    """:mod:`memfit.api` (its routes load the engines: imported when a training command runs)."""
    import memfit.api

    return memfit.api


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ValueError, ImportError):  # a module set to None in sys.modules: blocked
        return False


def require_diffusion_stack() -> None:
    """A pipeline is built by diffusers on torch (``pip install 'memfit[diffusion]'``): refused
    up front, naming that extra, where either is missing (not torch's ModuleNotFoundError)."""
    missing = [m for m in ("torch", "diffusers") if not _installed(m)]
    if missing:
        raise MissingDependencyError(
            f"diffusion pipelines need {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: pip install 'memfit[diffusion]'"
        )


def cmd_estimate(args: argparse.Namespace) -> int:
    require_diffusion_stack()
    job = diffusion_train_job(args)
    est = _api().estimate(args.model, job, gpu=args.gpu or None)  # judged on the GPU asked
    print(json.dumps(est.to_json(), indent=2) if args.json else render_training(est))
    return EXIT_CODES[est.fits.verdict] if est.fits is not None else 0


def _checked_gpu(args: argparse.Namespace) -> str | None:
    """The GPU of a fit / plan of diffusion training (None with --gpu-memory alone)."""
    if getattr(args, "mode", "train") != "train":
        raise SpecError(
            f"memfit {args.command} of a diffusion pipeline sizes its training (--mode train); "
            "for inference use memfit estimate --mode infer"
        )
    gpu: str | None = getattr(args, "gpu", None) or None
    if gpu is None and getattr(args, "gpu_memory", None) is None:
        raise SpecError(f"{args.command} needs --gpu NAME or --gpu-memory SIZE (e.g. 24GB)")
    return gpu


def cmd_fit(args: argparse.Namespace) -> int:
    require_diffusion_stack()
    job = diffusion_train_job(args)
    result = _api().fit(
        args.model, job, gpu=_checked_gpu(args), solve=args.solve,
        gpu_memory_bytes=getattr(args, "gpu_memory", None), headroom=args.headroom,
    )  # fmt: skip
    print(json.dumps(result.to_json(), indent=2) if args.json else render_training_fit(result))
    return 0 if result.fits else 1


def _refuse_text_plan_flags(args: argparse.Namespace) -> None:
    """The text-model planner's flags a pipeline's training plan has no use for: refused, not
    silently ignored."""
    set_flags = [
        name
        for name, dest, unset in (
            ("--global-batch", "global_batch", None),
            ("--recommend-gpu", "recommend_gpu", False),
            ("--goal", "goal", "throughput"),
            ("--seq-dist", "seq_dist", None),
            ("--allow", "allow", None),
            ("--keep-full-finetune", "keep_full_finetune", False),
            ("--allow-offload", "allow_offload", False),
        )
        if getattr(args, dest, unset) not in (unset, [])
    ]
    if getattr(args, "runtime", None) == "vllm":
        set_flags.append("--runtime vllm")
    if set_flags:
        raise SpecError(
            f"{', '.join(set_flags)}: text-model plan flags, not used by a diffusion training "
            "plan (it tries 8-bit Adam, cached latents and gradient checkpointing on one GPU; "
            "size the job with --resolution and --batch)"
        )


def cmd_plan(args: argparse.Namespace) -> int:
    require_diffusion_stack()
    _refuse_text_plan_flags(args)
    ranks = args.lora_rank or []
    job = diffusion_train_job(args, lora_rank=ranks[0] if ranks else None)
    result = _api().plan(
        args.model, job, gpu=_checked_gpu(args),
        gpu_memory_bytes=getattr(args, "gpu_memory", None), headroom=args.headroom,
    )  # fmt: skip
    print(
        json.dumps(result.to_json(), indent=2)
        if args.json
        else render_training_plan(result, args.model)
    )
    return 0 if result.fits else 1
