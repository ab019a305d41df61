"""Published per-GPU memory of multi-GPU training runs against memfit's per-rank estimate.

    PYTHONPATH=src .venv/bin/python benchmarks/multigpu_points.py            # markdown table
    PYTHONPATH=src .venv/bin/python benchmarks/multigpu_points.py --json     # one JSON per point

Points: ``benchmarks/data/multigpu_published.jsonl``, one JSON line each with ``source`` (URL with
the table/row), ``framework``, ``version``, ``model`` (a bundled memfit name), ``gpus``,
``layout`` {dp, fsdp, tp, pp, cp, ep}, ``precision``, ``micro_batch``, ``seq``,
``checkpointing``, ``measured_gib`` and ``metric`` (allocated | reserved | device: what the source
logged). Optional flags a point may carry: ``compile``, ``float8`` (torchao Float8 linears:
memfit's ``--float8 tensorwise``; every such point also ran torch.compile, which memfit does not
model, so none is compared yet).

A point is *expressible* when memfit has every setting it names; otherwise the table says which
setting is missing and no error is computed (an estimate of another job is no evidence). The
estimate is the analytic engine's (seconds per point; the trace engine of an 8B model takes
minutes on this machine). Error = (estimate - measured) / measured on the point's metric.
torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``: every other matmul
output saved) runs as memfit's ``selective-op``, the same policy (``--before`` runs it as
``selective``, every matmul output saved: the table of docs/accuracy.md before this policy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memfit import WorkloadSpec, estimate
from memfit.estimate.parallel import estimate_parallel
from memfit.hardware.catalog import get_gpu
from memfit.models import resolve_model
from memfit.spec import EstimateOptions

DATA = Path(__file__).resolve().parent / "data" / "multigpu_published.jsonl"
GIB = 2**30
#: memfit's nearest checkpointing for the sources' names
CHECKPOINTING = {
    "none": "none",
    "full": "full",
    "selective": "selective",
    "selective-op": "selective-op",
}
#: ``--before``: the policy those points ran under before memfit had torchtitan's op SAC.
BEFORE_CHECKPOINTING = {**CHECKPOINTING, "selective-op": "selective"}
#: The catalog GPU of each point's (the 96 GB H100 of torchtitan's Grand Teton hosts is not in
#: the catalog; the capacity does not change the estimate).
CLOSED_FORM_GPUS = {"H100 96GB HBM2e": "H100-80GB", "H200": "H200"}
METRIC_FIELD = {
    "allocated": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "device": "device_used_bytes",
}


def load(path: Path = DATA) -> list[dict[str, Any]]:
    """The data-parallel / tensor-parallel points of the shared file; the pipeline, context and
    expert-parallel ones are benchmarks/multigpu_parallel.py's (closed form: parallel)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if not any(r["layout"].get(k, 1) > 1 for k in ("pp", "cp", "ep"))]


def missing(point: dict[str, Any]) -> list[str]:
    """Settings of ``point`` memfit cannot express (empty: expressible)."""
    lay = point["layout"]
    out = [f"{k} {lay[k]}" for k in ("pp", "cp", "ep") if lay.get(k, 1) > 1]
    if point.get("compile"):
        out.append("torch.compile")
    return out


def workload(point: dict[str, Any], *, before: bool = False) -> WorkloadSpec:
    lay = point["layout"]
    ckpt = (BEFORE_CHECKPOINTING if before else CHECKPOINTING)[point["checkpointing"]]
    fsdp, dp, tp = lay.get("fsdp", 1), lay.get("dp", 1), lay.get("tp", 1)
    shard = "fsdp" if fsdp > 1 else ("ddp" if dp > 1 else "none")
    return WorkloadSpec(
        batch_size=point["micro_batch"],
        seq_len=point["seq"],
        precision="bf16-mixed",
        checkpointing=ckpt,
        gpus=point["gpus"],
        tp=tp,
        shard=shard,
        dp_replicate=dp if fsdp > 1 and dp > 1 else 1,
        # torchtitan's TP plan always shards the sequence between the blocks (apply_tp)
        sequence_parallel=tp > 1 and point["framework"] == "torchtitan",
        # torchtitan's Float8 of 2024-12 was dynamic tensorwise scaling (``float8.recipe_name``
        # came later); whether its runs all-gathered in fp8 is not stated: not assumed
        float8="tensorwise" if point.get("float8") else "none",
    )


def run(point: dict[str, Any], *, before: bool = False, closed: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {k: point[k] for k in ("id", "model", "gpus", "measured_gib", "metric")}
    row["missing"] = missing(point)
    if row["missing"]:
        return row
    wl = workload(point, before=before)
    if closed:  # the per-rank closed form of memfit.estimate.parallel, on the point's GPU
        source, gpu = resolve_model(point["model"]), get_gpu(CLOSED_FORM_GPUS[point["gpu"]])
        est = estimate_parallel(source, wl, gpu=gpu)
    else:
        est = estimate(point["model"], wl, options=EstimateOptions(engine="analytic"))
    predicted = getattr(est, METRIC_FIELD[point["metric"]]) / GIB
    row["predicted_gib"] = round(predicted, 2)
    row["error"] = round(predicted / point["measured_gib"] - 1, 4)
    return row


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| point | model | GPUs | metric | measured GiB | memfit GiB | error |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r["missing"]:
            tail = f"- | not expressible: {', '.join(r['missing'])} |"
        else:
            tail = f"{r['predicted_gib']:.1f} | {r['error']:+.1%} |"
        lines.append(
            f"| {r['id']} | {r['model']} | {r['gpus']} | {r['metric']} | "
            f"{r['measured_gib']:.1f} | {tail}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON line per point")
    parser.add_argument(
        "--before", action="store_true", help="torchtitan's op SAC run as memfit's selective"
    )
    parser.add_argument(
        "--closed-form",
        action="store_true",
        help="answer with the per-rank closed form (memfit.estimate.parallel) instead",
    )
    args = parser.parse_args(argv)
    rows = [run(p, before=args.before, closed=args.closed_form) for p in load()]
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
