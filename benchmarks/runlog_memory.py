"""Peak RSS of reading a large run log: `memfit diagnose` and `memfit report` on a generated log.

    PYTHONPATH=src python benchmarks/runlog_memory.py --mb 200 [--baseline-src /path/to/old/src]

Writes a log of step records (one step every ~330 bytes, as memfit.Monitor writes them) of about
``--mb`` MB, runs each command in a fresh process and reads its peak RSS (``ru_maxrss`` of the
child, Linux: KiB). ``--baseline-src`` runs the same commands with another checkout's ``src`` (the
reader before streaming) for the before/after figures. Results: benchmarks/results/runlog_memory.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "runlog_memory.md"


def write_log(path: Path, target_bytes: int) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from memfit.monitor.log import encode, record

    start = record(
        "start", memfit_version="bench", device="cuda:0", device_name="bench",
        device_total_bytes=80 * 2**30, pid=1, argv=["train.py"], estimate=None,
    )  # fmt: skip
    n = 0
    with path.open("wb") as f:
        f.write(encode(start))
        size = 0
        while size < target_bytes:
            n += 1
            rec = record(
                "step", step=n, step_time_s=0.1234, tokens=4096, samples=8,
                tokens_per_s=33191.2, samples_per_s=64.8, allocated_bytes=2**30 + n % 4096,
                peak_allocated_bytes=2**31 + n % 8192, reserved_bytes=3 * 2**30,
                peak_reserved_bytes=3 * 2**30, device_used_bytes=4 * 2**30,
                utilization_pct=97.0, rss_bytes=5 * 2**30,
            )  # fmt: skip
            line = encode(rec)
            f.write(line)
            size += len(line)
    return n


def peak_rss(argv: list[str], src: Path) -> tuple[float, float, int]:
    """(peak RSS MiB, wall seconds, exit code) of ``python -m memfit ARGV`` with ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = (
        "import resource, runpy, sys\n"
        f"sys.argv = ['memfit', *{argv!r}]\n"
        "try:\n    runpy.run_module('memfit', run_name='__main__')\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "print('RSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    )
    t0 = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    kib = next((int(x.split()[1]) for x in run.stderr.splitlines() if x.startswith("RSS_KIB")), -1)
    return kib / 1024, wall, run.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--baseline-src", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "run.jsonl"
        n = write_log(log, int(args.mb * 1e6))
        size_mb = log.stat().st_size / 1e6
        rows = []
        for name, argv in (
            ("diagnose", ["diagnose", str(log), "--json"]),
            ("report", ["report", str(log), "-o", str(Path(tmp) / "r.html")]),
        ):
            for label, src in (
                ("streamed (this tree)", ROOT / "src"),
                ("before", args.baseline_src),
            ):
                if src is None:
                    continue
                mib, wall, rc = peak_rss(argv, src)
                rows.append(f"| {name} | {label} | {mib:,.0f} MiB | {wall:.1f} s | {rc} |")
    text = "\n".join(
        [
            "# Peak RSS reading a run log",
            "",
            f"Generated log: {size_mb:.0f} MB, {n:,} step records. Command:",
            f"`PYTHONPATH=src python benchmarks/runlog_memory.py --mb {args.mb:g}"
            + (f" --baseline-src {args.baseline_src}`" if args.baseline_src else "`"),
            "",
            "| command | reader | peak RSS | wall | exit |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
