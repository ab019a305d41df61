"""Cold-process latency of a 405B job in a 4D layout (a benchmark, not a test).

Runs ``python -m memfit estimate`` as a fresh process (imports included, the way a user runs
it) on Llama 3.1 405B (``benchmarks/configs/llama-3.1-405b/config.json``) over 1,024 GPUs as
dp 8 x tp 8 x pp 8 x cp 2 under several pipeline schedules, ``--json``, and records the wall
time of each run. The target (issue 30): at most 10 s. Writes
``benchmarks/results/layout_405b.md``.

    .venv/bin/python benchmarks/layout_405b.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "layout_405b.md"
CONFIG = "benchmarks/configs/llama-3.1-405b/config.json"
TARGET_S = 10.0
BASE = [
    *("--gpus", "1024", "--tp", "8", "--pp", "8", "--cp", "2", "--seq", "8192"),
    *("--grad-accum", "16", "--batch", "1", "--shard", "fsdp", "--checkpointing", "full"),
    *("--attention", "flash", "--gpu", "H100", "--json"),
]
SCHEDULES = {
    "1f1b": [],
    "interleaved-1f1b x 2": ["--pp-schedule", "interleaved-1f1b", "--pp-virtual-stages", "2"],
    "zbv": ["--pp-schedule", "zbv"],
    "dualpipev": ["--pp-schedule", "dualpipev"],
}


def run(extra: list[str]) -> tuple[float, dict[str, object]]:
    return memfit_json(["estimate", CONFIG, *BASE, *extra])


def memfit_json(argv: list[str]) -> tuple[float, dict[str, object]]:
    """``memfit ARGV --json`` as a cold process from the checkout: its wall time and answer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "memfit", *argv]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"memfit failed ({done.returncode}): {done.stderr.strip()}")
    return wall, json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name, extra in SCHEDULES.items():
        walls = []
        for _ in range(args.repeat):
            wall, out = run(extra)
            walls.append(wall)
        par = out["trace"]["parallel"]  # type: ignore[index]
        rows.append((name, max(walls), min(walls), out, par))
    lines = [
        "# 405B in a 4D layout: cold-process latency",
        "",
        f"`python benchmarks/layout_405b.py --repeat {args.repeat}` — Llama 3.1 405B, 1,024 GPUs "
        "as dp 8 x tp 8 x pp 8 x cp 2, seq 8192, micro-batch 1, 16 micro-batches, FSDP, full "
        f"checkpointing, H100-80GB, `--json`. Target: <= {TARGET_S:.0f} s per cold process.",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (shared development machine).",
        "",
        "| schedule | worst wall (s) | best wall (s) | peak pp rank | peak allocated (GiB) "
        "| device used (GiB) | within target |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, worst, best, out, par in rows:
        lines.append(
            f"| {name} | {worst:.2f} | {best:.2f} | {par['peak_pp_rank']} | "  # type: ignore[index]
            f"{out['peak_allocated_bytes'] / 2**30:.2f} | "  # type: ignore[operator]
            f"{out['device_used_bytes'] / 2**30:.2f} | "  # type: ignore[operator]
            f"{'yes' if worst <= TARGET_S else 'NO'} |"
        )
    OUTPUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0 if all(r[1] <= TARGET_S for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
