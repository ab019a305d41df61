"""memfit's SGLang start-up simulation against published SGLang start-up logs.

Data: benchmarks/data/sglang_logs.jsonl (one log per line, with its source URL, the SGLang
version, the model, GPU, flags and the figures the log printed). For each log, two predictions of
``max_total_num_tokens``: end to end (memfit's GPU total and context), and given the log's own
"Load weight begin. avail mem" (so only the weights, the cell size and SGLang's formula are
tested). Weights are compared where the log prints "mem usage" at load end.

    PYTHONPATH=src python benchmarks/sglang_logs.py [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memfit.hardware.catalog import get_gpu
from memfit.models import ModelSpec, resolve_model
from memfit.serving.sglang import simulate_sglang
from memfit.spec.sglang import SglangConfig
from memfit.units import GiB

DATA = Path(__file__).parent / "data" / "sglang_logs.jsonl"


def _pct(pred: float, logged: float) -> float:
    return round((pred - logged) / logged * 100, 2)


def check(row: dict[str, Any]) -> dict[str, Any]:
    """One log's comparison: predicted vs logged, percent errors."""
    spec = (
        ModelSpec.from_config(row["config"])
        if "config" in row
        else resolve_model(row["model"]).spec
    )
    gpu = get_gpu(row["gpu"])
    config = SglangConfig(**row["flags"])
    logged = row["logged"]
    out: dict[str, Any] = {"id": row["id"], "source": row["source"]}
    e2e = simulate_sglang(spec, gpu, config)
    out["tokens_logged"] = logged["tokens"]
    out["tokens_e2e"] = e2e.max_total_num_tokens
    out["tokens_e2e_err_pct"] = _pct(e2e.max_total_num_tokens, logged["tokens"])
    cell_half = e2e.cell_size_bytes / 2 if e2e.kv_kind == "mha" else e2e.cell_size_bytes
    k_pred = (logged["tokens"] + 1) * cell_half / GiB
    out["k_size_err_pct_at_logged_tokens"] = _pct(k_pred, logged["k_size_gb"])
    if "load_begin_avail_gb" in logged:
        before = logged["load_begin_avail_gb"] * GiB
        context = logged.get("context_gb", 0.75) * GiB
        given = simulate_sglang(
            spec, gpu, config, total_bytes=int(before + context), context_bytes=int(context)
        )
        out["tokens_given_avail"] = given.max_total_num_tokens
        out["tokens_given_avail_err_pct"] = _pct(given.max_total_num_tokens, logged["tokens"])
    if "graph_mem_gb" in logged:
        out["graph_err_pct"] = _pct(e2e.cuda_graph_bytes / GiB, logged["graph_mem_gb"])
    if "weights_gb" in logged:
        out["weights_err_pct"] = _pct(e2e.loaded_bytes / GiB, logged["weights_gb"])
    if "excluded" in row:
        out["excluded"] = row["excluded"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    results = [check(r) for r in rows]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        "| log | tokens logged | memfit (end to end) | memfit (given logged avail) "
        "| K size | weights | CUDA graphs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        given = (
            f"{r['tokens_given_avail']:,} ({r['tokens_given_avail_err_pct']:+.2f} %)"
            if "tokens_given_avail" in r
            else "—"
        )
        weights = f"{r['weights_err_pct']:+.2f} %" if "weights_err_pct" in r else "—"
        graphs = f"{r['graph_err_pct']:+.1f} %" if "graph_err_pct" in r else "—"
        name = f"[{r['id']}]({r['source']})" + (" (excluded)" if "excluded" in r else "")
        print(
            f"| {name} | {r['tokens_logged']:,} | {r['tokens_e2e']:,} "
            f"({r['tokens_e2e_err_pct']:+.2f} %) | {given} | "
            f"{r['k_size_err_pct_at_logged_tokens']:+.2f} % | {weights} | {graphs} |"
        )


if __name__ == "__main__":
    main()
