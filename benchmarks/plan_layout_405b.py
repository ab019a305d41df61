"""Cold-process latency of ``memfit plan`` choosing a 405B layout on 1,024 GPUs (a benchmark).

Runs ``python -m memfit plan benchmarks/configs/llama-3.1-405b/config.json --gpus 1024
--global-batch 1024 --seq 8192 --gpu H100 --json`` as a fresh process (imports included, the way
a user runs it) and records its wall time and the layout it picks. The target (issue 30): at most
60 s. Writes ``benchmarks/results/plan_layout_405b.md``.

    .venv/bin/python benchmarks/plan_layout_405b.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layout_405b import memfit_json  # noqa: E402  (the one cold-process runner)

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "plan_layout_405b.md"
CONFIG = "benchmarks/configs/llama-3.1-405b/config.json"
TARGET_S = 60.0
ARGS = ["--gpus", "1024", "--global-batch", "1024", "--seq", "8192", "--gpu", "H100", "--json"]


def run() -> tuple[float, dict[str, object]]:
    return memfit_json(["plan", CONFIG, *ARGS])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    walls, out = [], {}
    for _ in range(args.repeat):
        wall, out = run()
        walls.append(wall)
    best: dict = out["best"] or {}  # type: ignore[assignment]
    pick = (
        f"dp {best['dp']} x tp {best['tp']} x pp {best['pp']} ({best['pp_schedule']}) x cp "
        f"{best['cp']}, {best['shard']}, micro-batch {best['micro_batch']} x "
        f"{best['grad_accum']}, {best['checkpointing']} checkpointing; predicted step "
        f"{best['step_s']:.1f} s, device {best['device_used_bytes'] / 2**30:.1f} GiB"
        if best
        else "none fits"
    )
    lines = [
        "# `memfit plan` for a 405B job on 1,024 GPUs: cold-process latency",
        "",
        f"`python benchmarks/plan_layout_405b.py --repeat {args.repeat}` — "
        f"`memfit plan {CONFIG} {' '.join(ARGS)}`: Llama 3.1 405B, every dp x tp x pp "
        "(1F1B, interleaved, ZBV, DualPipeV) x cp layout x FSDP / distributed optimizer x "
        "micro-batch x checkpointing priced by the step-time model, per-rank memory estimated in "
        f"order of step time. Target: <= {TARGET_S:.0f} s per cold process.",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (shared development machine).",
        "",
        "| worst wall (s) | best wall (s) | layouts priced | memory estimates | within target |",
        "|---|---|---|---|---|",
        f"| {max(walls):.2f} | {min(walls):.2f} | {out['n_layouts']} | {out['n_estimated']} | "
        f"{'yes' if max(walls) <= TARGET_S else 'NO'} |",
        "",
        f"Pick: {pick}.",
    ]
    OUTPUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0 if max(walls) <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
