"""``memfit estimate <pipeline>``: diffusion pipeline inference (docs/diffusion.md).

A bundled pipeline name (``memfit models``), its hub id, or a local directory with a
``model_index.json`` is sized by :mod:`memfit.estimate.diffusion.pipelines`; everything else
goes to the ordinary ``estimate``.
"""

from __future__ import annotations

import argparse
import json
import sys

from memfit.api import estimate
from memfit.cli import diffusion_train as cli_diffusion_train
from memfit.errors import SpecError
from memfit.estimate.verdict import EXIT_CODES
from memfit.flags import flags_for
from memfit.hardware.catalog import get_gpu
from memfit.jobflags import diffusion_job, refuse_train_flags_in_inference
from memfit.models.pipelines import pipeline_dir
from memfit.report.diffusion import render_pipeline


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
    if getattr(args, "mode", "train") == "train":  # the diffusers training scripts
        return cli_diffusion_train.cmd_estimate(args)
    refuse_train_flags_in_inference(args)
    job = diffusion_job(args)
    if sys.stderr.isatty() and not args.json:
        print(f"tracing {args.model}'s components on fake tensors ...", file=sys.stderr)
    gpu = None
    if args.gpu:
        gpu = get_gpu(args.gpu)
    est = estimate(args.model, job, gpu=gpu)  # judged on gpu
    print(json.dumps(est.to_json(), indent=2) if args.json else render_pipeline(est))
    return EXIT_CODES[est.fits.verdict] if est.fits is not None else 0
