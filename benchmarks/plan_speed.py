"""Planner latency and search size on the README's planning examples (a benchmark, not a test).

For each case: wall time of ``memfit.plan.plan`` (search + confirmation of the plans shown), the
combinations considered, estimated by the search engine, skipped as dominated, and the calls to
the confirming engine. Which engines ran is recorded: the analytic engine searches when it is
installed, else the trace engine does (seconds per estimate: the 3 s target needs the former).
Writes ``benchmarks/results/plan_speed.md``.

    .venv/bin/python benchmarks/plan_speed.py            # all cases
    .venv/bin/python benchmarks/plan_speed.py --quick    # the first case only
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "plan_speed.md"
#: (model, gpu, request fields): the README / docs/planning.md examples.
CASES: list[tuple[str, str, dict[str, object]]] = [
    ("llama-3.1-8b", "L4", {"seq_len": 4096, "global_batch": 16}),
    ("llama-3.1-8b", "A100-80GB", {"seq_len": 4096, "global_batch": 16}),
    ("llama-3.1-8b", "H100-80GB", {"seq_len": 4096, "global_batch": 64, "gpus": 8}),
    (
        "llama-3.1-70b",
        "H100-80GB",
        {"mode": "infer", "seq_len": 7680, "new_tokens": 512, "batch_size": 32, "gpus": 2},
    ),
]


def run_case(model: str, gpu: str, fields: dict[str, object], confirm: str) -> dict[str, object]:
    from memfit.plan import PlanRequest, plan

    t0 = time.perf_counter()
    p = plan(model, PlanRequest(**fields, confirm=confirm), gpu=gpu)  # type: ignore[arg-type]
    wall = time.perf_counter() - t0
    rec = p.recommended
    return {
        "case": f"{model} on {fields.get('gpus', 1)} x {gpu}, "
        + ", ".join(f"{k}={v}" for k, v in fields.items() if k != "gpus"),
        "confirm": confirm,
        "wall_s": wall,
        "search_s": p.search_s,
        "confirm_s": p.confirm_s,
        "engines": p.search_engine + (f" + {p.confirm_engine}" if p.confirm_engine else ""),
        "n_candidates": p.n_candidates,
        "n_estimated": p.n_estimated,
        "n_pruned": p.n_pruned,
        "n_confirmed": p.n_confirmed,
        "plan": rec.settings.describe() if rec else "nothing fits",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="run the first case only")
    parser.add_argument(
        "--confirm",
        nargs="+",
        default=["none", "shown"],
        help="confirmation modes to time (default: none = search only, shown = the full plan)",
    )
    args = parser.parse_args()
    cases = CASES[:1] if args.quick else CASES
    rows = [run_case(*case, confirm=mode) for mode in args.confirm for case in cases]
    lines = [
        "# Planner speed",
        "",
        f"`.venv/bin/python benchmarks/plan_speed.py{' --quick' if args.quick else ''}` on "
        f"{platform.processor() or platform.machine()} ({os.cpu_count()} logical CPUs, shared), "
        f"Python {sys.version.split()[0]}. Target: a full plan in under 3 s. `confirm none`: the "
        "search alone (analytic engine); `confirm shown`: the default `memfit plan`, every plan "
        "shown confirmed by the trace engine. `estimated`: workloads the search engine "
        "estimated (a stack's micro-batch splits in one `estimate_many` call); `skipped`: "
        "combinations not estimated because a smaller one already failed or a faster split of "
        "the same stack already fits; `confirmed`: trace-engine estimates.",
        "",
        "| case | confirm | wall s | search s | trace s | combinations | estimated | skipped "
        "| confirmed | recommended |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['confirm']} | {r['wall_s']:.2f} | {r['search_s']:.2f} | "
            f"{r['confirm_s']:.1f} | {r['n_candidates']} | {r['n_estimated']} | {r['n_pruned']} | "
            f"{r['n_confirmed']} | {r['plan']} |"
        )
    OUTPUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
