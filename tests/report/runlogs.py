"""Run logs in the monitor's schema (docs/monitoring.md), built record by record for the tests."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

GiB = 1024**3
MiB = 1024**2
T0 = 1_760_000_000.0


def start(estimate: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "start",
        "time": T0,
        "memfit_version": "0.1.0",
        "device": "cuda:0",
        "device_name": "NVIDIA L4",
        "device_total_bytes": 24 * GiB,
        "pid": 4242,
        "argv": ["train.py", "--batch", "8"],
        "estimate": estimate,
    }


def step(i: int, allocated: int, *, t: float, step_time: float = 0.5) -> dict[str, Any]:
    return {
        "type": "step",
        "time": t,
        "step": i,
        "step_time_s": step_time,
        "tokens": 16384,
        "samples": 8,
        "tokens_per_s": 16384 / step_time,
        "samples_per_s": 8 / step_time,
        "allocated_bytes": allocated,
        "peak_allocated_bytes": allocated + 3 * GiB,
        "reserved_bytes": allocated + 4 * GiB,
        "peak_reserved_bytes": allocated + 4 * GiB + 256 * MiB,
        "device_used_bytes": allocated + 4 * GiB + 600 * MiB,
        "utilization_pct": 97.0,
        "rss_bytes": 3 * GiB,
    }


def sample(t: float, device_used: int) -> dict[str, Any]:
    return {
        "type": "sample",
        "time": t,
        "device_used_bytes": device_used,
        "utilization_pct": 95.0,
        "process_used_bytes": device_used - 100 * MiB,
    }


def oom(t: float, step_i: int) -> dict[str, Any]:
    return {
        "type": "oom",
        "time": t,
        "step": step_i,
        "requested_bytes": 2 * GiB,
        "message": "CUDA out of memory. Tried to allocate 2.00 GiB.",
        "live_bytes": {"activations": 9 * GiB, "parameters": 5 * GiB, "optimizer_states": 6 * GiB},
        "advice": ["halve the batch (--batch 4)", "turn on activation checkpointing"],
        "report": None,
    }


def end(t: float) -> dict[str, Any]:
    return {"type": "end", "time": t, "summary": {"n_steps": 60}, "receipt": None}


def estimate_json() -> dict[str, Any]:
    """The fields of MemoryEstimate.to_json() the report reads."""
    comps = {
        "parameters": 5 * GiB,
        "gradients": 2 * GiB,
        "optimizer_states": 4 * GiB,
        "activations": 3 * GiB,
        "kv_cache": 0,
        "temporary": 1 * GiB,
    }
    return {
        "model": {"name": "llama-3.2-1b", "n_params": 1_235_814_400, "n_trainable_params": 1},
        "engine": "trace",
        "peak_allocated_bytes": sum(comps.values()),
        "peak_reserved_bytes": sum(comps.values()) + GiB,
        "device_used_bytes": sum(comps.values()) + GiB + 500 * MiB,
        "peak_phase": "backward",
        "components": comps,
    }


def training_run(*, n_steps: int = 60, leak_per_step: int = 0, with_oom: bool = True) -> list[dict]:
    """A run whose allocated memory wobbles around 12 GiB (plus ``leak_per_step`` per step)."""
    recs: list[dict[str, Any]] = [start(estimate_json())]
    t = T0
    for i in range(n_steps):
        t += 0.5 + 0.05 * math.sin(i)
        alloc = 12 * GiB + int(200 * MiB * math.sin(i / 3)) + i * leak_per_step
        recs.append(step(i, alloc, t=t, step_time=0.5 + 0.05 * math.sin(i)))
        recs.append(sample(t + 0.25, alloc + 4 * GiB + 700 * MiB))
    if with_oom:
        recs.append(oom(t + 0.3, n_steps))
        recs.append({"type": "error", "time": t + 0.31, "where": "step", "message": "OOM"})
    recs.append(end(t + 1))
    return recs


def write(path: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path
