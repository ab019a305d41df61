"""``memfit estimate --seq-dist``: the flags and the output of a variable-length run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memfit.cli.engine import options_from
from memfit.errors import SpecError
from memfit.estimate.seqrun.dist import parse_seq_dist
from memfit.flags import count_at_most, integer
from memfit.jobflags import seq_run_job
from memfit.report.seqrun import render_seq_fit, render_seq_plan, render_seq_run
from memfit.report.text import render_estimate
from memfit.spec import WorkloadSpec
from memfit.spec.rules import MAX_RUN_STEPS
from memfit.spec.seqrun import DEFAULT_STEPS


def _api() -> Any:
    """:mod:`memfit.api`, the one door (its routes load the planner and the run replay: imported
    when a ``--seq-dist`` command runs, not when ``estimate`` registers these flags)."""
    import memfit.api

    return memfit.api


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The variable-length run's flags (estimate only)."""

    g = parser.add_argument_group("variable-length runs (training)")
    g.add_argument(
        "--seq-dist",
        default=None,
        metavar="MEAN,STD,MAX|FILE",
        help="sample lengths: a normal clipped to [1, MAX] (truncation puts longer samples at "
        "MAX), or a JSON/CSV histogram file of length,count; replays the caching allocator "
        "over the run and reports reserved memory after it (the estimate is then at MAX)",
    )
    g.add_argument(
        "--run-steps",
        dest="run_steps",
        type=count_at_most(MAX_RUN_STEPS, "steps (memfit.spec.rules.MAX_RUN_STEPS)"),
        default=DEFAULT_STEPS,
        help=f"steps replayed with --seq-dist (default {DEFAULT_STEPS})",
    )
    g.add_argument("--seed", type=integer, default=0, help="sampling seed (default 0)")
    g.add_argument(
        "--pad-to-multiple-of",
        type=integer,
        default=None,
        help="the data collator's pad_to_multiple_of (default: pad to the longest sample)",
    )
    g.add_argument(
        "--packing", action="store_true", help="packed sequences: every step is MAX tokens"
    )
    g.add_argument(
        "--group-by-length",
        action="store_true",
        help="Trainer's group_by_length (LengthGroupedSampler, longest batch first)",
    )


def cmd(args: argparse.Namespace, workload: Any) -> int:
    """``estimate --seq-dist``: the estimate at the longest length, then the run's replay."""

    dist = parse_seq_dist(args.seq_dist)
    if not workload.is_train:
        raise SpecError(f"--seq-dist models training runs, not --mode {workload.mode}")
    answer = _api().estimate(str(args.model), seq_run_job(args, workload, dist), gpu=args.gpu,
                      options=options_from(args))  # fmt: skip
    est, run = answer.estimate, answer.run
    used_bytes = run.device_used_bytes
    # With a GPU the replay is capped at its memory (the allocator frees its cache and retries
    # there, as torch does); the API judges the run by THE verdict rule on the estimate's budget
    # (a run whose capped replay still ran out of memory: on what it reserves without a cap).
    verdict = None if run.fits is None else run.fits.verdict
    fits = None if verdict is None else verdict == "fits"
    if args.json:
        out = {**est.to_json(), "seq_dist": {**run.to_json(), "device_used_bytes": used_bytes}}
        out["seq_dist"]["fits"] = fits
        out["seq_dist"]["verdict"] = verdict
        if run.fits is not None:
            out["seq_dist"]["judged"] = run.fits.to_json()
        print(json.dumps(out, indent=2))
    else:
        print(render_estimate(est, top=args.top))
        print(render_seq_run(run, used_bytes, verdict))
    return 1 if fits is False or (est.fits is not None and not est.fits.fits) else 0


def cmd_fit(args: argparse.Namespace, workload: Any) -> int:
    """``fit --solve batch --seq-dist``: the largest batch whose reserved memory after the run
    fits (:func:`memfit.plan.seq_fit.fit_seq_dist`)."""

    if args.solve != "batch":
        raise SpecError(
            f"--seq-dist with --solve {args.solve}: the distribution gives the lengths, so only "
            "--solve batch is solved over a run; drop --seq-dist to solve a fixed shape"
        )
    if not workload.is_train:
        raise SpecError(f"--seq-dist models training runs, not --mode {workload.mode}")
    if args.gpu is None and args.gpu_memory is None:
        raise SpecError("fit needs --gpu NAME or --gpu-memory SIZE (e.g. 24GB)")
    dist = parse_seq_dist(args.seq_dist)
    result = _api().fit(
        str(args.model), seq_run_job(args, workload, dist), gpu=args.gpu,
        options=options_from(args), solve="batch", gpu_memory_bytes=args.gpu_memory,
        headroom=args.headroom,
    )  # fmt: skip
    print(json.dumps(result.to_json(), indent=2) if args.json else render_seq_fit(result))
    return 0 if result.fits else 1


def cmd_plan(args: argparse.Namespace, request: Any) -> int:
    """``plan --seq-dist``: the plan at the longest length, its recommended job replayed over
    the run (:func:`memfit.plan.seq_fit.plan_seq_dist`). Exit 1 when the run does not fit even
    with expandable segments."""

    if request.mode != "train":
        raise SpecError(f"--seq-dist models training runs, not --mode {request.mode}")
    dist = parse_seq_dist(args.seq_dist)
    run = seq_run_job(args, WorkloadSpec(batch_size=request.batch_size or 1), dist)  # its steps
    result = _api().plan(
        str(args.model), run, gpu=args.gpu, options=options_from(args), request=request,
        gpu_memory_bytes=args.gpu_memory,
    )  # fmt: skip
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        from memfit.report.plan import render_plan  # the plan's flags and configs: plan only

        print(render_plan(result.plan))
        print(render_seq_plan(result))
    return 0 if result.fits else 1
