"""``memfit layouts``: every dp x tp x pp x cp layout of N GPUs for a training job, with the peak
GPU of each (argparse subcommand for :mod:`memfit.cli`; the library call is
:func:`memfit.estimate.parallel.enumerate_layouts`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from memfit import progress
from memfit.estimate.parallel import LayoutPeak, enumerate_layouts
from memfit.flags import EXIT_DOES_NOT_FIT, EXIT_OK, positive_int
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.units import GiB

LAYOUTS_EXAMPLES = """examples:
  memfit layouts llama-3.1-70b --gpus 64 --global-batch 256 --seq 8192 --gpu H100
  memfit layouts path/to/llama-3.1-405b --gpus 1024 --global-batch 1024 --seq 8192 --gpu H100 --json
"""
#: Order of the checkpointing modes when layouts tie: less recomputation first.
RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
VERDICT_ORDER = {"fits": 0, "tight": 1, "does not fit": 2, None: 3}


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    g = sub.add_parser(
        "layouts",
        help="every dp x tp x pp x cp layout of N GPUs for a training job, with its peak GPU",
        description="Every data-, tensor-, pipeline- and context-parallel layout of --gpus GPUs "
        "for --global-batch sequences of --seq tokens, each micro-batch size and checkpointing "
        "mode, estimated by the per-rank closed form (memfit.estimate.parallel) and judged on "
        "--gpu. Ranked by a heuristic, not a step-time model: the verdict, then the pipeline's "
        "idle fraction, then the fewest GPUs per replica, the larger micro-batch and the least "
        "recomputation.",
        epilog=LAYOUTS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("model", help="a bundled name, path/to/config.json or its folder, org/name")
    g.add_argument("--gpus", type=positive_int, required=True, help="GPUs in the job")
    g.add_argument(
        "--global-batch", type=positive_int, required=True, help="sequences per optimizer step"
    )
    g.add_argument("--seq", type=positive_int, required=True, help="tokens per sequence")
    g.add_argument("--gpu", help="the GPU to judge each layout on (e.g. H100)")
    g.add_argument(
        "--shard",
        choices=("fsdp", "zero1"),
        default="fsdp",
        help="how the data- and context-parallel ranks hold the model: fsdp (torchtitan's "
        "FSDP2) or zero1 (Megatron's distributed optimizer); default fsdp",
    )
    g.add_argument(
        "--pp-schedule", default="1f1b", help="pipeline schedule of pp > 1 layouts (default 1f1b)"
    )
    g.add_argument("--top", type=positive_int, default=10, help="layouts to print (default 10)")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument("--json", action="store_true", help="print one JSON object (every layout)")
    return {"layouts": cmd_layouts}


def rank_key(row: LayoutPeak) -> tuple[Any, ...]:
    return (
        VERDICT_ORDER.get(row.verdict, 3),
        round(row.bubble, 6),
        row.tp * row.pp * row.cp,
        -row.micro_batch,
        RECOMPUTE_ORDER[row.checkpointing],
        row.device_used_bytes,
    )


def cmd_layouts(args: argparse.Namespace) -> int:
    gpu = get_gpu(args.gpu) if args.gpu else None
    source = resolve_model(args.model)
    with progress.terminal(quiet=args.quiet, json_out=args.json):
        progress.report(f"estimating every layout of {args.gpus} GPUs")
        rows = sorted(
            enumerate_layouts(
                source,
                gpus=args.gpus,
                global_batch=args.global_batch,
                seq_len=args.seq,
                gpu=gpu,
                shard=args.shard,
                pp_schedule=args.pp_schedule,
            ),
            key=rank_key,
        )
    fits = [r for r in rows if r.verdict == "fits"]
    if args.json:
        print(json.dumps({"model": source.name, "gpu": getattr(gpu, "name", None),
                          "layouts": [r.to_json() for r in rows]}, indent=2))  # fmt: skip
    else:
        _print(rows[: args.top], len(rows), len(fits), gpu)
    return EXIT_OK if fits or gpu is None else EXIT_DOES_NOT_FIT


def _print(rows: list[LayoutPeak], n_all: int, n_fit: int, gpu: Any) -> None:
    print(
        f"{'dp':>5}{'tp':>4}{'pp':>4}{'cp':>4}{'micro':>7}{'accum':>7}  {'ckpt':<10}"
        f"{'rank':>5}{'device GiB':>12}{'upper GiB':>11}{'bubble':>8}  verdict"
    )
    for r in rows:
        print(
            f"{r.dp:>5}{r.tp:>4}{r.pp:>4}{r.cp:>4}{r.micro_batch:>7}{r.grad_accum:>7}  "
            f"{r.checkpointing:<10}{r.peak_pp_rank:>5}{r.device_used_bytes / GiB:>12.1f}"
            f"{r.device_used_high_bytes / GiB:>11.1f}{r.bubble:>8.2f}  {r.verdict or '-'}"
        )
    where = f" on {gpu.name}" if gpu is not None else " (no --gpu: no verdict)"
    print(
        f"note: {n_all} layouts, {n_fit} fit{where}; ranked by a heuristic (verdict, pipeline "
        "bubble, GPUs per replica, micro-batch, recomputation), not a step-time model; rank: "
        "the pipeline rank that peaks; --json lists them all"
    )
