"""Diffusion training (memfit estimate <pipeline> --mode train) against published figures.

Reads benchmarks/data/diffusion_train_published.json (each point: source URL, the quoted
sentence, the setting, the metric) and writes benchmarks/results/diffusion_train_published.md.
Run: PYTHONPATH=src python benchmarks/diffusion_train_published.py  (minutes: each FLUX point is
three traces of a few blocks, docs/diffusion.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from memfit.estimate.diffusion.train_fast import estimate_training_fast
from memfit.hardware.catalog import get_gpu
from memfit.hardware.overhead import device_overhead
from memfit.models.pipelines import pipeline_dir
from memfit.spec.diffusion import DiffusionTrainJob

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "diffusion_train_published.json"
OUT = HERE / "results" / "diffusion_train_published.md"
STEP_PHASES = ("vae_encode", "forward", "backward", "optimizer")


def main(only: str | None = None) -> None:
    points = json.loads(DATA.read_text(encoding="utf-8"))
    if only:
        points = [p for p in points if p["id"] == only]
    rows = []
    for p in points:
        kw = dict(p["job"])
        if "lora_targets" in kw:
            kw["lora_targets"] = tuple(kw["lora_targets"])
        kw.setdefault("precision", "bf16-mixed")
        job = DiffusionTrainJob(**kw)
        root = pipeline_dir(p["model"])
        assert root is not None
        est = estimate_training_fast(root, job, name=p["model"])
        phases = {ph.phase: ph for ph in est.phases}
        if p["compare"] == "steps":
            peak = max(phases[k].peak_bytes for k in STEP_PHASES if k in phases)
        else:
            peak = est.peak_bytes
        arch = get_gpu(p["gpu"]).arch if p.get("gpu") else None
        ov = device_overhead(arch, training=True).total_bytes
        pub = p["published_gb"] * 1e9
        need = peak + ov
        bound = p.get("bound")
        if bound is None:
            check = f"{(need - pub) / pub:+.1%}"
        else:  # "can exceed X" (above) / "less than X" (below): does memfit agree?
            agrees = need > pub if bound == "above" else need < pub
            check = f"{'consistent' if agrees else 'INCONSISTENT'} ({bound} {pub / 1e9:.0f} GB)"
        rows.append(
            f"| {p['id']} | {p['published_gb']:.1f} GB | {peak / 1e9:.2f} GB "
            f"({(peak - pub) / pub:+.1%}) | {need / 1e9:.2f} GB | {check}"
            f" | {est.peak.phase} {est.peak_bytes / 1e9:.2f} GB | {p['metric']} |"
        )
        print(rows[-1], flush=True)
        print(
            "  phases (GB):",
            {k: round(v.peak_bytes / 1e9, 3) for k, v in phases.items()},
            "reserved",
            round(est.peak_reserved_bytes / 1e9, 3),
            flush=True,
        )
    head = (
        "| point | published | memfit allocated (error) | + CUDA context & cuBLAS | error "
        "or bound | memfit whole-run peak | published metric |\n|---|---|---|---|---|---|---|"
    )
    OUT.write_text(
        "# Diffusion training against published figures\n\n"
        "From `PYTHONPATH=src python benchmarks/diffusion_train_published.py`; points, settings "
        f"and sources in `{DATA.relative_to(HERE.parent)}`. GB = 10^9 bytes.\n\n"
        + head
        + "\n"
        + "\n".join(rows)
        + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else None)
