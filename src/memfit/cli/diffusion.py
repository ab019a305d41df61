"""``memfit estimate <pipeline>``: diffusion pipeline inference (docs/diffusion.md).

A bundled pipeline name (``memfit models``), its hub id, or a local directory with a
``model_index.json`` is sized by :mod:`memfit.estimate.diffusion.pipelines`; everything else
goes to the ordinary ``estimate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memfit.api import estimate
from memfit.cli import diffusion_train as cli_diffusion_train
from memfit.errors import SpecError
from memfit.estimate.verdict import EXIT_CODES
from memfit.flags import flags_for
from memfit.hardware.catalog import get_gpu
from memfit.models.pipelines import pipeline_dir
from memfit.report.diffusion import render_pipeline
from memfit.spec.diffusion import DiffusionJob

#: estimate flags that mean nothing to a pipeline run: refused when set, not ignored.
_REFUSED = {
    "lora_rank": None,
    "checkpointing": None,
    "shard": None,
    "optimizer": None,
}


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


def _job(args: argparse.Namespace) -> Any:
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
    for dest in _REFUSED:
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


def cmd_estimate_pipeline(args: argparse.Namespace) -> int:
    if getattr(args, "mode", "train") == "train":  # the diffusers training scripts
        return cli_diffusion_train.cmd_estimate(args)
    cli_diffusion_train.refuse_train_flags_in_inference(args)
    job = _job(args)
    if sys.stderr.isatty() and not args.json:
        print(f"tracing {args.model}'s components on fake tensors ...", file=sys.stderr)
    gpu = None
    if args.gpu:
        gpu = get_gpu(args.gpu)
    est = estimate(args.model, job, gpu=gpu)  # judged on gpu
    print(json.dumps(est.to_json(), indent=2) if args.json else render_pipeline(est))
    return EXIT_CODES[est.fits.verdict] if est.fits is not None else 0
