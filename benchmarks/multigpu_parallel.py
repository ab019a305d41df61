"""The parallel closed form against published per-rank memory of pp / cp / ep jobs.

Reads ``benchmarks/data/multigpu_published.jsonl`` (one published point per line, with its source,
framework and version; shared with the FSDP / DeepSpeed / TP rows, which other scripts check),
keeps the points whose layout has ``pp``, ``cp`` or ``ep`` > 1, estimates each with
:func:`memfit.estimate.parallel.estimate_parallel` — the engine ``memfit estimate`` routes those
jobs to — and compares the metric the source measured (``allocated``:
``max_memory_allocated``, ``reserved``: ``max_memory_reserved``, ``device``: nvidia-smi).
torchtitan runs tensor parallelism with sequence parallelism, so its points are estimated with
it; the runs whose notes say torch.compile + Float8 (:data:`RAN_COMPILED_FLOAT8`) with
``--float8 tensorwise --compile``, and those of the tables run with AsyncTP
(:data:`RAN_ASYNC_TP`) with ``--async-tp``. Writes ``benchmarks/results/multigpu_parallel.md``
(the table quoted in docs/accuracy.md).

    .venv/bin/python benchmarks/multigpu_parallel.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "multigpu_published.jsonl"
OUTPUT = ROOT / "benchmarks" / "results" / "multigpu_parallel.md"
#: Models not bundled with memfit: their config.json in the repository.
MODEL_PATHS = {"llama-3.1-405b": "benchmarks/configs/llama-3.1-405b/config.json"}
#: How each framework holds the data-parallel ranks' states in these runs: torchtitan FSDP2;
#: Megatron's --use-distributed-optimizer (memfit's zero1).
SHARD = {"torchtitan": "fsdp", "megatron-lm": "zero1"}
METRIC = {
    "allocated": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "device": "device_used_bytes",
}
#: The GPU a point ran on, as memfit's catalog names it (the 96 GB H100 of torchtitan's
#: Grand Teton hosts is not in the catalog; the capacity does not change the estimate).
GPUS = {"H100-96GB": "H100-80GB", "H800-80GB": "H100-80GB"}


#: What torchtitan's published pp / cp runs ran beside their layout: Tables 2, 5 and 6 of
#: torchtitan's docs/performance.md (eaea6f6; benchmarks/llama3_h100_202412_torchtitan.md at
#: b5bcd76) are "torch.compile + Float8" runs, which their rows' notes say; torchao eab345c's
#: Float8 training had one recipe, tensorwise. Estimated as such since the closed form models
#: both (before: without them). A row's own ``float8`` / ``compile`` fields win.
RAN_COMPILED_FLOAT8 = "torch.compile + Float8"


def ran_compiled_float8(row: dict[str, Any]) -> bool:
    return RAN_COMPILED_FLOAT8 in row.get("notes", "")


#: The tables of that page whose captions add "+ AsyncTP" (Tables 5 and 6: "torch.compile +
#: Float8 + AsyncTP"); their rows are estimated with ``--async-tp``. Its SymmetricMemory
#: workspace is outside the caching allocator, so the reserved figure these rows measured does
#: not move; the device figure would. A row's own ``async_tp`` field wins.
RAN_ASYNC_TP = ("(Table 5:", "(Table 6:")


def ran_async_tp(row: dict[str, Any]) -> bool:
    return row["layout"].get("tp", 1) > 1 and any(t in row["source"] for t in RAN_ASYNC_TP)


def in_scope(row: dict[str, Any]) -> bool:
    lay = row["layout"]
    return any(lay.get(k, 1) > 1 for k in ("pp", "cp", "ep"))


def workload(row: dict[str, Any]) -> Any:
    from memfit.spec import WorkloadSpec

    lay = row["layout"]
    dp = lay.get("dp", 1) * lay.get("fsdp", 1)
    return WorkloadSpec(
        gpus=row["gpus"],
        tp=lay.get("tp", 1),
        pp=lay.get("pp", 1),
        cp=lay.get("cp", 1),
        ep=lay.get("ep", 1),
        pp_schedule=lay.get("pp_schedule", "1f1b"),
        pp_virtual_stages=lay.get("pp_virtual_stages", 1),
        shard=SHARD[row["framework"]] if dp * lay.get("cp", 1) > 1 else "none",
        batch_size=row["micro_batch"],
        grad_accum=row.get("micro_batches", 1),
        seq_len=row["seq"],
        precision=row["precision"],
        checkpointing=row["checkpointing"],
        attention="flash",
        float8="tensorwise" if row.get("float8", ran_compiled_float8(row)) else "none",
        compile=bool(row.get("compile", ran_compiled_float8(row))),
        sequence_parallel=row["framework"] == "torchtitan" and lay.get("tp", 1) > 1,
        async_tp=bool(row.get("async_tp", ran_async_tp(row))),
    )


def estimate_of(row: dict[str, Any]) -> Any:
    """The closed form's MemoryEstimate of ``row`` (benchmarks/calibrate_uncertainty.py fits the
    per-rank band on it)."""
    from memfit.estimate.parallel import estimate_parallel
    from memfit.hardware.catalog import get_gpu
    from memfit.models import resolve_model

    path = MODEL_PATHS.get(row["model"])
    source = resolve_model(str(ROOT / path) if path else row["model"])
    gpu = get_gpu(GPUS.get(row["gpu"], row["gpu"]))
    return estimate_parallel(
        source, workload(row), gpu=gpu, sequence_parallel=row["framework"] == "torchtitan"
    )


def estimate(row: dict[str, Any]) -> float:
    return float(getattr(estimate_of(row), METRIC[row["metric"]])) / 2**30


def label(row: dict[str, Any]) -> str:
    """``llama-3.1-405b fsdp 8 x tp 8 x pp 8 1f1b, 4 x 8, seq 8192``: a point's name."""
    lay = row["layout"]
    layout = " x ".join(f"{k} {lay[k]}" for k in ("dp", "fsdp", "tp", "pp", "cp", "ep")
                        if lay.get(k, 1) > 1)  # fmt: skip
    sched = f" {lay.get('pp_schedule', '1f1b')}" if lay.get("pp", 1) > 1 else ""
    return (
        f"{row['model']} {layout}{sched}, {row['micro_batch']} x {row.get('micro_batches', 1)}, "
        f"seq {row['seq']}"
    )


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line]
    points = [r for r in rows if in_scope(r)]
    table, errors = [], []
    for r in points:
        got = estimate(r)
        err = (got - r["measured_gib"]) / r["measured_gib"] * 100
        errors.append(err)
        lay = r["layout"]
        layout = " x ".join(f"{k} {lay[k]}" for k in ("dp", "fsdp", "tp", "pp", "cp", "ep")
                            if lay.get(k, 1) > 1)  # fmt: skip
        sched = lay.get("pp_schedule", "") if lay.get("pp", 1) > 1 else ""
        table.append(
            f"| {r['framework']} | {r['model']} | {r['gpus']} | {layout} {sched} | "
            f"{r['micro_batch']} x {r.get('micro_batches', 1)} | {r['seq']} | "
            f"{r['checkpointing']} | {r['metric']} | {r['measured_gib']:.1f} | {got:.1f} | "
            f"{err:+.1f} % |"
        )
    abs_err = [abs(e) for e in errors]
    lines = [
        "# Pipeline, context and expert parallelism: estimate vs published per-rank memory",
        "",
        "`python benchmarks/multigpu_parallel.py` — every point of "
        "`benchmarks/data/multigpu_published.jsonl` with pp, cp or ep > 1 (sources, versions and "
        "what each measured are in that file), estimated by the parallel closed form "
        "(`memfit.estimate.parallel`, what `memfit estimate --pp/--cp/--ep` answers with). "
        "torchtitan's runs with torch.compile + Float8 (+ AsyncTP: Tables 5 and 6) are "
        "estimated with `--compile --float8 tensorwise` (`--async-tp`, whose SymmetricMemory "
        "workspace lies outside the reserved figure these rows measured).",
        "",
        "| framework | model | GPUs | layout | micro-batch x count | seq | ckpt | metric "
        "| measured GiB | memfit GiB | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *table,
        "",
        f"Points: {len(errors)}. Median |error|: {statistics.median(abs_err):.1f} %. "
        f"Worst under-prediction: {min(errors):+.1f} %. Worst over-prediction: "
        f"{max(errors):+.1f} %.",
    ]
    OUTPUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
