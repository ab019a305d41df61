"""The analytic engine's reserved-bytes band per job class, fitted to the fast-path grid (issue 32).

The analytic engine knows the peak allocated bytes, not the allocation order, so its reserved
bytes are a ratio of them (``estimate/analytic/reserved.py``). The default engine settles a
verdict without a trace only where the verdict holds at the top of that ratio's validated band
(``estimate/fastpath.py``, ``verdict_settled``; ``plan --confirm auto``); with one band for all
jobs (the top of 62 calibration cases, allocated x 1.278) almost no plan settled. This script
fits one band per **job class** (the grid's jobs: ``train``, ``lora``, ``ckpt``, ``lora_ckpt``,
``mixed``, ``infer``; ``fastpath.grid_job`` says which a workload is) from the grid's measured
rows, ``benchmarks/results/fastpath_grid.jsonl``: the trace engine's replay of the caching
allocator against the analytic engine's allocated bytes, row by row.

The band's top is ``ratio x allocated + fixed`` (analytic allocated bytes), where

- ``ratio`` is the highest ``covered / analytic allocated`` of the class's rows of at least
  :data:`LARGE_ROW_BYTES` (job-sized: the proportional part of the allocator's overhead,
  fragmentation, is what those rows show), and
- ``fixed`` is the least number of bytes that lifts the line over every other row too (the
  small rows, where the allocator's fixed granularity dominates: 2 MiB small-pool and 20 MiB
  large-pool segments, so a 19 MiB job reserves 24 MiB).

``covered`` is the trace's reserved bytes plus, where the analytic allocated bytes lie above the
trace's, that excess, less the segments the analytic rule adds for FSDP2's root buffers (the
row's ``stranded_bytes``: ``analytic/distributed.py``, ``fsdp_stranded_bytes``; never below the
allocated bytes): the band's top must bound the trace's reserved bytes and its cache bytes
(reserved - allocated, which the verdict's range scales), so every row of the class lies under
it (tests/estimate/analytic/test_reserved_bands.py checks each one). A class with fewer than
:data:`MIN_LARGE_ROWS` job-sized rows gets no band of its own (the wide band applies), nor does
a job of :data:`EXCLUDED` (inference: the grid's short decodes understate full-size jobs). Every
family's rows count, tiny configs and bundled real configs cut to two layers alike; a row
where either engine did not answer is left out.

Writes ``src/memfit/estimate/analytic/reserved_bands.py`` (a generated table; the test
recomputes it from the .jsonl and compares).

    PYTHONPATH=src .venv/bin/python benchmarks/reserved_bands.py
    PYTHONPATH=src .venv/bin/python benchmarks/reserved_bands.py --check   # exit 1 if stale
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "benchmarks" / "results" / "fastpath_grid.jsonl"
OUTPUT = ROOT / "src" / "memfit" / "estimate" / "analytic" / "reserved_bands.py"

#: A row is job-sized from this many analytic allocated bytes: 1 GiB is ~50 of the caching
#: allocator's largest fixed segment (20 MiB, ``kLargeBuffer`` in PyTorch's
#: c10/cuda/CUDACachingAllocator.cpp), so the segment granularity is at most ~2 % of it.
LARGE_ROW_BYTES = 2**30
#: The fewest job-sized rows a class's own band rests on.
MIN_LARGE_ROWS = 3
#: Decimal places of the fitted ratio (rounded up, so the line stays over every row).
RATIO_PLACES = 4
#: Jobs whose grid rows do not stand for the job at full size, with the evidence: no band of
#: their own (the wide one applies).
EXCLUDED = {
    "infer": "the grid decodes 4 tokens after 128: its inference rows reserve at most 1.017 x "
    "their allocated bytes (>= 1 GiB), but full-size inference in "
    "benchmarks/results/analytic_vs_trace.md reaches 1.037 (qwen2.5-7b, 8 x 1024), 1.087 "
    "(llama-3.2-1b) and 1.303 (roberta-base): the KV cache's growth the short decode does not show",
}
EXCLUDED["infer_eager"] = "inference with eager attention: the short decodes, as 'infer'"
EXCLUDED["infer_flash"] = "inference with FlashAttention-2: the short decodes, as 'infer'"
# fp16infer: fp16 inference (a T4 / V100's 16-true) settles on the inference fit as 'infer'
# does (memfit.estimate.analytic.reserved.class_band); its variants on the wide band
EXCLUDED["infer_fp16"] = "fp16 inference: the short decodes, as 'infer'"
EXCLUDED["infer_fp16_eager"] = "fp16 inference with eager attention: as 'infer_eager'"
EXCLUDED["infer_fp16_flash"] = "fp16 inference with FlashAttention-2: as 'infer_flash'"

#: Grid jobs fitted with the job they stand for (``fastpath_grid.JUDGED_AS``): the serving-size
#: inference rows are inference rows.
FOLDED = {
    "infer_long": "infer",
    "infer_long_eager": "infer_eager",
    "infer_long_flash": "infer_flash",
    "infer_long_fp16": "infer_fp16",
    "infer_long_fp16_eager": "infer_fp16_eager",
    "infer_long_fp16_flash": "infer_fp16_flash",
}
#: The LoRA jobs on part of the linear layers: the attention-only and MLP-only rows are fitted
#: with the q,v ones (``fastpath_grid.PART_TARGETS``: the fast path's ``*_part`` job is any
#: targets named by role).
FOLDED.update(
    {
        f"{job}_{suffix}": f"{job}_part"
        for job in ("lora", "lora_ckpt", "lora_held", "lora_ckpt_held", "lora_selckpt_held")
        + (
            "lora_fp16",
            "lora_ckpt_fp16",
            "lora_held_fp16",
            "lora_ckpt_held_fp16",
            "lora_selckpt_held_fp16",
        )
        for suffix in ("part_attn", "part_mlp")
    }
)


@dataclass(frozen=True)
class Point:
    family: str
    origin: str
    allocated_bytes: int  # the analytic engine's
    covered_bytes: int  # what the band's top must reach (module docstring)

    @property
    def ratio(self) -> float:
        return self.covered_bytes / self.allocated_bytes


def latest_rows(lines: list[str]) -> list[dict[str, Any]]:
    """The grid's rows, the last one per (family, origin, job) (a re-measured job replaces its
    earlier row, as ``fastpath_grid._latest`` does)."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for line in lines:
        if line.strip():
            r = json.loads(line)
            rows[(r.get("family", "?"), r.get("origin", "?"), r.get("job", "?"))] = r
    return list(rows.values())


def points(rows: list[dict[str, Any]]) -> dict[str, list[Point]]:
    """job -> the rows where both the analytic engine and the trace answered."""
    out: dict[str, list[Point]] = defaultdict(list)
    for r in rows:
        a, t = r.get("analytic") or {}, r.get("trace") or {}
        if a.get("status") != "ok" or t.get("status") != "ok":
            continue
        if not a.get("allocated_bytes") or not t.get("reserved_bytes"):
            continue
        allocated = int(a["allocated_bytes"])
        excess = max(0, allocated - int(t["allocated_bytes"]))
        # FSDP2's root buffers: the analytic rule adds their segments to the band's top itself
        # (analytic/distributed.py, fsdp_stranded_bytes): the ratio covers the rest
        stranded = int(a.get("stranded_bytes", 0))
        covered = max(int(t["reserved_bytes"]) + excess - stranded, allocated)
        out[FOLDED.get(r["job"], r["job"])].append(
            Point(r["family"], r["origin"], allocated, covered)
        )
    return dict(out)


def fit(pts: list[Point]) -> dict[str, Any] | None:
    """The class's band (module docstring), or None with too few job-sized rows."""
    large = [p for p in pts if p.allocated_bytes >= LARGE_ROW_BYTES]
    if len(large) < MIN_LARGE_ROWS:
        return None
    scale = 10**RATIO_PLACES
    ratio = math.ceil(max(p.ratio for p in large) * scale) / scale
    fixed = max(0, max(math.ceil(p.covered_bytes - ratio * p.allocated_bytes) for p in pts))
    worst = max(large, key=lambda p: p.ratio)
    return {
        "ratio": ratio,
        "fixed_bytes": fixed,
        "low_ratio": math.floor(min(p.ratio for p in pts) * 1000) / 1000,
        "n_rows": len(pts),
        "n_large_rows": len(large),
        "largest_allocated_bytes": max(p.allocated_bytes for p in pts),
        "worst": f"{worst.family} ({worst.origin})",
    }


def bands(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """job -> its band (None: too few job-sized rows), in the grid's job order."""
    by_job = points(rows)
    return {job: None if job in EXCLUDED else fit(by_job[job]) for job in sorted(by_job)}


def render(table: dict[str, dict[str, Any] | None], source: str) -> str:
    lines = [
        '"""The analytic engine\'s reserved-bytes band per job class: GENERATED, do not edit.',
        "",
        "Written by ``benchmarks/reserved_bands.py`` (its docstring: how the band is fitted) from",
        f"``benchmarks/results/fastpath_grid.jsonl`` ({source}); the test",
        "tests/estimate/analytic/test_reserved_bands.py recomputes it from that file and checks",
        "every grid row of each class lies under its band's top. None: the grid has fewer than",
        f"{MIN_LARGE_ROWS} rows of at least {LARGE_ROW_BYTES // 2**20} MiB for that class, or "
        "the script's",
        'EXCLUDED names it (inference): the wide band applies."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        "#: grid job -> top of the band = ratio x analytic allocated bytes + fixed_bytes;",
        "#: low_ratio: the lowest covered / allocated of the class's rows; worst: the row that set",
        "#: the ratio.",
        "BANDS: dict[str, dict[str, Any] | None] = {",
    ]
    for job, band in table.items():
        if band is None:
            lines.append(f"    {json.dumps(job)}: None,")
            continue
        lines.append(f"    {json.dumps(job)}: {{")
        lines += [f"        {json.dumps(k)}: {json.dumps(v)}," for k, v in band.items()]
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def grid_source() -> str:
    """The grid file's last commit (``git log``), or "uncommitted" where it has changes."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    rel = str(GRID.relative_to(ROOT))
    if git("status", "--porcelain", "--", rel).strip():
        return "its working-tree copy"
    commit = git("log", "-1", "--format=%h", "--", rel).strip()
    return f"at commit {commit}" if commit else "its working-tree copy"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the table is not the fit")
    args = p.parse_args(argv)
    table = bands(latest_rows(GRID.read_text(encoding="utf-8").splitlines()))
    if args.check:
        sys.path.insert(0, str(ROOT / "src"))
        from memfit.estimate.analytic.reserved_bands import BANDS

        return 0 if table == BANDS else 1
    OUTPUT.write_text(render(table, grid_source()), encoding="utf-8")
    for job, band in table.items():
        print(f"{job}: {band}")
    print(f"wrote {OUTPUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
