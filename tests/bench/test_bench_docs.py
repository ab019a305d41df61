"""docs/bench.md quotes the generated results table, line for line."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_doc_quotes_the_generated_cpu_table() -> None:
    generated = (ROOT / "benchmarks/results/bench_cpu.md").read_text()
    doc = (ROOT / "docs/bench.md").read_text()
    rows = [line for line in generated.splitlines() if line.startswith("| ")]
    assert len(rows) >= 3 and all(line in doc for line in rows)


def test_the_cpu_results_meet_the_done_criteria_they_claim() -> None:
    res = json.loads((ROOT / "benchmarks/results/bench_cpu.json").read_text())
    rows = {r["name"]: r for r in res["rows"]}
    assert res["device"] == "cpu" and rows["combined"]["reduction_factor"] >= 4
    for name in ("sdpa", "bf16", "checkpointing", "lora", "freeze", "adamw-8bit", "int8"):
        assert rows[name]["error"] is None, name
        assert abs(rows[name]["prediction_error"]) < 0.02, name
    # The documented gap (docs/bench.md): bitsandbytes' CPU int8 kernels in bf16 allocate more
    # than the CUDA path the estimator models; when explained, tighten this bound.
    assert abs(rows["combined"]["prediction_error"]) < 0.07
