"""``memfit report`` and ``memfit snapshot``, added to memfit.cli's parser by ``register``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from memfit.flags import positive_int
from memfit.monitor.reader import binding_rank, read_runs
from memfit.report.html import render_html_report
from memfit.report.png import render_png
from memfit.report.snapshot import render_comparison, render_snapshot
from memfit.snapshot import analyze_snapshot
from memfit.snapshot.compare import compare_snapshots
from memfit.userwrites import check_output

REPORT_EXAMPLES = """examples:
  memfit report run.jsonl -o report.html
  memfit report run.jsonl --estimate est.json -o report.html --png report.png
  memfit estimate llama-3.2-1b --batch 4 --json > est.json   # the estimate to compare with

The page is self-contained (inline CSS and SVG, no script, nothing fetched): open it offline or
attach it to an issue. Without --estimate, the estimate stored in the log's start record is used.
"""

SNAPSHOT_EXAMPLES = """examples:
  memfit snapshot snapshot.pickle
  memfit snapshot snapshot.pickle --top 20
  memfit snapshot snapshot.pickle --json > summary.json
  memfit estimate gpt2 --engine trace --snapshot predicted.pickle    # a predicted one
  memfit snapshot snapshot.pickle --predicted predicted.pickle       # predicted vs measured

Record one in the training script:
  torch.cuda.memory._record_memory_history(max_entries=100_000)
  ... run a few steps ...
  torch.cuda.memory._dump_snapshot("snapshot.pickle")

The pickle is read by a reader that refuses every class and function reference (a hostile file
cannot run code); files of 32 MiB and more are streamed in bounded memory.
"""


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the ``report`` and ``snapshot`` subcommands; return their handlers by name."""
    r = sub.add_parser(
        "report",
        help="HTML report (and PNG) of a `memfit monitor` run log",
        description="Render a run log (JSON Lines from `memfit monitor`) as one self-contained "
        "HTML page: memory over steps and time, estimate vs measurement, step time, throughput, "
        "OOM events and the leak check.",
        epilog=REPORT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument(
        "log",
        nargs="+",
        help="run log(s) (JSON Lines) written by `memfit monitor`; a base path takes its "
        "per-rank files (run.rank0.jsonl, ...) and shows the rank with the highest peak",
    )
    r.add_argument(
        "-o",
        "--output",
        default="memfit-report.html",
        help="HTML file (default memfit-report.html)",
    )
    r.add_argument("--estimate", default=None, help="`memfit estimate --json` output to compare")
    r.add_argument("--png", default=None, help="also write a static picture (needs matplotlib)")
    s = sub.add_parser(
        "snapshot",
        help="summarise a CUDA memory snapshot (torch.cuda.memory._dump_snapshot)",
        description="Summarise a PyTorch CUDA memory snapshot without a browser: peak from the "
        "trace, what was live at it and what led up to it, largest live allocations by place in "
        "the code, and fragmentation.",
        epilog=SNAPSHOT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("file", help="snapshot pickle")
    s.add_argument("--top", type=positive_int, default=10, help="rows per table (default 10)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument(
        "--predicted",
        metavar="PRED.pickle",
        help="a predicted snapshot (`memfit estimate ... --engine trace --snapshot PRED.pickle`) "
        "to compare FILE, the measured one, with",
    )
    return {"report": cmd_report, "snapshot": cmd_snapshot}


def cmd_report(args: argparse.Namespace) -> int:
    check_output(args.output, what="-o/--output page", fmt="HTML")  # before reading the logs
    if args.png:
        check_output(args.png, what="--png picture", fmt="PNG")
    run, note = binding_rank(read_runs(args.log))
    if note is not None:
        run = dataclasses.replace(run, note=note)
        print(note)
    out = render_html_report(run, args.output, estimate=args.estimate)
    print(f"wrote {out}")
    if args.png:
        print(f"wrote {render_png(run, args.png, estimate=args.estimate)}")
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    if args.predicted:
        c = compare_snapshots(args.predicted, args.file, top=args.top)
        print(
            json.dumps(c.to_json(), indent=2) if args.json else render_comparison(c, top=args.top)
        )
        return 0
    result = analyze_snapshot(args.file, top=args.top)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(render_snapshot(result, top=args.top))
    return 0
