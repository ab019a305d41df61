"""The fast-path grid's FSDP2 rows by GPU count (issues 30 / 32, helper "fsdpmore"): per count,
the rows of bundled configs cut to 2 layers, how many pass the validation's rule (the analytic
allocated bytes within TOLERANCE of the trace's, the top of its reserved range no more than
TOLERANCE under the trace's reserved bytes: ``fastpath_grid.validated_table``), and the ranges
of both errors. Reads ``benchmarks/results/fastpath_grid.jsonl``, the last row of each (config,
job) among those whose ``commit`` starts with ``--commit`` (all rows without it).

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_counts_summary.py --commit eeeb543
    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_counts_summary.py --commit 96d1fbf,051099e
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GRID = ROOT / "benchmarks" / "results" / "fastpath_grid.jsonl"


def count_of(job: str) -> str:
    """The GPUs of an FSDP2 grid job: ``<job>_g<N>`` N, ``<job>_hsdp`` "2x8", else 8."""
    m = re.search(r"_g(\d+)$", job)
    return m.group(1) if m else ("2x8" if job.endswith("_hsdp") else "8")


def summary(rows: list[dict]) -> dict[str, dict]:
    from benchmarks.fastpath_grid import default_answer
    from memfit.estimate.fastpath import TOLERANCE

    out: dict[str, dict] = {}
    for r in rows:
        d = default_answer(r, "high")
        if d is None:
            continue
        t = r["trace"]
        alloc = 100 * (d["allocated_bytes"] / t["allocated_bytes"] - 1)
        top = 100 * (d["reserved_bytes"] / t["reserved_bytes"] - 1)
        ok = abs(alloc) <= 100 * TOLERANCE and top >= -100 * TOLERANCE
        s = out.setdefault(count_of(r["job"]), {"rows": 0, "pass": 0, "alloc": [], "top": []})
        s["rows"] += 1
        s["pass"] += ok
        s["alloc"].append(alloc)
        s["top"].append(top)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", help="comma-separated commit prefixes of the rows read")
    p.add_argument("--grid", default=str(GRID), help="the grid's rows (JSONL)")
    args = p.parse_args(argv)
    prefixes = tuple(args.commit.split(",")) if args.commit else ("",)
    last: dict[tuple[str, str], dict] = {}
    for line in Path(args.grid).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        real = str(r.get("origin", "")).startswith("bundled-")
        if real and "fsdp" in r["job"] and str(r.get("commit", "")).startswith(prefixes):
            last[(r["family"], r["job"])] = r
    order = ["2", "4", "6", "8", "2x8", "12", "16", "24", "32", "64", "128"]
    table = summary(list(last.values()))
    print("| GPUs | rows | pass | allocated vs trace | range top vs trace reserved |")
    print("|---|---|---|---|---|")
    for n in sorted(table, key=lambda k: order.index(k) if k in order else 99):
        s = table[n]
        alloc = f"{min(s['alloc']):+.2f} ... {max(s['alloc']):+.2f} %"
        top = f"{min(s['top']):+.1f} ... {max(s['top']):+.1f} %"
        print(f"| {n} | {s['rows']} | {s['pass']} | {alloc} | {top} |")
    total = sum(s["rows"] for s in table.values())
    print(f"\n{sum(s['pass'] for s in table.values())} of {total} rows pass")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
