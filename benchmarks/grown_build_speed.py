"""Cold build of a derived form: grown from traces of a few layer units vs traced at full depth
(a benchmark, not a test; issue 11, docs/accuracy.md §19).

Each arm runs in a fresh process with an empty form cache: ``grown`` as the engine does it,
``full`` with the growth switched off (every trace at the model's depth, as before). Measured:
the process's CPU time (user + system) spent building the form, after the imports, and the
estimates both forms give at batch sizes neither traced, which must be identical to the byte
(peak allocated, peak reserved, every phase's peak). Writes
``benchmarks/results/grown_build_speed.{json,md}``.

    PYTHONPATH=src .venv/bin/python benchmarks/grown_build_speed.py qwen3-30b-a3b deepseek-v2-lite
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: The job: a full fine-tune in bf16 (MoE grouped matmuls take bf16 only, docs/accuracy.md §14).
SEQ = 512
GPU = "H100"
#: Batch sizes neither form traced (the grown form traces 1-4 at a few units, the full one 1-4).
COMPARED = (5, 8)

CHILD = """
import dataclasses, json, os, resource, sys, tempfile, time
os.environ["MEMFIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="memfit-bench-")
arm, model, seq, gpu_name, compared = sys.argv[1:6]
seq = int(seq)
from memfit.estimate.derived import estimate_derived, grown
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec
import memfit.estimate.trace.engine  # the imports (torch, transformers) outside the timing
if arm == "full":
    grown.applies = lambda config, workload: None
src = resolve_model(model)
gpu = get_gpu(gpu_name)
w = WorkloadSpec(mode="train", batch_size=1, seq_len=seq, precision="bf16-true")
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0, t0 = cpu(), time.perf_counter()
est = estimate_derived(src, w, gpu=gpu, progress=lambda m: print(m, file=sys.stderr, flush=True))
build_cpu, build_wall = cpu() - c0, time.perf_counter() - t0
out = {"arm": arm, "model": model, "build_cpu_s": round(build_cpu, 1),
       "build_wall_s": round(build_wall, 1), "engine": est.engine,
       "growth": est.trace.get("derived", {}), "answers": {}}
for b in [1, *map(int, compared.split(","))]:
    e = estimate_derived(src, dataclasses.replace(w, batch_size=b), gpu=gpu)
    out["answers"][str(b)] = {"peak_allocated_bytes": e.peak_allocated_bytes,
                              "peak_reserved_bytes": e.peak_reserved_bytes,
                              "phases": {k: p.to_json() for k, p in e.phases.items()}}
print(json.dumps(out))
"""


def run_arm(arm: str, model: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [arm, model, str(SEQ), GPU, ",".join(map(str, COMPARED))]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{arm} {model} failed:\n{proc.stderr[-3000:]}")
    log = proc.stderr.splitlines()
    traces = [ln for ln in log if "trace of" in ln or "trace at" in ln]
    fell_back = [ln for ln in log if "from full traces" in ln]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**out, "traces": traces, "fell_back": fell_back}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="bundled model names or config.json paths")
    args = parser.parse_args()
    rows = []
    for model in args.models:
        grown, full = run_arm("grown", model), run_arm("full", model)
        same = grown["answers"] == full["answers"]
        rows.append({"model": model, "grown": grown, "full": full, "identical": same})
        print(model, grown["build_cpu_s"], full["build_cpu_s"], same, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "grown_build_speed.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "# Derived forms: grown vs full-depth cold build",
        "",
        f"`PYTHONPATH=src python benchmarks/grown_build_speed.py {' '.join(args.models)}` on "
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}. "
        f"Job: full fine-tune, bf16-true, AdamW, seq {SEQ}, {GPU}; each arm a fresh process "
        "with an empty form cache. CPU = user + system seconds of the form's build (imports "
        "excluded); wall time depends on the machine's load.",
        "",
        "| model | grown: CPU / wall | traces | full depth: CPU / wall | traces | "
        f"answers at batch 1, {', '.join(map(str, COMPARED))} |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        g, f = r["grown"], r["full"]
        lines.append(
            f"| {r['model']} | {g['build_cpu_s']} s / {g['build_wall_s']} s | {len(g['traces'])} "
            f"| {f['build_cpu_s']} s / {f['build_wall_s']} s | {len(f['traces'])} | "
            f"{'identical' if r['identical'] else 'DIFFER'} |"
        )
    (RESULTS / "grown_build_speed.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
