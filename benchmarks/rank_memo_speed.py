"""Cold build of the three rank forms of one technique stack in one process, with and without the
trace engine's step memo (issue 11; :mod:`memfit.estimate.trace.step_memo`). Writes
``benchmarks/results/rank_memo_speed.md`` and ``.json``.

    PYTHONPATH=src python benchmarks/rank_memo_speed.py [--layers 36] [--checkpointing full]

The model is fastpath_speed.py's Qwen3-8B-shaped config (model_type granite, no analytic
program) at seq 4096, adamw, bf16-mixed, one GPU: the forms of ZeRO-2 + optimizer offload,
ZeRO-3 + optimizer offload and ZeRO-3 + parameter offload, built in that order in one fresh
process (imports not counted), as a cold ``plan`` builds them. "memo off" is the same code
under ``MEMFIT_NO_CACHE=1`` (which also turns the memo off; the three forms have three cache
keys, so the disk cache saves nothing inside one such run); "memo on" an empty cache directory.
Each run writes its forms (``wall_s`` / ``build_s`` left out), and the two runs' forms must be
equal byte for byte. Wall and CPU time (user + system of the process and its trace worker) per
form, with the 1-minute load average before and after: the machine may be shared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

from fastpath_speed import QWEN3_8B_SHAPE  # noqa: E402

VARIANTS = (("zero2", "optimizer"), ("zero3", "optimizer"), ("zero3", "params"))

_CHILD = r"""
import json, os, resource, sys, time
from memfit.estimate import derived
from memfit.estimate.derived import cache
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

folder, ckpt, out = sys.argv[1], sys.argv[2], sys.argv[3]
variants = json.loads(sys.argv[4])
source = resolve_model(folder)

def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

rows, forms = [], {}
t0, c0 = time.perf_counter(), cpu()
for shard, offload in variants:
    w = WorkloadSpec(mode="train", batch_size=1, seq_len=4096, precision="bf16-mixed",
                     checkpointing=ckpt, optimizer="adamw", shard=shard, offload=offload)
    t, c = time.perf_counter(), cpu()
    est = derived.estimate_derived(source, w)
    form = dict(derived._FORMS[cache.variant_key(source.config, w)])
    rows.append({"shard": shard, "offload": offload, "wall_s": round(time.perf_counter() - t, 2),
                 "cpu_s": round(cpu() - c, 2), "grown": "growth" in form,
                 "peak_allocated_bytes": est.peak_allocated_bytes,
                 "peak_reserved_bytes": est.peak_reserved_bytes})
    form.pop("build_s", None)
    form["trace"] = {k: v for k, v in form.get("trace", {}).items() if k != "wall_s"}
    forms[f"{shard}+{offload}"] = form
json.dump(forms, open(out, "w"), sort_keys=True)
print(json.dumps({"forms": rows, "wall_s": round(time.perf_counter() - t0, 2),
                  "cpu_s": round(cpu() - c0, 2)}))
"""


def _run(folder: Path, ckpt: str, memo: bool, tmp: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env["MEMFIT_CACHE_DIR"] = str(tmp / ("cache-on" if memo else "cache-off"))
    if not memo:
        env["MEMFIT_NO_CACHE"] = "1"
    else:
        env.pop("MEMFIT_NO_CACHE", None)
    out = tmp / f"forms-{'on' if memo else 'off'}.json"
    load_before = os.getloadavg()[0]
    cmd = [sys.executable, "-c", _CHILD, str(folder), ckpt, str(out), json.dumps(VARIANTS)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["load_before"] = round(load_before, 2)
    result["load_after"] = round(os.getloadavg()[0], 2)
    result["forms_sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--checkpointing", default="full")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        folder = tmp / "model"
        folder.mkdir()
        config = {**QWEN3_8B_SHAPE, "num_hidden_layers": args.layers}
        (folder / "config.json").write_text(json.dumps(config))
        runs = {
            "memo off": _run(folder, args.checkpointing, False, tmp),
            "memo on": _run(folder, args.checkpointing, True, tmp),
        }
    same = runs["memo off"]["forms_sha256"] == runs["memo on"]["forms_sha256"]
    data = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "layers": args.layers,
        "checkpointing": args.checkpointing,
        "cores": len(os.sched_getaffinity(0)),
        "forms_identical": same,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rank_memo_speed.json").write_text(json.dumps(data, indent=1) + "\n")
    (RESULTS / "rank_memo_speed.md").write_text(_markdown(data))
    print(_markdown(data))
    if not same:
        sys.exit("the forms built with and without the memo differ")


def _markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Rank forms of one stack with and without the step memo",
        "",
        f"`benchmarks/rank_memo_speed.py` ({data['when']}, {data['cores']} cores): the "
        f"Qwen3-8B-shaped config ({data['layers']} layers), seq 4096, adamw, checkpointing "
        f"{data['checkpointing']}; three forms built in one process. Forms identical with and "
        f"without the memo: **{data['forms_identical']}**.",
        "",
        "| run | form | wall s | CPU s | grown |",
        "|---|---|---:|---:|---|",
    ]
    for name, run in data["runs"].items():
        for row in run["forms"]:
            lines.append(
                f"| {name} | {row['shard']} + offload {row['offload']} | {row['wall_s']} | "
                f"{row['cpu_s']} | {row['grown']} |"
            )
        lines.append(
            f"| **{name}** | all three (load {run['load_before']} -> {run['load_after']}) | "
            f"**{run['wall_s']}** | **{run['cpu_s']}** | |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
