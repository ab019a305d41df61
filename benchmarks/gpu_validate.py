"""Validate memfit's estimates against real CUDA runs of plans *applied with memfit.apply*.

Each case builds a model from a bundled config (random weights) directly on the GPU, applies the
plan with ``memfit.apply_plan_`` / ``memfit.build_optimizer`` / ``AmpStep`` (the same libraries a
user's job calls: bitsandbytes, peft, torch), runs two real training steps and records
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` and NVML's per-process used memory,
next to ``memfit.estimate`` for the same workload on the same GPU. Every case runs in its own
subprocess (fresh allocator and CUDA context), capped at ``CASE_TIMEOUT_S``: 13 cases x 35 s plus
the estimates keep the whole grid under 10 minutes even when cases hang. (Not yet run on a GPU:
the first run's timings belong in docs/accuracy.md with its results.)

    python benchmarks/gpu_validate.py --out benchmarks/results/gpu_validate  # writes .jsonl + .md
    python benchmarks/gpu_validate.py --dry-run --gpu H100-80GB              # no CUDA needed:
                                                                             # grid + estimates
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Seconds one case may take (CUDA start, a 1B model built on the GPU, two steps) before it is
#: reported as failed; 13 x 35 s = 455 s leaves room for the estimates within 10 minutes.
CASE_TIMEOUT_S = 35

#: name -> (bundled model, workload). Workload keys mirror memfit.WorkloadSpec.
_L1B = "llama-3.2-1b"
_BASE: dict[str, Any] = dict(mode="train", batch_size=2, seq_len=1024)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama1b-bf16": (_L1B, dict(_BASE)),
    "llama1b-amp-bf16": (_L1B, dict(_BASE, precision="amp-bf16")),
    "llama1b-eager": (_L1B, dict(_BASE, attention="eager")),
    "llama1b-ckpt-full": (_L1B, dict(_BASE, checkpointing="full", batch_size=4)),
    "llama1b-ckpt-selective": (_L1B, dict(_BASE, checkpointing="selective")),
    "llama1b-adamw-8bit": (_L1B, dict(_BASE, optimizer="adamw-8bit")),
    "llama1b-paged-adamw-8bit": (_L1B, dict(_BASE, optimizer="paged-adamw-8bit")),
    "llama1b-adafactor": (_L1B, dict(_BASE, optimizer="adafactor")),
    "llama1b-freeze8": (_L1B, dict(_BASE, freeze_layers=8)),
    "llama1b-lora16": (_L1B, dict(_BASE, lora_rank=16)),
    "llama1b-qlora-nf4dq": (
        _L1B,
        dict(_BASE, lora_rank=16, quant="nf4-dq", checkpointing="full"),
    ),
    "llama1b-lora-int8": (_L1B, dict(_BASE, lora_rank=16, quant="int8")),
    "qwen05b-fp32-sgd": ("qwen2.5-0.5b", dict(_BASE, precision="fp32", optimizer="sgd-momentum")),
}


def workload(case: str) -> Any:
    import memfit

    return memfit.WorkloadSpec(**CASES[case][1])


def estimate_case(case: str, gpu: str | None, engine: str = "auto") -> dict[str, Any]:
    """memfit's estimate for one case (runs anywhere)."""
    import memfit

    est = memfit.estimate(CASES[case][0], workload(case), gpu=gpu, engine=engine)
    return {
        "engine": est.engine,
        "peak_allocated_bytes": est.peak_allocated_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "device_used_bytes": est.device_used_bytes,
    }


def measure_case(case: str) -> dict[str, Any]:
    """Run one case on this process's GPU (call in a fresh process)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import memfit
    from memfit.apply import AmpStep, training_step
    from memfit.apply.precision import PARAM_DTYPE
    from memfit.models import resolve_model

    name, _ = CASES[case]
    w = workload(case)
    cfg = dict(resolve_model(name).config or {})
    model_type = cfg.pop("model_type")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(model_type, **cfg), dtype=PARAM_DTYPE[w.precision]
        )
    model = memfit.apply_plan_(model, w)
    opt = memfit.build_optimizer(model, w)
    amp = AmpStep(w, device_type="cuda")
    ids = torch.randint(
        0, int(cfg.get("vocab_size", 32000)), (w.batch_size, w.seq_len), device="cuda"
    )
    batch = {"input_ids": ids, "labels": ids}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(2):
        training_step(model, batch, opt, amp)
    torch.cuda.synchronize()
    return {
        "max_memory_allocated": int(torch.cuda.max_memory_allocated()),
        "max_memory_reserved": int(torch.cuda.max_memory_reserved()),
        "nvml_process_used_bytes": _nvml_used(),
        "gpu": torch.cuda.get_device_name(),
        "steps_s": round(time.perf_counter() - started, 3),
    }


def _nvml_used() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                return int(proc.usedGpuMemory)
    except Exception:  # noqa: BLE001 - NVML is optional; any failure means "not measured"
        return None
    return None


def compare(case: str, measured: dict[str, Any], estimated: dict[str, Any]) -> dict[str, Any]:
    """One results row: measured, estimated and the relative errors (estimate / measured - 1)."""

    def err(est_key: str, meas_key: str) -> float | None:
        m = measured.get(meas_key)
        return None if not m else round(estimated[est_key] / m - 1, 4)

    return {
        "case": case,
        "model": CASES[case][0],
        "workload": CASES[case][1],
        "measured": measured,
        "estimate": estimated,
        "error_allocated": err("peak_allocated_bytes", "max_memory_allocated"),
        "error_reserved": err("peak_reserved_bytes", "max_memory_reserved"),
        "error_nvml": err("device_used_bytes", "nvml_process_used_bytes"),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table for docs/accuracy.md."""

    def gib(n: Any) -> str:
        return "—" if not n else f"{n / 2**30:.2f}"

    def pct(x: Any) -> str:
        return "—" if x is None else f"{x:+.1%}"

    lines = [
        "| case | measured alloc GiB | estimated GiB | error | measured reserved GiB | "
        "error | NVML error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, e = r.get("measured") or {}, r.get("estimate") or {}
        if "error" in r:
            lines.append(f"| {r['case']} | failed: {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['case']} | {gib(m.get('max_memory_allocated'))} | "
            f"{gib(e.get('peak_allocated_bytes'))} | {pct(r['error_allocated'])} | "
            f"{gib(m.get('max_memory_reserved'))} | {pct(r['error_reserved'])} | "
            f"{pct(r['error_nvml'])} |"
        )
    return "\n".join(lines) + "\n"


def _run_child(case: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", case]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CASE_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CASE_TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks/results/gpu_validate",
        help="path prefix: writes PREFIX.jsonl and PREFIX.md",
    )
    ap.add_argument("--gpu", default=None, help="catalog GPU for the estimates (default: detected)")
    ap.add_argument("--engine", default="auto", help="estimate engine (auto, trace, analytic)")
    ap.add_argument("--dry-run", action="store_true", help="list the grid and the estimates only")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure_case(args.child)))
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.dry_run:
        for c in cases:
            row = {
                "case": c,
                "model": CASES[c][0],
                "workload": CASES[c][1],
                "estimate": estimate_case(c, args.gpu, args.engine),
            }
            print(json.dumps(row))
        return 0
    gpu = args.gpu or _detected_gpu()
    rows = []
    for c in cases:
        measured = _run_child(c)
        if "error" in measured:
            rows.append({"case": c, "model": CASES[c][0], "error": measured["error"]})
        else:
            rows.append(compare(c, measured, estimate_case(c, gpu, args.engine)))
        print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    Path(f"{args.out}.md").write_text(markdown(rows))
    return 0


def _detected_gpu() -> str | None:
    """The catalog name of this machine's GPU, if memfit knows it."""
    import torch

    from memfit.errors import UnknownGPUError
    from memfit.hardware import get_gpu

    try:
        return str(get_gpu(torch.cuda.get_device_name()).name)
    except UnknownGPUError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
