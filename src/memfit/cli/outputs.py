"""``--html FILE`` and ``--snapshot FILE.pickle`` on ``estimate`` and ``plan``: the flags, the
checks before any work, and the files written after (the web server itself, whose workers and
server this does not need, is :mod:`memfit.cli.web`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from memfit.errors import SpecError
from memfit.estimate.history import RecordedTrace, recording
from memfit.estimate.result import MemoryEstimate
from memfit.flags import workload_flags, workload_from_args
from memfit.report.estimate_html import write_estimate_html
from memfit.report.plan_html import write_plan_html
from memfit.spec import WorkloadSpec
from memfit.userwrites import check_output

if TYPE_CHECKING:
    from memfit.plan.search import Plan


# -- --html and --snapshot on estimate and plan ------------------------------------------------
def add_share_flags(parser: argparse.ArgumentParser, *, snapshot: bool) -> None:
    """``--html FILE`` (and, for estimate, ``--snapshot FILE.pickle``) on a data command."""
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained page of the answer (opens offline, attaches to an issue)",
    )
    if snapshot:
        parser.add_argument(
            "--snapshot",
            metavar="FILE.pickle",
            help="also write the predicted allocation history in the format of "
            "torch.cuda.memory._dump_snapshot (pytorch.org/memory_viz opens it; "
            "needs --engine trace)",
        )


def check_output_paths(args: argparse.Namespace) -> None:
    """``--html`` / ``--snapshot`` must name a file in an existing folder: checked before any
    work, so a typo is an exit-2 message, not a traceback after the estimate."""
    for flag, what, fmt in (("html", "--html page", "HTML"), ("snapshot", "--snapshot", "pickle")):
        value = getattr(args, flag, None)
        if not value:
            continue
        check_output(value, what=what, fmt=fmt)  # a FIFO, device or x.png: refused up front
        path = Path(value)
        if path.is_dir():
            raise SpecError(f"--{flag} ({value!r}) is a folder: name a file in it")
        if not path.parent.is_dir():
            raise SpecError(
                f"--{flag} ({value!r}): the folder {str(path.parent)!r} does not exist; create "
                "it or name a file in an existing folder"
            )


@contextmanager
def history(args: argparse.Namespace) -> Iterator[list[RecordedTrace]]:
    """Around the estimate: records the trace engine's allocation history when --snapshot asks
    (refusing the analytic engine before any work)."""
    check_output_paths(args)
    if not getattr(args, "snapshot", None):
        yield []
        return
    if args.engine == "analytic":
        raise SpecError(
            "--snapshot needs an allocation history, and the analytic engine runs no model and "
            "records none: pass --engine trace"
        )
    with recording() as traces:
        yield traces


def estimate_command(args: argparse.Namespace, workload: WorkloadSpec) -> str:
    """The ``memfit estimate`` command of the job (its flags as the flags table spells them)."""
    words = ["memfit estimate", shlex.quote(str(args.model)), workload_flags(workload)]
    words += [f"--gpu {shlex.quote(args.gpu)}"] if args.gpu else []
    words += [f"--engine {args.engine}"] if args.engine != "auto" else []
    return " ".join(w for w in words if w)


def write_estimate_outputs(
    args: argparse.Namespace, est: MemoryEstimate, traces: list[RecordedTrace]
) -> None:
    """Write what --html / --snapshot asked for; say so on stderr (stdout stays the answer)."""
    if getattr(args, "snapshot", None):
        from memfit.snapshot.predicted import pick, write_history  # --snapshot only

        trace = pick(traces, est.engine)
        out = write_history(trace, args.snapshot)
        print(f"wrote {out} (predicted: {trace.n_allocations} allocations)", file=sys.stderr)
        if len(traces) > 1:
            print(
                "memfit: the engine traced fewer layers than the model has and extrapolated; the "
                "snapshot is the deepest traced run (--no-extrapolate traces every layer)",
                file=sys.stderr,
            )
    if getattr(args, "html", None):
        command = estimate_command(args, workload_from_args(args))
        print(
            f"wrote {write_estimate_html(est.to_json(), args.html, command=command)}",
            file=sys.stderr,
        )


def command_of(command: str, args: argparse.Namespace) -> str:
    """The command line that gives ``args`` (options at their default left out; the options a
    web request may not pass, :data:`memfit.web.query.REFUSED`, too)."""
    from memfit.web.query import REFUSED  # the web's request reader: for a page only

    words = ["memfit", command]
    for action in args.subparsers[command]._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            words.append(shlex.quote(str(value)))
            continue
        name = action.option_strings[-1]
        if name in REFUSED or value is None or value == action.default:
            continue
        if action.nargs == 0:
            words += [name] if value == action.const or value is True else []
        else:
            for v in value if isinstance(value, list) else [value]:
                words += [name, shlex.quote(str(v))]
    return " ".join(words)


def write_plan_outputs(args: argparse.Namespace, result: Plan) -> None:
    """``plan --html FILE``."""
    if getattr(args, "html", None):
        out = write_plan_html(result.to_json(), args.html, command=command_of("plan", args))
        print(f"wrote {out}", file=sys.stderr)
