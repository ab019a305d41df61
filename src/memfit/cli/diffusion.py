"""``memfit estimate|plan <pipeline>``: diffusion pipeline inference (docs/diffusion.md).

A bundled pipeline name (``memfit models``), its hub id, or a local directory with a
``model_index.json`` is sized by :mod:`memfit.estimate.diffusion.pipelines`; everything else
goes to the ordinary ``estimate``. ``plan --mode infer`` searches the diffusers memory switches
(:mod:`memfit.plan.diffusion_infer`); an estimate that does not fit ends with the first plan.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memfit.cli import diffusion_train as cli_diffusion_train
from memfit.errors import SpecError
from memfit.estimate.verdict import EXIT_CODES
from memfit.flags import EXIT_DOES_NOT_FIT, EXIT_OK, add_flags, flags_for
from memfit.hardware.catalog import get_gpu
from memfit.jobflags import diffusion_job, refuse_train_flags_in_inference
from memfit.models.pipelines import pipeline_dir
from memfit.report.diffusion import (
    nearest_fit_line,
    render_pipeline,
    render_pipeline_fit,
    render_pipeline_plan,
)

#: The inference flags ``memfit plan PIPELINE --mode infer`` takes (rows of the one table; the
#: plan's parser has --batch, --precision and --max-sequence-length already)
PLAN_FLAGS = (
    "--height", "--width", "--num-frames", "--steps", "--quant", "--text-encoder-quant",
    "--pipeline-offload", "--offload-type", "--num-blocks-per-group", "--use-stream",
    "--vae-slicing", "--vae-tiling", "--attention-slicing", "--layerwise-casting",
    "--vae-precision", "--no-text-encoder-3",
)  # fmt: skip
#: text-model plan flags an inference plan of a pipeline has no use for: (flag, dest, unset)
TEXT_PLAN_FLAGS = (
    ("--global-batch", "global_batch", None), ("--recommend-gpu", "recommend_gpu", False),
    ("--goal", "goal", "throughput"), ("--seq-dist", "seq_dist", None), ("--allow", "allow", None),
    ("--keep-full-finetune", "keep_full_finetune", False), ("--no-quant", "no_quant", False),
    ("--allow-offload", "allow_offload", False), ("--attention", "attention", "sdpa"),
    ("--new-tokens", "new_tokens", 0), ("--html", "html", None), ("--confirm", "confirm", None),
)  # fmt: skip


def api() -> Any:
    """:mod:`memfit.api`, the one door (its routes load the engines and the planner: imported
    when a pipeline command runs, not when ``memfit estimate`` registers its flags)."""
    import memfit.api

    return memfit.api


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    """The pipeline-inference flags of ``memfit plan`` (:data:`PLAN_FLAGS`; its --quant is the
    table's already: a text job's own weight format, or a pipeline's denoiser's)."""
    add_flags(parser, "estimate", *(n for n in PLAN_FLAGS if n != "--quant"))


def add_fit_flags(parser: argparse.ArgumentParser) -> None:
    """The pipeline-inference flags of ``memfit fit`` (its --quant is the table's already)."""
    add_flags(parser, "estimate", *(n for n in PLAN_FLAGS if n != "--quant"))


def is_pipeline(model: str) -> bool:
    return pipeline_dir(model) is not None


def refuse_pipeline_flags(args: argparse.Namespace) -> None:
    """A diffusion-pipeline flag on a model that is not a pipeline: refused, not ignored."""

    for f in flags_for("estimate"):
        if f.target == "pipeline" and getattr(args, f.dest, None) not in (None, False):
            raise SpecError(
                f"{f.name} applies to diffusion pipelines only, and {args.model!r} is not one "
                "(a bundled pipeline in `memfit models`, or a directory with a model_index.json)"
            )


def cmd_estimate_pipeline(args: argparse.Namespace) -> int:
    cli_diffusion_train.require_diffusion_stack()
    if getattr(args, "mode", "train") == "train":  # the diffusers training scripts
        return cli_diffusion_train.cmd_estimate(args)
    refuse_train_flags_in_inference(args)
    job = diffusion_job(args)
    if sys.stderr.isatty() and not args.json:
        print(f"tracing {args.model}'s components on fake tensors ...", file=sys.stderr)
    gpu = None
    if args.gpu:
        gpu = get_gpu(args.gpu)
    est = api().estimate(args.model, job, gpu=gpu)  # judged on gpu
    out: dict[str, Any] = est.to_json()
    text = render_pipeline(est)
    if est.fits is not None and not est.fits.fits:  # tight or does not fit: the nearest plan
        plans = api().plan(args.model, job, gpu=gpu)
        best = plans.best
        out["nearest_change_that_fits"] = best.to_json() if best is not None else None
        text += "\n" + nearest_fit_line(plans, args.model, args.gpu)
    print(json.dumps(out, indent=2) if args.json else text)
    return EXIT_CODES[est.fits.verdict] if est.fits is not None else 0


def _refuse_text_plan_flags(args: argparse.Namespace) -> None:
    set_flags = [n for n, dest, unset in TEXT_PLAN_FLAGS if getattr(args, dest, unset) != unset]
    if (getattr(args, "gpus", None) or 1) != 1:
        set_flags.append(f"--gpus {args.gpus}")
    if getattr(args, "runtime", None) == "vllm":
        set_flags.append("--runtime vllm")
    if set_flags:
        raise SpecError(
            f"{', '.join(set_flags)}: text-model plan flags, not used by a diffusion inference "
            "plan (it tries offload modes, VAE tiling and quantized weights on one GPU; size the "
            "call with --height, --width and --batch)"
        )


def _gpu_flag(args: argparse.Namespace) -> str:
    """``--gpu NAME`` for the estimate commands a plan prints; none with --gpu-memory (estimate
    judges catalog GPUs only)."""
    return "" if args.gpu_memory is not None else f"--gpu {args.gpu}"


def cmd_plan_pipeline(args: argparse.Namespace) -> int:
    """``memfit plan PIPELINE``: training plans (--mode train, the default) or inference ones."""
    cli_diffusion_train.require_diffusion_stack()
    if getattr(args, "mode", "train") == "train":  # the diffusers training scripts
        return cli_diffusion_train.cmd_plan(args)
    _refuse_text_plan_flags(args)
    refuse_train_flags_in_inference(args)
    job = diffusion_job(
        argparse.Namespace(**{**vars(args), "batch": 1 if args.batch is None else args.batch})
    )
    if not args.gpu and args.gpu_memory is None:
        raise SpecError("plan of a diffusion pipeline needs --gpu NAME or --gpu-memory SIZE")
    result = api().plan(
        args.model, job, gpu=args.gpu or None, gpu_memory_bytes=args.gpu_memory,
        headroom=args.headroom,
    )  # fmt: skip
    print(
        json.dumps(result.to_json(), indent=2)
        if args.json
        else render_pipeline_plan(result, args.model, _gpu_flag(args))
    )
    return EXIT_OK if result.fits else EXIT_DOES_NOT_FIT


def cmd_fit_pipeline(args: argparse.Namespace) -> int:
    """``memfit fit PIPELINE``: training (--mode train, the default) or one inference call's
    largest batch / square resolution."""
    cli_diffusion_train.require_diffusion_stack()
    if getattr(args, "mode", "train") == "train":  # the diffusers training scripts
        return cli_diffusion_train.cmd_fit(args)
    refuse_train_flags_in_inference(args)
    if getattr(args, "seq_dist", None) is not None or getattr(args, "runtime", None) == "vllm":
        raise SpecError("--seq-dist / --runtime vllm: text-model fit flags, not a pipeline call's")
    job = diffusion_job(args)
    if not args.gpu and args.gpu_memory is None:
        raise SpecError("fit of a diffusion pipeline needs --gpu NAME or --gpu-memory SIZE")
    result = api().fit(
        args.model, job, gpu=args.gpu or None, solve=args.solve,
        gpu_memory_bytes=args.gpu_memory, headroom=args.headroom,
    )  # fmt: skip
    print(
        json.dumps(result.to_json(), indent=2)
        if args.json
        else render_pipeline_fit(result, args.model)
    )
    return EXIT_OK if result.fits else EXIT_DOES_NOT_FIT
