"""Speed of the derived engine (issue 11): whole-process `plan` and `fit` on a model type with no
hand-written program, cold (empty form cache) and warm, and the per-estimate cost of a built form.

    PYTHONPATH=src python benchmarks/fastpath_speed.py [--layers 36] [--out FILE]

The model is a Qwen3-8B-shaped config (hidden 4096, 32 heads / 8 KV heads, MLP 12288, vocab
151936, ``--layers`` layers) written with model_type ``granite``, which has no analytic program,
so `auto` takes the derived engine. Each command runs as a fresh process (imports included), as a
user would run it; the machine is shared, so the load average is written next to the times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QWEN3_8B_SHAPE = {
    "model_type": "granite",
    "architectures": ["GraniteForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _run(cmd: list[str], cache: str, timeout_s: int) -> dict:
    env = {**os.environ, "MEMFIT_CACHE_DIR": cache}
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc: int | str = done.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    return {"cmd": " ".join(cmd[3:]), "rc": rc, "wall_s": round(time.perf_counter() - started, 2)}


def _per_estimate_ms(model: str, cache: str, n: int = 20) -> dict:
    """Evaluate a cached form at n batch sizes in this process: milliseconds per estimate."""
    os.environ["MEMFIT_CACHE_DIR"] = cache
    from memfit.estimate.derived import estimate_derived
    from memfit.hardware import get_gpu
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    source, gpu = resolve_model(model), get_gpu("L4")
    w = WorkloadSpec(mode="train", batch_size=1, seq_len=4096, precision="bf16")
    estimate_derived(source, w, gpu=gpu)  # loads the form
    times = []
    for b in range(2, 2 + n):
        started = time.perf_counter()
        estimate_derived(source, WorkloadSpec(mode="train", batch_size=b, seq_len=4096,
                                              precision="bf16"), gpu=gpu)  # fmt: skip
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {"n": n, "median_ms": round(times[n // 2], 2), "max_ms": round(times[-1], 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", default="benchmarks/results/fastpath_speed.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    model = str(work / "qwen3-8b-shape.json")
    Path(model).write_text(json.dumps({**QWEN3_8B_SHAPE, "num_hidden_layers": args.layers}))
    cache = str(work / "cache")
    py = [sys.executable, "-m", "memfit"]
    plan = [*py, "plan", model, "--gpu", "L4", "--seq", "4096", "--global-batch", "32", "--json"]
    fit = [*py, "fit", model, "--gpu", "L4", "--seq", "4096", "--solve", "batch", "--json",
           "--precision", "bf16", "--checkpointing", "full"]  # fmt: skip
    results = {
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start "
        "(shared with other work)",
        "layers": args.layers,
        "fit_cold": _run(fit, cache, args.timeout),
        "fit_warm": _run(fit, cache, args.timeout),
        "plan_cold": _run(plan, cache, args.timeout),
        "plan_warm": _run(plan, cache, args.timeout),
        "per_estimate": _per_estimate_ms(model, cache),
        "load_average_end": round(os.getloadavg()[0], 1),
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
