"""``memfit estimate``: the peak memory of one step or inference run, by component (argparse
subcommand for :mod:`memfit.cli`).

A text job goes to the text route of :mod:`memfit.api` (:func:`memfit.estimate.estimate`), called
here without loading the one door's other routes (the planner, serving, diffusion; issue 32);
a pipeline, ``--seq-dist`` and ``--from`` go through their own doors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memfit import progress
from memfit.cli import diffusion as cli_diffusion
from memfit.cli import from_files as cli_from
from memfit.cli import outputs as cli_outputs
from memfit.cli import seqdist as cli_seqdist
from memfit.cli.engine import add_engine_flags, options_from
from memfit.estimate import estimate_with
from memfit.estimate.result import MemoryEstimate
from memfit.flags import (
    EXIT_DOES_NOT_FIT,
    EXIT_OK,
    add_flags,
    non_negative_int,
    workload_from_args,
)
from memfit.report.text import render_estimate
from memfit.spec import EstimateOptions, WorkloadSpec

if TYPE_CHECKING:
    from memfit.plan.nearest import NearestFit

ESTIMATE_EXAMPLES = """examples:
  memfit estimate llama-3.2-1b --batch 4 --seq 2048 --gpu A100-40GB
  memfit estimate mistral-7b-v0.1 --lora-rank 16 --checkpointing full --gpu L4
  memfit estimate llama-3.1-8b --mode infer --seq 4096 --new-tokens 256 --gpu L40S --json
  memfit estimate ./my-model/config.json --precision amp-bf16 --optimizer adamw-fused
  memfit estimate mypkg.models:make_unet --allow-code --batch 8 --precision fp16
  memfit estimate vit-base-patch16-224 --image-size 384 --batch 64 --checkpointing full
  memfit estimate whisper-large-v3 --mode infer --audio-seconds 600 --new-tokens 224
"""


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``estimate``; return its handler by name."""
    e = sub.add_parser(
        "estimate",
        help="peak memory of a training step or an inference run, by component",
        description="Trace MODEL's step on fake tensors (no GPU, no weights) and report peak "
        "allocated / reserved / device memory by component and phase.",
        epilog=ESTIMATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument(
        "model",
        nargs="?",
        help="bundled name (see `memfit models`), path to config.json or a "
        "model dir, Hugging Face hub id",
    )
    add_flags(e, "estimate")
    cli_seqdist.add_flags(e)
    cli_from.add_from(e)
    e.add_argument("--gpu", default=None, help="GPU name for a fits verdict (see `memfit gpus`)")
    add_engine_flags(e, framework=True)
    e.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow configs that need the repo's own Python code (runs that code)",
    )
    x = e.add_mutually_exclusive_group()
    x.add_argument(
        "--no-extrapolate",
        dest="extrapolate",
        action="store_const",
        const=False,
        help="trace every layer (default up to 48 layers; slower, exact reserved)",
    )
    x.add_argument(
        "--extrapolate",
        dest="extrapolate",
        action="store_const",
        const=True,
        help="trace a few layers and extrapolate (default beyond 48 layers; fast)",
    )
    e.add_argument(
        "--top", type=non_negative_int, default=5, help="modules to list at the peak (default 5)"
    )
    e.add_argument("--json", action="store_true", help="print one JSON object")
    cli_outputs.add_share_flags(e, snapshot=True)  # --html, --snapshot
    return {"estimate": cmd_estimate}


def estimate(
    model: Any, workload: WorkloadSpec, *, gpu: str | None, options: EstimateOptions
) -> MemoryEstimate:
    """The text route of :func:`memfit.api.estimate` (``memfit.estimate.estimate`` with the
    options' fields; the command has applied the options already)."""
    return estimate_with(model, workload, gpu=gpu, options=options)


def cmd_estimate(args: argparse.Namespace) -> int:
    if cli_diffusion.is_pipeline(args.model):
        return cli_diffusion.cmd_estimate_pipeline(args)
    cli_diffusion.refuse_pipeline_flags(args)
    if args.seq_dist is not None:
        return cli_seqdist.cmd(args, workload_from_args(args))
    with cli_outputs.history(args) as traces:  # --snapshot: the trace's allocation history
        est = cli_from.framework_estimate(args, workload_from_args(args)) or estimate(
            args.model, workload_from_args(args), gpu=args.gpu, options=options_from(args)
        )
        est = cli_from.with_framework_band(args, est)
    cli_outputs.write_estimate_outputs(args, est, traces)
    answer = cli_from.answer(args, est.engine)  # a torchtune / LitGPT --from file: who answered
    nearest = _nearest(args, est)
    if args.json:
        extra = {} if nearest is None else {"nearest_fit": nearest.to_json()}
        print(json.dumps({**est.to_json(), **answer, **extra}, indent=2))
    else:
        tail = "" if nearest is None else "\n" + nearest.text()
        print(render_estimate(est, top=args.top) + cli_from.answer_lines(answer) + tail)
    return EXIT_DOES_NOT_FIT if est.fits is not None and not est.fits.fits else EXIT_OK


def _nearest(args: argparse.Namespace, est: Any) -> NearestFit | None:
    """For a text job that does not fit: the nearest change that does (memfit.plan.nearest),
    searched with the fast engine; None when it fits, or for a --from framework answer."""
    if est.fits is None or est.fits.verdict != "does not fit" or cli_from.answer(args, est.engine):
        return None
    settled = dataclasses.replace(workload_from_args(args), precision=est.workload["precision"])
    from memfit.plan.nearest import nearest_fit  # the planner's search: for a job that does not fit

    progress.report("looking for the nearest change that fits")
    return nearest_fit(args.model, settled, args.gpu, model_name=str(args.model))
