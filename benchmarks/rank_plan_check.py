"""The plans a derived search shows in the ZeRO / offload tier against the full trace (issue 11):
`plan` on the Qwen3-8B-shaped config of ``fastpath_speed.py`` (no analytic program; on an L4
only ZeRO-3 with its parameters offloaded fits), then the recommended plan and every runner-up
re-estimated by the trace engine at its own workload. Peak allocated, peak reserved, device-used
and host bytes are printed side by side with the relative difference (the issue's bound: 1 %;
a derived form gives the trace's bytes, so 0 is expected). Writes
``benchmarks/results/rank_plan_check.md``.

    MEMFIT_CACHE_DIR=... PYTHONPATH=src python benchmarks/rank_plan_check.py [--layers 36]

Run it with the form cache a `plan` of the same config left (else the search builds the forms).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes", "host_memory_bytes")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=36)
    args = parser.parse_args()
    from fastpath_speed import QWEN3_8B_SHAPE

    import memfit
    from memfit.estimate.policy import run_engine
    from memfit.hardware import get_gpu
    from memfit.models import resolve_model
    from memfit.plan import PlanRequest

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(
        json.dumps({**QWEN3_8B_SHAPE, "num_hidden_layers": args.layers})
    )
    source = resolve_model(str(folder))
    request = PlanRequest(mode="train", seq_len=4096, global_batch=32)
    started, cpu0 = time.perf_counter(), time.process_time()
    result = memfit.plan(source, request, gpu="L4")
    plan_s = (time.perf_counter() - started, time.process_time() - cpu0)
    shown = [p for p in [result.recommended, *result.alternatives] if p is not None]
    rows = []
    worst = 0.0
    for option in shown:
        assert option.estimate is not None
        t0 = time.perf_counter()
        traced = run_engine("trace", source, option.workload, get_gpu("L4"))
        trace_s = time.perf_counter() - t0
        for field in FIELDS:
            got, want = getattr(option.estimate, field), getattr(traced, field)
            rel = abs(got - want) / max(want, 1)
            worst = max(worst, rel)
            rows.append(
                f"| {option.settings.describe()} | {option.estimate.engine} | {field} | {got} "
                f"| {want} | {rel:.2%} | {trace_s:.0f} |"
            )
    load = os.getloadavg()[0]
    ru = resource.getrusage(resource.RUSAGE_SELF)
    lines = [
        "# Rank-form plans against the full trace (issue 11)",
        "",
        f"Written by `PYTHONPATH=src python benchmarks/rank_plan_check.py --layers {args.layers}` "
        f"({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; 1-minute load {load:.1f}, "
        f"process CPU {ru.ru_utime + ru.ru_stime:.0f} s). `plan` (Qwen3-8B shape, L4, seq "
        f"4096, global batch 32) took {plan_s[0]:.1f} s wall / {plan_s[1]:.1f} s CPU in this "
        f"process; worst relative difference {worst:.2%}.",
        "",
        "| plan | engine | field | plan's estimate | full trace | difference | trace s |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    out = ROOT / "benchmarks" / "results" / "rank_plan_check.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
