"""Compare memfit's diffusion pipeline estimates with published measurements.

Reads benchmarks/data/diffusion_published.json (each point: the pipeline, the ``memfit estimate``
flags that reproduce its setting, the library versions it was measured with where they change a
rule (``versions``: src/memfit/estimate/diffusion/versions.py), the quantity and the metric
it was measured as, the figure and its source), sizes every point in this one process (each
component is traced once per input shape and reused across offload modes and weight formats: a
few minutes on 2 CPU cores) and writes benchmarks/results/diffusion_published.md (quoted in
docs/accuracy.md).

    PYTHONPATH=src python benchmarks/diffusion_published.py

Quantities: ``peak_allocated_bytes`` (``torch.cuda.max_memory_allocated``),
``peak_reserved_bytes`` (``max_memory_reserved``: memfit's caching-allocator replay),
``loaded_reserved_bytes`` (``max_memory_reserved`` once loaded and placed), ``weights_bytes``
(the device weights of every component), ``<component>.<field>`` (one component's row).
Each peak is compared twice: with memfit's expected figure, and with its upper figure
(``peak_upper_bytes``: plus the cuDNN convolution-workspace allowance, diffusion_workspace.py).
A point with ``kind: upper_bound`` is a published "under X" claim (listed, not in the medians);
a point with ``excluded`` is listed with the reason it cannot be compared.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "diffusion_published.json"
OUT = HERE / "results" / "diffusion_published.md"
GIB = 2**30


def estimate(point: dict[str, Any]) -> Any:
    from memfit.cli.entry import build_parser
    from memfit.estimate.diffusion.pipelines import estimate_pipeline
    from memfit.jobflags import diffusion_job
    from memfit.models.pipelines import pipeline_dir

    args = build_parser().parse_args(
        ["estimate", point["model"], "--mode", "infer", *point["flags"]]
    )
    root = pipeline_dir(point["model"])
    assert root is not None, point["model"]
    versions = point.get("versions", {})
    job = dataclasses.replace(
        diffusion_job(args),
        transformers_version=versions.get("transformers"),
        bitsandbytes_version=versions.get("bitsandbytes"),
    )
    return estimate_pipeline(root, job, name=point["model"])


def predicted_gib(point: dict[str, Any], est: Any, *, upper: bool = False) -> float:
    q = point["quantity"]
    if q == "peak_allocated_bytes":
        return float(est.peak_upper_bytes if upper else est.peak_bytes) / GIB
    if q == "peak_reserved_bytes":
        return float(est.peak_reserved_upper_bytes if upper else est.peak_reserved_bytes) / GIB
    if q == "weights_bytes":
        return float(sum(c.weights_bytes for c in est.components)) / GIB
    if q == "loaded_reserved_bytes":
        return float(est.loaded_reserved_bytes) / GIB
    comp, _, field = q.partition(".")
    row = next(c for c in est.components if c.name == comp)
    return float(getattr(row, field)) / GIB


def summary(name: str, errs: list[float]) -> str:
    under = [e for e in errs if e < -0.10]
    return (
        f"{name}: {len(errs)} points; median error {statistics.median(errs):+.1%}; median "
        f"|error| {statistics.median(abs(e) for e in errs):.1%}; worst "
        f"{max(errs, key=abs):+.1%}; worst under {min(errs):+.1%}; under-predicted by more "
        f"than 10 %: {len(under)}"
    )


def main() -> int:
    points = json.loads(DATA.read_text(encoding="utf-8"))
    rows, bounds, excluded = [], [], []
    errors, peaks, verdict = [], [], []
    for i, p in enumerate(points):
        print(f"[{i + 1}/{len(points)}] {p['id']}", file=sys.stderr, flush=True)
        est = estimate(p)
        pred = predicted_gib(p, est)
        up = predicted_gib(p, est, upper=True)
        pub = p["published_gb"]
        flags = " ".join(p["flags"]) or "(defaults)"
        vers = p.get("versions", {})
        ver = " ".join(f"{k} {v}" for k, v in vers.items() if k != "note") or "installed"
        if p.get("excluded"):
            excluded.append(f"| {p['id']} | `{flags}` | {pub:.3f} | {pred:.3f} | {p['excluded']} |")
            continue
        if p.get("kind") == "upper_bound":
            ok = "yes" if pred <= pub else f"no (+{pred / pub - 1:.1%})"
            bounds.append(
                f"| {p['id']} | `{flags}` | under {pub:g} | {pred:.3f} | {ok} | {p['source']} |"
            )
            continue
        err, err_up = (pred - pub) / pub, (up - pub) / pub
        errors.append(err)
        verdict.append(err_up)
        if p["quantity"].startswith("peak"):
            peaks.append(err)
        rows.append(
            f"| {p['id']} | `{flags}` | {ver} | {p['quantity']} ({p['metric']}) | {pub:.3f} | "
            f"{pred:.3f} | {err:+.1%} | {up:.3f} | {err_up:+.1%} | {p['source']} |"
        )
    lines = [
        "# Diffusion pipelines vs published measurements",
        "",
        "Generated by `PYTHONPATH=src python benchmarks/diffusion_published.py` (settings and "
        "full sources in benchmarks/data/diffusion_published.json). *memfit*: the expected "
        "figure; *upper*: the upper figure reported beside the `--gpu` verdict (peaks plus the "
        "cuDNN "
        "convolution-workspace allowance). *versions*: the library versions whose rules were "
        "applied (the point's; else the installed ones).",
        "",
        "| point | memfit flags | versions | quantity (metric) | published (GiB) | memfit (GiB) | "
        "error | upper (GiB) | error | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        summary("all, expected figure", errors),
        "",
        summary("peaks only, expected figure", peaks),
        "",
        summary("all, upper figure", verdict),
        "",
        '## Published upper bounds ("under X")',
        "",
        "| point | memfit flags | published | memfit (GiB) | memfit within it | source |",
        "|---|---|---|---|---|---|",
        *bounds,
        "",
        "## Listed, not compared",
        "",
        "| point | memfit flags | published | memfit (GiB) | why not compared |",
        "|---|---|---|---|---|",
        *excluded,
    ]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
