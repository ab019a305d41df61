"""FSDP2 rank 0 at other GPU counts than the fast-path grid's 8: the trace against the analytic
engine (issue 32, a probe; helper "fsdp2fast").

The grid (``fastpath_grid.py``) runs its sharded jobs at ``SHARD_GPUS`` = 8 only, so the fast path
validates FSDP2 there only. This runs some of the same rows (a bundled config cut to 2 layers,
batch 5, seq 128, the grid's job fields) at other counts and writes, per row, both engines'
allocated bytes, the trace's reserved bytes, the top of the analytic range (``reserved_end=
"high"``: allocated x the wide ratio + the root buffers' segments) and those segments, to
``benchmarks/results/fsdp_gpu_counts.jsonl`` (docs/accuracy.md, "Fast path: FSDP2").

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_gpu_counts.py            # the default rows
    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_gpu_counts.py olmo-2-7b:mixed_fsdp:16
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fastpath_grid import _commit, _workload, real_config  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "fsdp_gpu_counts.jsonl"
#: name:job:gpus
DEFAULT = (
    "olmo-2-7b:mixed_fsdp:16", "olmo-2-7b:mixed_fsdp:4", "llama-3.1-8b:lora_fsdp:16",
    "llama-3.1-8b:lora_fsdp:4", "qwen3-8b:mixed_ckpt_fsdp:16", "qwen3-0.6b:mixed_fsdp:4",
    "phi-4:mixed_fsdp:16", "llama-2-7b:lora_fsdp:16", "llama-2-7b:mixed_fsdp:4",
    "mistral-nemo-12b:lora_fsdp:16",
)  # fmt: skip


def one(name: str, job: str, gpus: int) -> dict:
    """Both engines on ``name`` cut to 2 layers, the grid's ``job`` at ``gpus`` GPUs."""
    from memfit.estimate.policy import run_engine
    from memfit.models import resolve_model

    path = Path(tempfile.mkdtemp(prefix="memfit-fsdp-")) / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(real_config(name, 2)))
    source = resolve_model(str(path.parent))
    w = _workload(job, name, source.config["model_type"], batch=5, seq=128, config=source.config)
    w = dataclasses.replace(w, gpus=gpus)
    started = time.perf_counter()
    trace = run_engine("trace", source, w, None)
    trace_s = round(time.perf_counter() - started, 1)
    fast = run_engine("analytic", source, w, None, reserved_end="high")
    return {
        "name": name, "job": job, "gpus": gpus, "trace_allocated_bytes": trace.peak_allocated_bytes,
        "trace_reserved_bytes": trace.peak_reserved_bytes,
        "analytic_allocated_bytes": fast.peak_allocated_bytes,
        "analytic_top_reserved_bytes": fast.peak_reserved_bytes,
        "stranded_bytes": int(fast.trace["analytic"].get("fsdp_stranded_bytes", 0)),
        "trace_s": trace_s, "commit": _commit(),
    }  # fmt: skip


def main(argv: list[str]) -> int:
    with OUT.open("a", encoding="utf-8") as f:
        for arg in argv or DEFAULT:
            name, job, gpus = arg.split(":")
            row = one(name, job, int(gpus))
            f.write(json.dumps(row, sort_keys=True) + "\n")
            a, t = row["analytic_allocated_bytes"], row["trace_allocated_bytes"]
            top = row["analytic_top_reserved_bytes"] / row["trace_reserved_bytes"] - 1
            print(f"{arg}: allocated {100 * (a / t - 1):+.2f} %, top {100 * top:+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
