"""Peak memory and time of `memfit snapshot` on large snapshots, whole vs streamed.

.venv/bin/python benchmarks/snapshot_memory.py [--mb 300]

Writes synthetic snapshots (memfit.snapshot.generate.write_synthetic_snapshot: torch's layout,
a training-loop trace with 120 call sites of 24 frames) of about 30 MB and about ``--mb`` MB, then
analyses each in a fresh process with each reader and records the process's peak RSS above its
RSS after imports (``VmHWM`` - ``VmRSS`` from /proc/self/status, Linux) and the wall time.
Results: benchmarks/results/snapshot_memory.md.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memfit.snapshot.generate import write_synthetic_snapshot

RESULTS = Path(__file__).resolve().parent / "results" / "snapshot_memory.md"
BYTES_PER_STEP = 79_000  # measured: 60 steps -> 4.76 MB

_CHILD = """
import sys, time
from memfit.snapshot import analyze_snapshot

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

before = status("VmRSS:")
t = time.perf_counter()
a = analyze_snapshot(sys.argv[1], stream=sys.argv[2] == "stream")
print(status("VmHWM:") - before, time.perf_counter() - t, a.devices[0].n_events)
"""


def measure(path: Path, reader: str) -> tuple[int, float, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), reader],
        capture_output=True,
        text=True,
        check=True,
    )
    rss, wall, n = out.stdout.split()
    return int(rss), float(wall), int(n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (30, args.mb):
            path = Path(tmp) / f"snap{mb}.pickle"
            t = time.perf_counter()
            write_synthetic_snapshot(path, n_steps=mb * 1_000_000 // BYTES_PER_STEP)
            print(f"wrote {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t:.0f} s")
            for reader in ("stream", "whole"):
                rss, wall, n = measure(path, reader)
                rows.append((path.stat().st_size, n, reader, rss, wall))
                print(rows[-1], flush=True)
    lines = [
        "# Snapshot analysis: peak memory, whole vs streamed",
        "",
        "`.venv/bin/python benchmarks/snapshot_memory.py` on "
        f"{platform.machine()} / Python {platform.python_version()}. "
        "Synthetic snapshots in torch's "
        "layout (`write_synthetic_snapshot`). Peak RSS: the analysing process's high-water mark "
        "above its RSS after imports.",
        "",
        "| file | events | reader | peak RSS above baseline | RSS / file | wall |",
        "| ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for size, n, reader, rss, wall in rows:
        lines.append(
            f"| {size / 1e6:.0f} MB | {n:,} | {reader} | {rss / 2**20:,.0f} MiB | "
            f"{rss / size:.2f} | {wall:.1f} s |"
        )
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
