"""Whether a speed change left every answer as it was: the whole ``--json`` answer of many jobs.

Writes one line per job (the command, its exit code and its ``--json`` output with the
wall-clock fields dropped) for the code on ``PYTHONPATH``; ``--compare A B`` then says which
jobs differ. Jobs: the web mix's first ``--mix`` jobs (``web_api_speed.mix_queries``, as a
``memfit web`` worker runs them), ``nearest_speed.py``'s jobs as ``memfit estimate --engine
analytic --json`` and as ``memfit plan --json`` (its plan, rejected plans and nearest changes),
all in one process, so every memo is warm as in a server (issue 32). ``--grid N``: first the web
API's default workload's first N jobs (``web_api_speed.queries``, 40 distinct, 16 of which do not
fit) as the default engine answers them (no ``--engine``: ``auto``, which traces where the
analytic answer is tight; needs torch).

    PYTHONPATH=/tmp/base/src python benchmarks/answers_identical.py --out /tmp/before.jsonl
    PYTHONPATH=src python benchmarks/answers_identical.py --out /tmp/after.jsonl
    python benchmarks/answers_identical.py --compare /tmp/before.jsonl /tmp/after.jsonl

``--ignore KEY`` (repeatable) also drops a key wherever it appears, e.g. ``n_estimated``
(how many estimates a search made: a cut that skips estimates changes it, not the answer).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import urllib.parse
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: keys that hold wall-clock seconds: they differ between any two runs
TIMING_KEYS = frozenset({"wall_s", "elapsed_s", "search_s", "confirm_s"})


def scrub(value: Any, drop: frozenset[str]) -> Any:
    """``value`` without the keys in ``drop``, at any depth."""
    if isinstance(value, dict):
        return {k: scrub(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [scrub(v, drop) for v in value]
    return value


def commands(n_mix: int, n_grid: int = 0) -> list[list[str]]:
    """The argv of every job: the grid's first ``n_grid`` (the default engine), the mix's first
    ``n_mix``, then nearest_speed.py's as estimates and as plans."""
    import nearest_speed
    from web_api_speed import mix_queries, queries

    from memfit.cli import build_parser
    from memfit.web.query import build_job

    parser = build_parser()
    out = []
    for q in [*queries(n_grid, "auto"), *mix_queries(n_mix, "analytic")]:
        job = build_job(
            parser, "estimate", urllib.parse.parse_qsl(q), pasted=None, allow_paths=True
        )
        out.append(list(job.argv))
    for model, fields, gpu in nearest_speed.JOBS:
        out.append(nearest_speed.cli_args(model, fields, gpu))
    for model, fields, gpu in nearest_speed.JOBS:
        if fields.get("compile"):
            continue  # the planner does not search --compile jobs
        argv = ["plan", model, "--gpu", gpu, "--seq", str(fields["seq_len"]), "--json"]
        if fields.get("mode") == "infer":
            argv += ["--mode", "infer", "--batch", str(fields["batch_size"])]
        else:
            argv += ["--global-batch", str(fields["batch_size"])]
        if "lora_rank" in fields:
            argv += ["--lora-rank", str(fields["lora_rank"])]
        if "quant" in fields:
            argv += ["--quant", fields["quant"]]
        if "precision" in fields:
            argv += ["--precision", fields["precision"]]
        if "gpus" in fields:
            argv += ["--gpus", str(fields["gpus"])]
        out.append(argv + ["--engine", "analytic"])
    return out


def record(n_mix: int, out_path: Path, n_grid: int = 0) -> None:
    from memfit.cli import main

    with out_path.open("w") as f:
        for argv in commands(n_mix, n_grid):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                code = main(argv)
            text = buf.getvalue()
            try:
                answer: Any = scrub(json.loads(text), TIMING_KEYS)
            except json.JSONDecodeError:
                answer = text
            f.write(json.dumps({"argv": argv, "exit": code, "answer": answer}) + "\n")


def compare(a: Path, b: Path, ignore: frozenset[str]) -> int:
    rows_a = [json.loads(line) for line in a.read_text().splitlines()]
    rows_b = [json.loads(line) for line in b.read_text().splitlines()]
    if [r["argv"] for r in rows_a] != [r["argv"] for r in rows_b]:
        print("the two files hold different jobs")
        return 2
    differ = 0
    for ra, rb in zip(rows_a, rows_b, strict=True):
        if scrub(ra, ignore) != scrub(rb, ignore):
            differ += 1
            print("differs:", " ".join(ra["argv"]))
    print(
        f"{len(rows_a)} jobs, {differ} differ" + (f" (ignoring {sorted(ignore)})" if ignore else "")
    )
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mix", type=int, default=200, help="the web mix's first N jobs")
    ap.add_argument(
        "--grid", type=int, default=0, help="the web grid's first N jobs, default engine (auto)"
    )
    ap.add_argument("--out", type=Path, help="write the answers (one JSON line a job) here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    ap.add_argument("--ignore", action="append", default=[], help="a key to leave out")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare, frozenset(args.ignore))
    if args.out is None:
        ap.error("give --out FILE or --compare A B")
    record(args.mix, args.out, args.grid)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
