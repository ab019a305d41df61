"""Speed of the derived engine (issue 11): whole-process `plan` and `fit --solve batch` on a model
type with no hand-written program, cold (empty form cache) and warm, and the per-estimate cost of
a built form. Writes ``benchmarks/results/fastpath_speed.md`` and ``.json``.

    PYTHONPATH=src python benchmarks/fastpath_speed.py [--layers 36] [--skip-plan]

The model is a Qwen3-8B-shaped config (hidden 4096, 32 heads / 8 KV heads, head 128, MLP 12288,
vocab 151936, ``--layers`` layers) written with model_type ``granite``, which has no analytic
program (the bundled Qwen3 configs now have one), so `auto` takes the derived engine. Each command
runs as a fresh process (imports included), as a user would run it, with its own empty
``MEMFIT_CACHE_DIR`` for the cold run; warm runs are measured twice. The machine is shared: the
1-minute load average before and after each run is written next to its time, with the CPU time
the process itself used (user + system, from ``os.wait4``), which load does not inflate as much.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

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


def _run(cmd: list[str], cache: str, timeout_s: int) -> dict[str, Any]:
    env = {**os.environ, "MEMFIT_CACHE_DIR": cache, "PYTHONPATH": str(ROOT / "src")}
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        out, rc = "", f"killed at the {timeout_s} s limit"
    wall = time.perf_counter() - started
    usage = _child_cpu_s()
    summary: dict[str, Any] = {}
    try:
        data = json.loads(out)
        summary = {k: data.get(k) for k in ("search_engine", "max_batch", "n_estimates")}
        if "recommended" in data:
            rec = data.get("recommended") or {}
            summary["recommended"] = rec.get("settings") or rec.get("describe") or bool(rec)
    except ValueError:
        pass
    return {
        "cmd": " ".join(cmd[2:]),
        "rc": rc,
        "wall_s": round(wall, 2),
        "cpu_s": round(usage, 2),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        **{k: v for k, v in summary.items() if v is not None},
    }


_CPU_SEEN = [0.0]


def _child_cpu_s() -> float:
    """CPU seconds (user + system) of the children waited for since the last call."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = ru.ru_utime + ru.ru_stime
    used, _CPU_SEEN[0] = total - _CPU_SEEN[0], total
    return used


def _per_estimate(model: str, cache: str, workload: dict[str, Any], n: int = 15) -> dict:
    """A built form evaluated at ``n`` batch sizes in this process: milliseconds per estimate,
    and how one replay splits (live-bytes peaks, their breakdown, the allocator replay)."""
    os.environ["MEMFIT_CACHE_DIR"] = cache
    sys.path.insert(0, str(ROOT / "src"))
    from memfit.estimate import derived
    from memfit.estimate.derived import estimate_derived
    from memfit.estimate.derived import form as F
    from memfit.estimate.device import allocator_workspaces
    from memfit.hardware import get_gpu
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    source, gpu = resolve_model(model), get_gpu("L4")
    started = time.perf_counter()
    estimate_derived(source, WorkloadSpec(**workload, batch_size=1), gpu=gpu)
    load_ms = (time.perf_counter() - started) * 1000
    times = []
    for b in range(2, 2 + n):
        started = time.perf_counter()
        estimate_derived(source, WorkloadSpec(**workload, batch_size=b), gpu=gpu)
        times.append((time.perf_counter() - started) * 1000)
    form = next(iter(derived._FORMS.values()))
    run = form["runs"][0]
    sizes = F.sizes_at(run, 4)
    marks = {int(i): str(p) for i, p in run["marks"]}
    ws = allocator_workspaces(gpu, training=True)
    t0 = time.perf_counter()
    peaks = F._phase_peaks(run["ev"], sizes, marks)
    t1 = time.perf_counter()
    F._snapshots(run["ev"], sizes, marks, peaks)
    t2 = time.perf_counter()
    F._reserved(run["ev"], sizes, ws)
    t3 = time.perf_counter()
    return {
        "n": n,
        "n_events": len(run["ev"]),
        "first_in_process_ms": round(load_ms, 1),
        "median_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
        "split_ms": {
            "phase_peaks": round((t1 - t0) * 1000, 1),
            "breakdown": round((t2 - t1) * 1000, 1),
            "allocator_replay": round((t3 - t2) * 1000, 1),
        },
        "load_average": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--skip-plan", action="store_true")
    ap.add_argument("--plan-timeout", type=int, default=1800, help="seconds per plan run")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    model = str(work / "qwen3-8b-shape.json")
    Path(model).write_text(json.dumps({**QWEN3_8B_SHAPE, "num_hidden_layers": args.layers}))
    py = [sys.executable, "-m", "memfit"]
    fit = [*py, "fit", model, "--gpu", "L4", "--seq", "4096", "--solve", "batch", "--json",
           "--precision", "bf16", "--checkpointing", "full", "--lora-rank", "16",
           "--quant", "nf4"]  # fmt: skip
    plan = [*py, "plan", model, "--gpu", "L4", "--seq", "4096", "--global-batch", "32", "--json"]
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other work",
        "python": platform.python_version(),
        "layers": args.layers,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    _child_cpu_s()
    fit_cache = str(work / "cache-fit")
    workload = {"mode": "train", "seq_len": 4096, "precision": "bf16", "checkpointing": "full",
                "lora_rank": 16, "quant": "nf4"}  # fmt: skip
    steps: list[tuple[str, Any]] = [
        ("fit_cold", lambda: _run(fit, fit_cache, args.timeout)),
        ("fit_warm", lambda: _run(fit, fit_cache, args.timeout)),
        ("fit_warm_again", lambda: _run(fit, fit_cache, args.timeout)),
        ("per_estimate", lambda: _per_estimate(model, fit_cache, workload)),
    ]
    if not args.skip_plan:
        plan_cache = str(work / "cache-plan")
        steps += [
            ("plan_cold", lambda: _run(plan, plan_cache, args.plan_timeout)),
            ("plan_warm", lambda: _run(plan, plan_cache, args.plan_timeout)),
            ("plan_warm_again", lambda: _run(plan, plan_cache, args.plan_timeout)),
        ]
    for name, step in steps:
        if name.startswith("plan_warm") and not isinstance(results["plan_cold"]["rc"], int):
            results[name] = {"skipped": "the cold plan did not finish: no warm cache to time"}
            _write(results)
            continue
        results[name] = step()
        results["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        _write(results)  # after each run: a cut-short benchmark keeps what it measured
    print(json.dumps(results, indent=2))


def _write(results: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fastpath_speed.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "fastpath_speed.md").write_text(_markdown(results))


def _markdown(r: dict[str, Any]) -> str:
    lines = [
        "# Derived-engine speed (issue 11)",
        "",
        "Written by `PYTHONPATH=src python benchmarks/fastpath_speed.py` "
        f"(started {r['started_utc']} UTC, finished {r['finished_utc']} UTC). "
        f"Machine: {r['machine']}. Model: a Qwen3-8B-shaped config with model_type `granite` "
        f"(no analytic program), {r['layers']} layers, seq 4096, L4. Targets: cold <= 20 s, "
        "warm <= 3 s, <= 5 ms per estimate.",
        "",
        "Wall time is the whole process as a user runs it; CPU is the process's own user + "
        "system time. Load: 1-minute load average before / after the run (2 cores; other "
        "sessions were running).",
        "",
        "| run | command | rc | wall s | CPU s | load before / after | answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in ("fit_cold", "fit_warm", "fit_warm_again", "plan_cold", "plan_warm",
                "plan_warm_again"):  # fmt: skip
        if key not in r:
            continue
        x = r[key]
        if "skipped" in x:
            lines.append(f"| {key} | | | | | | skipped: {x['skipped']} |")
            continue
        answer = ", ".join(
            f"{k}={x[k]}" for k in ("search_engine", "max_batch", "n_estimates", "recommended")
            if k in x
        )  # fmt: skip
        lines.append(
            f"| {key} | `{x['cmd']}` | {x['rc']} | {x['wall_s']} | {x['cpu_s']} | "
            f"{x['load_before']} / {x['load_after']} | {answer} |"
        )
    pe = r.get("per_estimate")
    if pe is None:
        return "\n".join([*lines, ""])
    lines += [
        "",
        f"Per estimate, form built ({pe['n_events']} events), {pe['n']} batch sizes in one "
        f"process: median {pe['median_ms']} ms, max {pe['max_ms']} ms (first in the process, "
        f"loading the form: {pe['first_in_process_ms']} ms); one replay splits into "
        + ", ".join(f"{k} {v} ms" for k, v in pe["split_ms"].items())
        + f" (load average {pe['load_average']}).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
