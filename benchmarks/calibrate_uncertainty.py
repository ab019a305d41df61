"""Fit the estimate's uncertainty bands per code path on measurements, and report how often the
truth is inside.

Measurements: the H200 runs (``benchmarks/results/gpu_h200_measurements.jsonl``, three metrics per
job), every published record ``benchmarks/accuracy_published.py`` can reproduce, Liger-Kernel's
published LlamaMLP block figures (``benchmarks/published_blocks.py``) and the LitGPT / torchtune
rows of ``benchmarks/results/frameworks_published.jsonl`` (memfit through the framework's own code
and through transformers' model). Each point belongs to the code path of the job that was measured
(memfit.estimate.uncertainty.path_of: the versions it ran, the framework), and
each path's bands are fitted on its own points: the estimate is split into its parts (static,
dynamic, cache, context) and the smallest band fractions that put every measurement above its
estimate, and 95 % of those below, inside their range are found, part by part: static from weight /
model-state records, dynamic from allocated, cache from reserved, context from nvidia-smi. A path
with fewer than ``MIN_POINTS`` points for a part takes the widest band of the paths that have
them. Leave-one-out coverage (refit without a measurement, all its metrics, then test it) is
the honest out-of-sample figure.

The per-rank closed form (``memfit.estimate.parallel``) has its own path, fitted on every published
per-rank point of ``benchmarks/data/multigpu_published.jsonl`` it estimates as the source ran it
(:func:`closed_form_points`): the pp / cp / ep points (``benchmarks/multigpu_parallel.py``) and the
full-training data / tensor-parallel ones (``benchmarks/multigpu_points.py --closed-form``; the
layout search prices such layouts with it). Those points measured a whole figure (torchtitan's max
reserved, Megatron-LM's max allocated), so the path is fitted as one fraction of the figure, every
part the same band (``memfit.estimate.uncertainty.WHOLE_FIGURE_PATHS``), covering every point on
both sides (:data:`WHOLE_FIGURE_COVERAGE`).

    .venv/bin/python benchmarks/calibrate_uncertainty.py
    .venv/bin/python benchmarks/calibrate_uncertainty.py --refresh-closed-form  # those points only

writes ``benchmarks/results/uncertainty.md`` and ``uncertainty_points.jsonl`` (the parts and the
measurement of every point, so the fit can be re-run without tracing).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

from memfit.estimate.uncertainty import (  # noqa: E402
    DYNAMIC_COMPONENTS,
    MIN_POINTS,
    PARTS,
    STATIC_COMPONENTS,
    WHOLE_FIGURE_PATHS,
    estimate_path,
    path_of,
)

#: Report order of the paths (memfit.estimate.uncertainty.PATHS).
PATH_ORDER = ("current-hf", "other-framework", "old-stack", "per-rank-closed-form")
#: Which parts each metric's range is made of (see memfit.estimate.uncertainty.ranges).
METRIC_PARTS = {
    "static": ("static",),
    "allocated": ("static", "dynamic"),
    "reserved": ("static", "dynamic", "cache"),
    "device": ("static", "dynamic", "cache", "context"),
}
#: Bands are rounded up to this step (fractions), so the table reads as round numbers.
STEP = 0.005
#: Share of each path's points per metric a band must cover, below the estimate (``low``) and
#: above it (``high``). Above: all of them — memfit under-predicting causes OOMs, so every
#: measurement above its estimate is inside its path's range. Below (over-prediction, the safe
#: side): 95 %, as a few published points are far off (OPT-350m b4 x 2048 SDPA allocates less
#: than b4 x 1024 in the HF table) and covering them would make the low ends useless. Which points
#: fall outside is listed in the results.
COVERAGE = {"low": 0.95, "high": 1.0}
#: The share a whole-figure path (memfit.estimate.uncertainty.WHOLE_FIGURE_PATHS) covers: all of
#: them on both sides. Its points have no outlier of the kind the 95 % rule drops (the per-rank
#: points lie within -10 % / +12 % of the estimate), and its range's low end is what a layout's
#: smallest per-rank memory is read from.
WHOLE_FIGURE_COVERAGE = {"low": 1.0, "high": 1.0}
#: The versions the H200 runs used (every line of gpu_h200_measurements.jsonl says so).
H200_ENVIRONMENT_KEYS = ("torch", "transformers")

Bands = dict[str, dict[str, tuple[float, float]]]


def parts_of(est: Any) -> dict[str, int]:
    return {
        "static": sum(est.components.get(c, 0) for c in STATIC_COMPONENTS),
        "dynamic": sum(est.components.get(c, 0) for c in DYNAMIC_COMPONENTS),
        "cache": max(est.peak_reserved_bytes - est.peak_allocated_bytes, 0),
        "context": max(est.device_used_bytes - est.peak_reserved_bytes, 0),
    }


def h200_points() -> list[dict[str, Any]]:
    import memfit

    metrics = {
        "max_memory_allocated": "allocated",
        "max_memory_reserved": "reserved",
        "nvml_process_bytes": "device",
    }
    points = []
    path = RESULTS / "gpu_h200_measurements.jsonl"
    for line in path.read_text().splitlines():
        case = json.loads(line)
        if "error" in case:
            continue
        est = memfit.estimate(case["config"], memfit.WorkloadSpec(**case["workload"]), gpu="H200")
        env = {k: case[k] for k in H200_ENVIRONMENT_KEYS}
        route = path_of(workload=est.workload, environment=env)
        for key, metric in metrics.items():
            p = point(f"h200:{case['case']}", metric, case[key], est, "H200 run")
            points.append({**p, "path": route})
    return points


def published_points() -> list[dict[str, Any]]:
    import accuracy_published as pub

    metrics = {
        "max_memory_allocated": "allocated",
        "max_memory_reserved": "reserved",
        "nvidia_smi_used": "device",
        "model_weights": "static",
        "model_states": "static",
    }
    points = []
    for record in pub.load(next(p for p in pub.DATA_CANDIDATES if p.exists())):
        try:
            case = pub.select(record)
        except pub.Skip:
            continue
        if record.get("reliability") != "measured":  # formulas and claims measure nothing
            continue
        est = pub.estimate_case(case)
        p = point(record["id"], metrics[case.metric], case.measured_bytes, est, record["source"])
        if case.metric in ("model_weights", "model_states"):
            p["predicted_bytes"] = pub.metric_bytes(est, case.metric)
            p["parts"] = {"static": p["predicted_bytes"], "dynamic": 0, "cache": 0, "context": 0}
        p["path"] = record_path(record, est.workload)
        points.append(p)
    return points


def record_path(record: dict[str, Any], workload: dict[str, Any]) -> str:
    """A published record's path: its ``framework`` field names vLLM, or transformers with the
    PyTorch version the table ran ("transformers, PyTorch 2.2.1")."""
    text = record.get("framework") or ""
    torch = re.search(r"PyTorch (\d+\.\d+(?:\.\d+)?)", text)
    env = {"torch": torch[1]} if torch else {}
    framework = None if text.startswith("transformers") or not text else text
    return path_of(workload=workload, environment=env, framework=framework)


def block_points() -> list[dict[str, Any]]:
    """Liger-Kernel's published LlamaMLP figures on an H100 (``benchmarks/published_blocks.py``):
    memfit traces the benchmark's own protocol; the prediction is that protocol's figure, its
    static part the weights (and, backward, their gradients) of the traced estimate. transformers'
    LlamaMLP on a recent stack (the benchmark names no versions): the current-hf path."""
    import published_blocks as blocks

    from memfit.hardware.catalog import get_gpu

    data = json.loads(blocks.DATA.read_text())
    gpu = get_gpu(data["gpu"])
    points = []
    for n_text in data["mib"]["forward"]:
        pred = blocks.predict(int(n_text), gpu)
        for which, est in zip(("forward", "backward"), pred["estimates"], strict=True):
            predicted = int(pred[which] * blocks.MiB)
            parts = parts_of(est)
            parts["dynamic"] = predicted - parts["static"]
            parts["cache"] = parts["context"] = 0
            points.append(
                {
                    "name": f"liger:llamamlp-{which}-4x{n_text}",
                    "metric": "allocated",
                    "source": data["sources"][which],
                    "measured_bytes": int(data["mib"][which][n_text] * blocks.MiB),
                    "predicted_bytes": predicted,
                    "parts": parts,
                    "path": path_of(workload=est.workload, environment={}),
                }
            )
    return points


def framework_points() -> list[dict[str, Any]]:
    """LitGPT's and torchtune's published peaks (``frameworks_published.jsonl``, the rows its
    summary compares: ``comparable`` and, for LitGPT's full fine-tunes, not below the config's
    model states, the rule of ``frameworks_published.render``), each twice: memfit through the
    framework's own code (the recorded estimate's components) and through transformers' model
    (the analytic engine, what ``memfit check`` answers without the framework installed)."""
    import memfit

    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for line in (RESULTS / "frameworks_published.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rows[(rec["framework"], rec["row"])] = rec  # the last run of a row is its answer
    points = []
    for (framework, row), rec in rows.items():
        if not rec["comparable"] or "error" in rec:
            continue
        comps = rec["framework_components"]
        below_states = rec["published_bytes"] < 4 * comps["parameters"]
        if framework == "litgpt" and row.endswith("/full") and below_states:
            continue  # below bf16 params + grads + 2 AdamW states: not the configured job
        workload = memfit.WorkloadSpec(**rec["workload"])
        route = path_of(workload=workload.normalized(), environment={}, framework=framework)
        static = sum(comps.get(c, 0) for c in STATIC_COMPONENTS)
        base = {
            "metric": "allocated",
            "source": rec["source"],
            "measured_bytes": int(rec["published_bytes"]),
            "group": f"{framework}:{row}",
            "path": route,
        }
        points.append(
            {
                **base,
                "name": f"{framework}:{row} (framework code)",
                "predicted_bytes": int(rec["framework_bytes"]),
                "parts": {
                    "static": static,
                    "dynamic": int(rec["framework_bytes"]) - static,
                    "cache": 0,
                    "context": 0,
                },
            }
        )
        if rec["transformers_bytes"] is None:
            continue
        est = memfit.estimate(rec["model"], workload, gpu=rec["gpu"], engine="analytic")
        points.append(
            {
                **base,
                "name": f"{framework}:{row} (transformers path)",
                "predicted_bytes": est.peak_allocated_bytes,
                "parts": {**parts_of(est), "cache": 0, "context": 0},
            }
        )
    return points


def closed_form_estimates() -> list[tuple[str, dict[str, Any], Any]]:
    """``(name, row, estimate)`` of every published per-rank point the per-rank closed form
    estimates as the source ran it: the pp / cp / ep points as ``benchmarks/multigpu_parallel.py``
    estimates them (what ``memfit estimate`` answers), the others where
    ``multigpu_points.closed_form_models`` says it models them (full training, no offload;
    Megatron-LM's points are scored with it there, torchtitan's data / tensor-parallel ones are
    what ``plan --gpus`` prices such a layout with, and the 70B 2D point is what ``memfit
    estimate --sp`` answers)."""
    import multigpu_parallel as par
    import multigpu_points as mgpu

    rows = [json.loads(x) for x in par.DATA.read_text(encoding="utf-8").splitlines() if x]
    out = []
    for row in rows:
        if par.in_scope(row):
            out.append((f"parallel:{par.label(row)}", row, par.estimate_of(row)))
        elif mgpu.closed_form_models(row):
            out.append((f"closed-form:{row['id']}", row, mgpu.closed_form_job(row)))
    return out


def closed_form_points() -> list[dict[str, Any]]:
    """:func:`closed_form_estimates` as points, each on the path its estimate carries."""
    points = []
    for name, row, est in closed_form_estimates():
        measured = round(row["measured_gib"] * 2**30)
        p = point(name, row["metric"], measured, est, row["source"])
        points.append({**p, "path": estimate_path(est)})
    return points


def point(name: str, metric: str, measured: int, est: Any, source: str) -> dict[str, Any]:
    attr = {
        "allocated": "peak_allocated_bytes",
        "reserved": "peak_reserved_bytes",
        "device": "device_used_bytes",
        "static": "peak_allocated_bytes",
    }[metric]
    return {
        "name": name,
        "metric": metric,
        "source": source,
        "measured_bytes": int(measured),
        "predicted_bytes": int(getattr(est, attr)),
        "parts": parts_of(est),
    }


def group_of(p: dict[str, Any]) -> str:
    """The measurement a point is one metric (or one estimate) of: left out together."""
    return str(p.get("group", p["name"]))


def needed(p: dict[str, Any], part: str, bands: dict[str, tuple[float, float]]) -> float:
    """The fraction of ``part`` the point's residual needs on its side, beyond what the bands of
    the metric's earlier parts cover (signed: negative = below the estimate)."""
    residual = p["measured_bytes"] - p["predicted_bytes"]
    side = 1 if residual > 0 else 0
    covered = sum(bands[q][side] * p["parts"][q] for q in METRIC_PARTS[p["metric"]][:-1])
    need = max((abs(residual) - covered) / p["parts"][part], 0.0)
    return need if side else -need


def fit(points: list[dict[str, Any]]) -> Bands:
    """``{path: {part: (low, high)}}``: per path, the smallest fractions covering
    :data:`COVERAGE` of its points on each side (all of those above the estimate), fitted part by
    part in the order static → dynamic → cache → context (each metric adds one part to the
    previous one's range). A part a path has fewer than :data:`MIN_POINTS` points for takes, on
    each side, the widest of the paths that have them."""
    bands: Bands = {path: {} for path in PATH_ORDER}
    by_part = [path for path in PATH_ORDER if path not in WHOLE_FIGURE_PATHS]
    for metric, part in zip(METRIC_PARTS, PARTS, strict=True):
        fitted = {}
        for path in by_part:
            sel = [p for p in points if p["path"] == path and p["metric"] == metric]
            sel = [p for p in sel if p["parts"][part] > 0]
            if len(sel) < MIN_POINTS:
                continue
            values = [needed(p, part, bands[path]) for p in sel]
            lows = [-v if v < 0 else 0.0 for v in values]
            highs = [v if v > 0 else 0.0 for v in values]
            low, high = quantile(lows, COVERAGE["low"]), quantile(highs, COVERAGE["high"])
            fitted[path] = (round_up(low), round_up(high))
        widest = (
            max((b[0] for b in fitted.values()), default=0.0),
            max((b[1] for b in fitted.values()), default=0.0),
        )
        for path in by_part:
            bands[path][part] = fitted.get(path, widest)
    for path in WHOLE_FIGURE_PATHS:
        sel = [p for p in points if p["path"] == path and p["predicted_bytes"] > 0]
        if len(sel) < MIN_POINTS:  # too few: each part the widest band of the other paths
            bands[path] = {
                part: (
                    max(bands[q][part][0] for q in by_part),
                    max(bands[q][part][1] for q in by_part),
                )
                for part in PARTS
            }
            continue
        band = whole_figure_band(sel)
        bands[path] = {part: band for part in PARTS}
    return bands


def whole_figure_band(points: list[dict[str, Any]]) -> tuple[float, float]:
    """``(low, high)``: the smallest fractions of each point's estimated figure that cover
    :data:`WHOLE_FIGURE_COVERAGE` of ``points`` below and above it."""
    values = [p["measured_bytes"] / p["predicted_bytes"] - 1 for p in points]
    lows = [-v if v < 0 else 0.0 for v in values]
    highs = [v if v > 0 else 0.0 for v in values]
    low = quantile(lows, WHOLE_FIGURE_COVERAGE["low"])
    return round_up(low), round_up(quantile(highs, WHOLE_FIGURE_COVERAGE["high"]))


def evidence(points: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """``{path: {part: points}}``: how many measurements of each path each part was fitted on
    (fewer than :data:`MIN_POINTS`: the widest band instead)."""
    out: dict[str, dict[str, int]] = {}
    for path in PATH_ORDER:
        if path in WHOLE_FIGURE_PATHS:  # every point of the path fits every part
            n = sum(1 for p in points if p["path"] == path and p["predicted_bytes"] > 0)
            out[path] = dict.fromkeys(PARTS, n)
            continue
        out[path] = {}
        for metric, part in zip(METRIC_PARTS, PARTS, strict=True):
            out[path][part] = sum(
                1
                for p in points
                if p["path"] == path and p["metric"] == metric and p["parts"][part] > 0
            )
    return out


def quantile(values: list[float], share: float) -> float:
    """The smallest value at or above ``share`` of ``values`` (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(math.ceil(share * len(ordered)) - 1, len(ordered) - 1)]


def round_up(x: float) -> float:
    return round(math.ceil(max(x, 0.0) / STEP - 1e-9) * STEP, 4)


def inside(p: dict[str, Any], bands: Bands) -> bool:
    own = bands[p["path"]]
    parts = METRIC_PARTS[p["metric"]]
    low = p["predicted_bytes"] - sum(own[q][0] * p["parts"][q] for q in parts)
    high = p["predicted_bytes"] + sum(own[q][1] * p["parts"][q] for q in parts)
    return low <= p["measured_bytes"] <= high


def leave_one_out(points: list[dict[str, Any]]) -> list[bool]:
    """Each point tested against the bands fitted without its measurement (all its metrics and
    estimates: :func:`group_of`)."""
    out = []
    refits: dict[str, Bands] = {}
    for p in points:
        g = group_of(p)
        if g not in refits:
            refits[g] = fit([q for q in points if group_of(q) != g])
        out.append(inside(p, refits[g]))
    return out


def markdown(points: list[dict[str, Any]], bands: Bands) -> str:
    loo = leave_one_out(points)
    counts = evidence(points)
    n_h200 = sum(p["source"] == "H200 run" for p in points)
    lines = [
        "# Uncertainty bands per code path (generated by benchmarks/calibrate_uncertainty.py)",
        "",
        f"{len(points)} measurement points ({n_h200} from the H200 runs, the rest published), "
        f"each of the code path of the job measured; a part with fewer than {MIN_POINTS} points "
        "on a path takes the widest band of the paths that have them (*widest*). "
        f"{', '.join(WHOLE_FIGURE_PATHS)}: fitted on the whole figure each point measured, one "
        "band for every part, covering every point on both sides.",
        "",
        "| path | part | points | truth below the estimate by up to | above by up to |",
        "|---|---|---|---|---|",
    ]
    for path in PATH_ORDER:
        for part in PARTS:
            lo, hi = bands[path][part]
            n = counts[path][part]
            note = "" if n >= MIN_POINTS else " (*widest*)"
            lines.append(f"| {path} | {part} | {n}{note} | {lo:.1%} | {hi:.1%} |")
    lines += [
        "",
        "| path | metric | points | inside (in-sample) | inside (leave-one-out) |",
        "|---|---|---|---|---|",
    ]
    for path in PATH_ORDER:
        for metric in METRIC_PARTS:
            idx = [i for i, p in enumerate(points) if p["path"] == path and p["metric"] == metric]
            if not idx:
                continue
            n_in = sum(inside(points[i], bands) for i in idx)
            n_loo = sum(loo[i] for i in idx)
            lines.append(
                f"| {path} | {metric} | {len(idx)} | {n_in}/{len(idx)} | {n_loo}/{len(idx)} |"
            )
    lines.append("")
    for path in PATH_ORDER:
        idx = [i for i, p in enumerate(points) if p["path"] == path]
        n_loo = sum(loo[i] for i in idx)
        n_in = sum(inside(points[i], bands) for i in idx)
        under = [i for i in idx if points[i]["measured_bytes"] > points[i]["predicted_bytes"]]
        under_in = sum(inside(points[i], bands) for i in under)
        lines.append(
            f"- {path}: {n_in}/{len(idx)} inside in-sample, {n_loo}/{len(idx)} leave-one-out; "
            f"of the {len(under)} points memfit under-predicts, {under_in} inside."
        )
    total_loo = sum(loo)
    lines += [
        "",
        f"Leave-one-out: {total_loo}/{len(points)} points ({total_loo / len(points):.0%}) fall "
        "inside the range fitted without their measurement.",
        "",
        "| point | path | metric | measured | estimate | error | inside (leave-one-out) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p, ok in zip(points, loo, strict=True):
        err = p["predicted_bytes"] / p["measured_bytes"] - 1
        lines.append(
            f"| {p['name']} | {p['path']} | {p['metric']} | {p['measured_bytes'] / 2**30:.2f} GiB "
            f"| {p['predicted_bytes'] / 2**30:.2f} GiB | {err:+.1%} | {'yes' if ok else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reuse", action="store_true", help="refit from uncertainty_points.jsonl, no tracing"
    )
    parser.add_argument(
        "--refresh-closed-form",
        action="store_true",
        help="estimate the per-rank closed form's points again (milliseconds), keep the others",
    )
    args = parser.parse_args(argv)
    points_file = RESULTS / "uncertainty_points.jsonl"
    if args.reuse or args.refresh_closed_form:
        points = [json.loads(x) for x in points_file.read_text().splitlines()]
        if args.refresh_closed_form:
            points = [p for p in points if p["path"] not in WHOLE_FIGURE_PATHS]
            points += closed_form_points()
            points_file.write_text("".join(json.dumps(p) + "\n" for p in points))
    else:
        points = h200_points() + published_points() + block_points() + framework_points()
        points += closed_form_points()
        points_file.write_text("".join(json.dumps(p) + "\n" for p in points))
    bands = fit(points)
    (RESULTS / "uncertainty.md").write_text(markdown(points, bands))
    print(json.dumps({"bands": bands, "points": evidence(points)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
