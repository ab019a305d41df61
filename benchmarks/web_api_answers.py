"""The answers of the web API benchmark's job list, to compare two commits (a check, not a test).

``benchmarks/web_api_speed.py`` times ``GET /api/estimate`` on a list of jobs; a change made to
answer faster must not change any answer. This script runs the same list
(``web_api_speed.queries``, ``--unique`` jobs: every one new; ``--workload mix``:
``web_api_speed.mix_queries``) in one process through the web worker's own entry point
(``memfit.web.workers.run_cli``: the argv the server builds, stdout and stderr captured) and
writes every answer as JSON: the exit code, the ``--json`` output parsed, stderr. Fields that
time the run (``wall_s``, ``elapsed_s``, ``search_s``, ``confirm_s``) and the trace cache's
``cached`` flag (whether an earlier run left the trace on disk) are left out; everything else
must be equal. Also prints the CPU time per answer (``time.process_time``: the figure a loaded
machine changes least), for jobs that fit and jobs that do not (the nearest-change search).

    git checkout OLD && PYTHONPATH=src python benchmarks/web_api_answers.py --write /tmp/old.json
    git checkout NEW && PYTHONPATH=src python benchmarks/web_api_answers.py --compare /tmp/old.json
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from memfit.cli import build_parser
from memfit.cli import main as memfit_main
from memfit.web.query import build_job
from memfit.web.workers import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from web_api_speed import mix_queries, queries  # noqa: E402

#: Output fields that depend on the run, not on the answer.
RUN_FIELDS = frozenset({"wall_s", "elapsed_s", "search_s", "confirm_s", "cached"})


def without_run_fields(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: without_run_fields(v) for k, v in x.items() if k not in RUN_FIELDS}
    if isinstance(x, list):
        return [without_run_fields(v) for v in x]
    return x


def answers(
    n: int, engine: str, start: int, workload: str = "grid"
) -> tuple[list[dict[str, Any]], list[float]]:
    parser = build_parser()
    jobs = (
        mix_queries(n, engine, start=start)
        if workload == "mix"
        else queries(n, engine, unique=True, start=start)
    )
    argvs = [
        build_job(parser, "estimate", parse_qsl(q), pasted=None, allow_paths=False).argv
        for q in jobs
    ]
    out, cpu = [], []
    for argv in argvs:
        c0 = time.process_time()
        code, stdout, stderr = run_cli(list(argv), run=memfit_main, parser=parser)
        cpu.append(time.process_time() - c0)
        body = json.loads(stdout) if stdout.strip() else None
        out.append({"argv": list(argv), "exit_code": code, "output": without_run_fields(body),
                    "stderr": stderr})  # fmt: skip
    return out, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--engine", default="auto", help="auto (no engine= parameter) or analytic")
    ap.add_argument("--start", type=int, default=0, help="the first job of the unique sequence")
    ap.add_argument(
        "--workload",
        choices=("grid", "mix"),
        default="grid",
        help="grid: web_api_speed.queries (--unique); mix: web_api_speed.mix_queries",
    )
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="write the answers to this JSON file")
    group.add_argument("--compare", type=Path, help="compare with answers written before")
    args = ap.parse_args()
    got, cpu = answers(args.requests, args.engine, args.start, args.workload)
    fits = [c for c, a in zip(cpu, got, strict=True) if a["exit_code"] == 0]
    misses = [c for c, a in zip(cpu, got, strict=True) if a["exit_code"] == 1]
    print(
        f"{len(got)} answers, CPU {sum(cpu):.2f} s ({len(got) / sum(cpu):.1f} per CPU-second); "
        f"mean {1000 * sum(fits) / max(len(fits), 1):.1f} ms for the {len(fits)} that fit, "
        f"{1000 * sum(misses) / max(len(misses), 1):.1f} ms for the {len(misses)} that do not"
    )
    if args.write:
        args.write.write_text(json.dumps(got, indent=1, sort_keys=True))
        return 0
    old = json.loads(args.compare.read_text())
    differ = [(a, b) for a, b in zip(old, got, strict=True) if a != b]
    for a, b in differ[:3]:
        lines = [json.dumps(x, indent=1, sort_keys=True).splitlines() for x in (a, b)]
        print("\n".join(list(difflib.unified_diff(*lines, lineterm=""))[:40]))
    print(f"{len(differ)} of {len(got)} answers differ")
    return 1 if differ or len(old) != len(got) else 0


if __name__ == "__main__":
    sys.exit(main())
