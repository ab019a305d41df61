"""The ``memfit monitor`` and ``memfit diagnose`` subcommands (registered by ``memfit.cli``).

Exit codes: ``monitor`` exits with the command's own code (2 when memfit cannot start it);
``diagnose`` exits 0, or 2 for a missing or unreadable log.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from memfit.errors import SpecError
from memfit.flags import finite_float, non_negative_int
from memfit.monitor.diagnose import diagnose_ranks
from memfit.monitor.process import monitor_command
from memfit.monitor.reader import rank_of, read_runs
from memfit.monitor.summary import render_summary
from memfit.report.html import render_html_report
from memfit.units import format_bytes
from memfit.userfiles import JSON_MAX_BYTES, read_json

MONITOR_EXAMPLES = """examples:
  memfit monitor -- python train.py --epochs 1
  memfit monitor --log run.jsonl --interval 0.2 -- torchrun --nproc-per-node 2 train.py
  memfit estimate llama-3.2-1b --batch 4 --seq 2048 --json > est.json
  memfit monitor --estimate est.json -- python train.py      # prints a receipt at the end
  memfit monitor --report run.html -- python train.py
  memfit diagnose run.jsonl
"""

DIAGNOSE_EXAMPLES = """examples:
  memfit diagnose run.jsonl
  memfit diagnose run.jsonl --json
  memfit diagnose run.jsonl          # under torchrun: merges run.rank0.jsonl, run.rank1.jsonl, ...
(run.jsonl from memfit.Monitor in a training script; `memfit monitor` logs device samples only)
"""

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the subcommands to ``sub`` (argparse subparsers); returns their handlers by name."""
    raw = argparse.RawDescriptionHelpFormatter
    m = sub.add_parser(
        "monitor",
        help="run a command and log its GPU memory (NVML, per process tree) to JSON Lines",
        description="Run COMMAND, sample the device memory its process tree uses (NVML; on a\n"
        "machine without a GPU, its RSS) every --interval seconds, write the run log, and exit\n"
        "with COMMAND's exit code. For per-step allocator numbers put memfit.Monitor in the\n"
        "script itself (see docs/monitoring.md).",
        epilog=MONITOR_EXAMPLES,
        formatter_class=raw,
    )
    m.add_argument("--log", default="run.jsonl", help="run log to write (default run.jsonl)")
    m.add_argument(
        "--interval", type=finite_float, default=0.5, help="seconds between samples (0.5)"
    )
    m.add_argument(
        "--device", type=non_negative_int, default=0, help="NVML index of the GPU to watch (0)"
    )
    m.add_argument(
        "--estimate", default=None, help="a `memfit estimate --json` file: print a receipt"
    )
    m.add_argument("--report", default=None, help="also write the run's HTML report here")
    m.add_argument("--fsync", action="store_true", help="fsync the log after every record")
    m.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    m.add_argument(
        "child", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command to run, after --"
    )
    d = sub.add_parser(
        "diagnose",
        help="leak or caching allocator? read a run log's steps and say which, with numbers",
        description="Fit a line through allocated and reserved bytes over the steady steps of a\n"
        "run log and report a leak (allocated grows), fragmentation (reserved grows), cache\n"
        "(reserved plateaus above a flat allocated) or stable, plus device memory outside the\n"
        "allocator (CUDA context, NCCL, other processes).",
        epilog=DIAGNOSE_EXAMPLES,
        formatter_class=raw,
    )
    d.add_argument(
        "log",
        nargs="+",
        help="run log(s) written by memfit.Monitor; a base path takes its per-rank files",
    )
    d.add_argument("--json", action="store_true", help="print one JSON object")
    return {"monitor": cmd_monitor, "diagnose": cmd_diagnose}


def _read_estimate(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None

    data = read_json(path, what="estimate", max_bytes=JSON_MAX_BYTES)  # UserFileError: exit 2
    if not isinstance(data, dict) or "peak_allocated_bytes" not in data:
        raise SpecError(f"{path!r} is not the output of `memfit estimate --json`")
    return data


def cmd_monitor(args: argparse.Namespace) -> int:
    command = args.child[1:] if args.child[:1] == ["--"] else args.child
    code, summary, receipt = monitor_command(
        command,
        args.log,
        interval_s=args.interval,
        device_index=args.device,
        estimate=_read_estimate(args.estimate),
        fsync=args.fsync,
    )
    report = _write_report(args.log, args.report)
    if args.json:
        out = {"log": args.log, "report": report, "summary": summary, "receipt": receipt}
        print(json.dumps(out, indent=2))
    else:
        where = f"\n  log: {args.log}" + (f"\n  report: {report}" if report else "")
        print(render_summary(summary, receipt) + where, file=sys.stderr)
    return int(code)


def _write_report(log: str, out: str | None) -> str | None:
    """The HTML report of the run (memfit.report.html), when --report asks for one."""
    if out is None:
        return None
    return str(render_html_report(log, out))


def cmd_diagnose(args: argparse.Namespace) -> int:
    found = diagnose_ranks(read_runs(args.log))
    if len(found) == 1:
        run, d = found[0]
        if args.json:
            print(json.dumps(d.to_json(), indent=2))
        else:
            print("\n".join(_diagnosis_lines(d, run, f"memfit diagnose: {d.verdict}")))
        return EXIT_OK
    names = [run.path.name for run, _ in sorted(found, key=lambda p: str(p[0].path))]
    worst = found[0][1].verdict
    if args.json:
        ranks = [
            {"log": str(run.path), "rank": rank_of(run.path), **d.to_json()} for run, d in found
        ]
        out = {"merged_logs": len(found), "logs": names, "verdict": worst, "ranks": ranks}
        print(json.dumps(out, indent=2))
        return EXIT_OK
    lines = [f"memfit diagnose: merged {len(found)} rank logs ({', '.join(names)}): {worst} first"]
    for run, d in found:
        lines += _diagnosis_lines(d, run, f"{run.path.name}: {d.verdict}")
    print("\n".join(lines))
    return EXIT_OK


def _diagnosis_lines(d: Any, run: Any, head: str) -> list[str]:
    lines = [f"{head} ({d.n_steps} steps)"]
    lines += [f"  {finding}" for finding in d.findings or [d.summary]]
    for name, trend in (("allocated", d.allocated), ("reserved", d.reserved)):
        if trend is not None:
            r2 = "n/a" if trend.r2 is None else f"{trend.r2:.3f}"
            lines.append(
                f"  {name:<10} {format_bytes(trend.start_bytes)} → {format_bytes(trend.end_bytes)}"
                f", {trend.slope_bytes_per_step:+.0f} B/step, R² {r2}"
            )
    if run.n_skipped_lines:
        lines.append(f"  skipped {run.n_skipped_lines} unusable lines ({run.skipped_reason})")
    return lines
