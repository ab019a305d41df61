"""Speed and host memory of the trace engine on large models (a benchmark, not a test).

Each case runs in a fresh subprocess so the import time and peak RSS are its own. Writes
``benchmarks/results/trace_speed.md`` (quoted in docs/accuracy.md and README).

    .venv/bin/python benchmarks/trace_speed.py
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "trace_speed.md"
#: (model, extra CLI flags): the issue's targets, Llama-2 shapes, batch 1, seq 4096, bf16, AdamW.
CASES = [
    ("llama-2-7b", []),
    ("llama-2-7b", ["--extrapolate"]),
    ("llama-2-70b", []),
    ("llama-2-70b", ["--no-extrapolate"]),
    ("llama-3.1-8b", ["--mode", "infer", "--new-tokens", "128"]),
]
CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from memfit.flags import workload_from_args
from memfit.cli.entry import build_parser
import memfit, torch, transformers
t_import = time.perf_counter() - t0
args = build_parser().parse_args(["estimate", *sys.argv[1:]])
t1 = time.perf_counter()
est = memfit.estimate(args.model, workload_from_args(args), extrapolate=args.extrapolate)
t_trace = time.perf_counter() - t1
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"import_s": t_import, "trace_s": t_trace, "max_rss_mb": rss_mb,
                  "extrapolated": est.trace.get("extrapolated"),
                  "peak_allocated_gib": est.peak_allocated_bytes / 2**30,
                  "peak_reserved_gib": est.peak_reserved_bytes / 2**30}))
"""


def run(model: str, flags: list[str]) -> dict:
    argv = [model, "--batch", "1", "--seq", "4096", "--precision", "bf16", *flags]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=True
    )
    return {"args": " ".join(argv), **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    rows = [run(model, flags) for model, flags in CASES]
    lines = [
        "# Trace engine speed",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}; `.venv/bin/python benchmarks/trace_speed.py`. "
        "Time to estimate (model build + trace + allocator replay) excludes the imports, shown "
        "apart; max RSS is the whole process.",
        "",
        "| memfit estimate … | extrapolated | imports | estimate | max RSS | peak allocated "
        "| peak reserved |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['args']}` | {r['extrapolated']} | {r['import_s']:.1f} s | {r['trace_s']:.1f} s "
            f"| {r['max_rss_mb']:.0f} MB | {r['peak_allocated_gib']:.2f} GiB "
            f"| {r['peak_reserved_gib']:.2f} GiB |"
        )
    OUTPUT.write_text("\n".join(lines) + "\n")
    print(OUTPUT.read_text())


if __name__ == "__main__":
    main()
