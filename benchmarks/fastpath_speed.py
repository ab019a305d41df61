"""Speed of the derived engine (issue 11): whole-process `plan` and `fit --solve batch` on a model
type with no hand-written program, cold (empty form cache) and warm, and the per-estimate cost of
a built form. Writes ``benchmarks/results/fastpath_speed.md`` and ``.json``.

    PYTHONPATH=src python benchmarks/fastpath_speed.py [--layers 36] [--parts fit,plan]

(``--parts estimate``: the per-estimate rows alone, after the one cold fit that builds their form.)

The model is a Qwen3-8B-shaped config (hidden 4096, 32 heads / 8 KV heads, head 128, MLP 12288,
vocab 151936, ``--layers`` layers) written with model_type ``granite``, which has no analytic
program (the bundled Qwen3 configs now have one), so `auto` takes the derived engine. Each command
runs as a fresh process (imports included), as a user would run it, with its own empty
``MEMFIT_CACHE_DIR`` for the cold run; warm runs are measured twice. A warm run reads the derived
forms and the trace engine's answers (``trace_cached``: how many of the plan's trace-engine
answers came from the trace cache, :mod:`memfit.estimate.trace_cache`) the cold run kept.
Child processes read bytecode compiled before the first run, as an installed package has it
(pip compiles what it installs): ``compileall`` over memfit's ``src`` and the environment's
site-packages, in place (a no-op for files already compiled), even where the caller sets
``PYTHONDONTWRITEBYTECODE``. (Before 2026-12-06 the children kept their bytecode under a fresh
``PYTHONPYCACHEPREFIX`` holding memfit's only, so each cold run also compiled the torch,
transformers and peft modules it imported: about 10 s of a cold run that a user never pays.)

The fits: QLoRA (nf4, r16, full checkpointing, seq 4096) under the default precision (bf16-mixed)
on an L4, where not even batch 1 fits (the trace: 21.9 GB allocated), so that fit is one
estimate, answered from batch 1's own traces without the whole form (derived/first.py); the same
job on an H100-80GB right after it (``fit_h100_after_l4``: the search needs the whole form,
built then from the L4 run's cache, which holds batch 1's form only; then warm: the GPU is not
part of the form's key), and under ``bf16-true`` on the H100, which search. ``--parts`` runs a
subset and keeps the other parts' results from the last run in the files. The machine is
shared: the 1-minute load average before and after each run is written next to its time, with
the CPU time the process itself used (user + system, from ``getrusage``), which load does not
inflate as much.
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


def _env(cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    return {**env, "MEMFIT_CACHE_DIR": cache, "PYTHONPATH": str(ROOT / "src")}


def _compile_bytecode(work: Path) -> None:
    """Bytecode for memfit and the environment's site-packages, in place, before any timed run
    (what ``pip install`` leaves; files already compiled are only checked)."""
    import sysconfig

    paths = {str(ROOT / "src"), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *sorted(paths)],
                   env=_env(str(work)), check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip


def _run(cmd: list[str], cache: str, timeout_s: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
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
        guided = [n for n in data.get("notes", []) if str(n).startswith("search: ")]
        if guided:
            summary["guided"] = guided[0].split(" cheap probes")[0].removeprefix("search: ")
        if "recommended" in data:
            rec = data.get("recommended") or {}
            summary["recommended"] = rec.get("changes") or bool(rec)
            search = data.get("search") or {}
            summary["n_estimates"] = search.get("n_estimated")
            summary["search_s"] = search.get("search_s")
            kept = [n for n in data.get("notes", []) if str(n).startswith("trace cache: ")]
            if kept:  # "12 of the 12": trace-engine answers read from memfit's trace cache
                summary["trace_cached"] = kept[0].split(" trace-engine")[0][len("trace cache: ") :]
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


def _timed(fn: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def _per_estimate(model: str, cache: str, workload: dict[str, Any], gpu_name: str) -> dict:
    """A built form evaluated in this process at 12 batch sizes: milliseconds per exact estimate
    and per guide probe (wall and CPU), how one exact estimate splits (live-bytes peaks and
    their breakdown; the allocator replay), and the reference event-by-event replay."""
    os.environ["MEMFIT_CACHE_DIR"] = cache
    sys.path.insert(0, str(ROOT / "src"))
    from memfit.estimate import derived
    from memfit.estimate.allocator import fast as allocator_fast
    from memfit.estimate.allocator import jit as allocator_jit
    from memfit.estimate.derived import estimate_derived, guide_derived
    from memfit.estimate.derived import form as F
    from memfit.estimate.derived.compiled import Compiled, compile_run
    from memfit.estimate.device import allocator_workspaces
    from memfit.hardware import get_gpu
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    source, gpu = resolve_model(model), get_gpu(gpu_name)
    replays_before = dict(allocator_fast.REPLAYS)
    _, first_ms, first_cpu = _timed(
        lambda: estimate_derived(source, WorkloadSpec(**workload, batch_size=1), gpu=gpu)
    )
    exact, guide, exact_cpu, guide_cpu, worst = [], [], [], [], 0.0
    for b in range(2, 14):
        w = WorkloadSpec(**workload, batch_size=b)
        g, ms, cpu = _timed(lambda w=w: guide_derived(source, w, gpu=gpu))
        guide.append(ms)
        guide_cpu.append(cpu)
        e, ms, cpu = _timed(lambda w=w: estimate_derived(source, w, gpu=gpu))
        exact.append(ms)
        exact_cpu.append(cpu)
        assert g.peak_allocated_bytes == e.peak_allocated_bytes
        worst = max(worst, abs(g.peak_reserved_bytes / e.peak_reserved_bytes - 1))
    form = next(iter(derived._FORMS.values()))
    run = form["runs"][0]
    ws = allocator_workspaces(gpu, training=True)
    c = compile_run(run)
    split = [_timed(lambda: c.flat(20, ws, reserved=False)) for _ in range(5)]
    peaks_ms, peaks_cpu = (statistics.median(t[i] for t in split) for i in (1, 2))
    sizes = c.sizes(21)
    split = [_timed(lambda: c.reserved_bytes(sizes, ws)) for _ in range(5)]
    alloc_ms, alloc_cpu = (statistics.median(t[i] for t in split) for i in (1, 2))
    # loading the form (what a warm `plan` does per form): reading the cache's JSON, compiling
    # a run's structure to arrays (derived/compiled.py), fresh each time
    key = next(iter(derived._FORMS))
    split = [_timed(lambda: derived.cache.load(key)) for _ in range(5)]
    read_ms, read_cpu = (statistics.median(t[i] for t in split) for i in (1, 2))
    split = [_timed(lambda: Compiled(run)) for _ in range(5)]
    compile_ms, compile_cpu = (statistics.median(t[i] for t in split) for i in (1, 2))
    replays = {k: v - replays_before[k] for k, v in allocator_fast.REPLAYS.items()}
    _, ref_ms, ref_cpu = _timed(lambda: F.replay_run(run, 22, ws))
    # the same exact estimates with the Python replay (MEMFIT_NO_JIT=1): the fallback's cost
    os.environ["MEMFIT_NO_JIT"] = "1"
    py_exact, py_cpu = [], []
    for b in range(2, 8):
        w = WorkloadSpec(**workload, batch_size=b)
        _, ms, cpu = _timed(lambda w=w: estimate_derived(source, w, gpu=gpu))
        py_exact.append(ms)
        py_cpu.append(cpu)
    del os.environ["MEMFIT_NO_JIT"]
    med = statistics.median
    return {
        "replay": allocator_jit.describe(),
        "replays_run": replays,
        "python_replay_exact_median_ms": round(med(py_exact), 1),
        "python_replay_exact_median_cpu_ms": round(med(py_cpu), 1),
        "gpu": gpu_name,
        "workload": workload,
        "n": len(exact),
        "n_events": len(run["ev"]),
        "first_in_process_ms": round(first_ms, 1),
        "first_in_process_cpu_ms": round(first_cpu, 1),
        "exact_median_ms": round(med(exact), 1),
        "exact_median_cpu_ms": round(med(exact_cpu), 1),
        "exact_max_ms": round(max(exact), 1),
        "guide_median_ms": round(med(guide), 2),
        "guide_median_cpu_ms": round(med(guide_cpu), 2),
        "guide_max_ms": round(max(guide), 2),
        "guide_worst_reserved_error": round(worst, 4),
        "split_ms": {
            "peaks_and_breakdown": round(peaks_ms, 2),
            "allocator_replay": round(alloc_ms, 2),
        },
        "split_cpu_ms": {
            "peaks_and_breakdown": round(peaks_cpu, 2),
            "allocator_replay": round(alloc_cpu, 2),
        },
        "form_load_ms": {"read_json": round(read_ms, 1), "compile_run": round(compile_ms, 1)},
        "form_load_cpu_ms": {"read_json": round(read_cpu, 1), "compile_run": round(compile_cpu, 1)},
        "reference_replay_ms": round(ref_ms, 1),
        "reference_replay_cpu_ms": round(ref_cpu, 1),
        "load_average": round(os.getloadavg()[0], 1),
    }


_JIT_PROBE = """
import time
t0, c0 = time.perf_counter(), time.process_time()
from memfit.estimate.allocator import jit as allocator_jit
events = [("a", i, 4096 * (1 + i % 300)) for i in range(3000)] + [("f", i, 0) for i in range(3000)]
t1, c1 = time.perf_counter(), time.process_time()
allocator_jit.load_kernel()
t2, c2 = time.perf_counter(), time.process_time()
got = allocator_jit.replay_events(events)
if got is None:  # no kernel: the Python replay, timed the same way
    from memfit.estimate.allocator.fast import simulate_default_python
    simulate_default_python(events)
t3, c3 = time.perf_counter(), time.process_time()
print(allocator_jit.describe(), got is not None, round(t2 - t1, 3), round(c2 - c1, 3),
      round(t3 - t2, 4), round(c3 - c2, 4), round(t3 - t0, 3))
"""


def _jit_first_call(work: Path) -> dict[str, Any]:
    """The compiled replay's first use in a fresh process: loading the kernel (importing numba,
    compiling or loading the machine code), then one 6000-event replay; with an empty numba
    cache, then with the cache that run left (``NUMBA_CACHE_DIR`` in a fresh folder, so the
    user's cache is not touched), then with the Python replay (``MEMFIT_NO_JIT=1``)."""
    cache = work / "numba-cache"
    out: dict[str, Any] = {}
    for name, extra in (("cold_cache", {"NUMBA_CACHE_DIR": str(cache)}),
                        ("warm_cache", {"NUMBA_CACHE_DIR": str(cache)}),
                        ("python", {"MEMFIT_NO_JIT": "1"})):  # fmt: skip
        load = os.getloadavg()[0]
        env = {**_env(str(work / "cache-jit")), **extra}
        proc = subprocess.run([sys.executable, "-c", _JIT_PROBE], env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip
        words = proc.stdout.strip().rsplit(" ", 6)
        ok = len(words) == 7
        out[name] = {
            "replay": words[0] if ok else proc.stderr[-300:],
            "kernel_answered": words[1] == "True" if ok else None,
            "load_kernel_wall_s": float(words[2]) if ok else None,
            "load_kernel_cpu_s": float(words[3]) if ok else None,
            "first_replay_wall_s": float(words[4]) if ok else None,
            "first_replay_cpu_s": float(words[5]) if ok else None,
            "process_wall_s": float(words[6]) if ok else None,
            "process_cpu_s": round(_child_cpu_s(), 2),
            "load_before": round(load, 1),
        }
    return out


QLORA = ["--seq", "4096", "--solve", "batch", "--json", "--checkpointing", "full",
         "--lora-rank", "16", "--quant", "nf4"]  # fmt: skip
QLORA_WORKLOAD = {"mode": "train", "seq_len": 4096, "checkpointing": "full", "lora_rank": 16,
                  "quant": "nf4"}  # fmt: skip
#: The runs of the ``fit`` part: (name, GPU, precision, cache: a fresh one or a named earlier run's)
FITS = [
    ("fit_cold", "L4", "bf16", "new"),
    ("fit_warm", "L4", "bf16", "fit_cold"),
    ("fit_warm_again", "L4", "bf16", "fit_cold"),
    ("fit_h100_after_l4", "H100-80GB", "bf16", "fit_cold"),
    ("fit_h100_warm", "H100-80GB", "bf16", "fit_cold"),
    ("fit_true_h100_cold", "H100-80GB", "bf16-true", "new"),
    ("fit_true_h100_warm", "H100-80GB", "bf16-true", "fit_true_h100_cold"),
    ("fit_true_h100_warm_again", "H100-80GB", "bf16-true", "fit_true_h100_cold"),
]
ROWS = [name for name, *_ in FITS] + ["plan_cold", "plan_warm", "plan_warm_again"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--parts", default="fit,plan", help="comma-separated: fit, plan, jit, estimate")
    ap.add_argument("--plan-timeout", type=int, default=1800, help="seconds per plan run")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    work = Path(tempfile.mkdtemp())
    _compile_bytecode(work)
    model = str(work / "qwen3-8b-shape.json")
    Path(model).write_text(json.dumps({**QWEN3_8B_SHAPE, "num_hidden_layers": args.layers}))
    py = [sys.executable, "-m", "memfit"]
    plan = [*py, "plan", model, "--gpu", "L4", "--seq", "4096", "--global-batch", "32", "--json"]
    old = RESULTS / "fastpath_speed.json"
    results: dict[str, Any] = json.loads(old.read_text()) if old.exists() else {}
    if results.get("layers") != args.layers:
        results = {}
    if "exact_median_ms" not in results.get("per_estimate", {"exact_median_ms": 0}):
        del results["per_estimate"]  # written by the benchmark before the guided search
    results.update({
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other work",
        "python": platform.python_version(),
        "layers": args.layers,
    })  # fmt: skip
    _child_cpu_s()
    steps: list[tuple[str, Any]] = []
    caches: dict[str, str] = {}
    if "fit" in parts:
        for name, gpu, precision, cache in FITS:
            caches[name] = str(work / f"cache-{name}") if cache == "new" else caches[cache]
            cmd = [*py, "fit", model, "--gpu", gpu, "--precision", precision, *QLORA]
            steps.append((name, lambda c=cmd, d=caches[name]: _run(c, d, args.timeout)))
        workload = {**QLORA_WORKLOAD, "precision": "bf16-true"}
        steps.append(("jit_first_call", lambda: _jit_first_call(work)))
        steps.append(("per_estimate", lambda: _per_estimate(
            model, caches["fit_true_h100_cold"], workload, "H100-80GB")))  # fmt: skip
    if "estimate" in parts and "fit" not in parts:  # the per-estimate rows alone: one cold fit
        name, gpu, precision, _ = next(f for f in FITS if f[0] == "fit_true_h100_cold")
        caches[name] = str(work / f"cache-{name}")
        cmd = [*py, "fit", model, "--gpu", gpu, "--precision", precision, *QLORA]
        steps.append((name, lambda c=cmd, d=caches[name]: _run(c, d, args.timeout)))
        workload = {**QLORA_WORKLOAD, "precision": "bf16-true"}
        steps.append(("per_estimate", lambda: _per_estimate(
            model, caches["fit_true_h100_cold"], workload, "H100-80GB")))  # fmt: skip
    if "jit" in parts and "fit" not in parts:
        steps.append(("jit_first_call", lambda: _jit_first_call(work)))
    if "plan" in parts:
        plan_cache = str(work / "cache-plan")
        steps += [
            ("plan_cold", lambda: _run(plan, plan_cache, args.plan_timeout)),
            ("plan_warm", lambda: _run(plan, plan_cache, args.plan_timeout)),
            ("plan_warm_again", lambda: _run(plan, plan_cache, args.plan_timeout)),
        ]
    for name, step in steps:
        if name.startswith("plan_warm") and not isinstance(results["plan_cold"]["rc"], int):
            results[name] = {"skipped": "the cold plan did not finish: no warm cache to time"}
            _write(results, merge=tuple(n for n, _ in steps))
            continue
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        results[name] = {**step(), "started_utc": started}
        # after each run: a cut-short benchmark keeps what it measured
        _write(results, merge=("machine", "python", "layers", *(n for n, _ in steps)))
    print(json.dumps(results, indent=2))


def _write(results: dict[str, Any], *, merge: tuple[str, ...] = ()) -> None:
    """Write the results; ``merge``: this run's rows, kept over the file's (a concurrent run of
    another part may have written its own rows since this one started)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "fastpath_speed.json"
    if merge and path.exists():
        on_disk = json.loads(path.read_text())
        if on_disk.get("layers") == results.get("layers"):
            results = {**on_disk, **{k: results[k] for k in merge if k in results}}
    path.write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "fastpath_speed.md").write_text(_markdown(results))


def _markdown(r: dict[str, Any]) -> str:
    lines = [
        "# Derived-engine speed (issue 11)",
        "",
        "Written by `PYTHONPATH=src python benchmarks/fastpath_speed.py` (each row says when it "
        f"started, UTC). Machine: {r['machine']}. Model: a Qwen3-8B-shaped config with "
        f"model_type `granite` (no analytic program), {r['layers']} layers, seq 4096. Targets: "
        "cold <= 20 s, warm <= 3 s, <= 5 ms per estimate.",
        "",
        "Wall time is the whole process as a user runs it; CPU is the process's own user + "
        "system time. Load: 1-minute load average before / after the run (2 cores; other "
        "sessions were running).",
        "",
        "| run | command | rc | wall s | CPU s | load before / after | started | answer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = ("search_engine", "max_batch", "n_estimates", "guided", "search_s", "trace_cached",
            "recommended")  # fmt: skip
    for key in ROWS:
        if key not in r:
            continue
        x = r[key]
        if "skipped" in x:
            lines.append(f"| {key} | | | | | | | skipped: {x['skipped']} |")
            continue
        answer = ", ".join(f"{k}={x[k]}" for k in keys if k in x)
        lines.append(
            f"| {key} | `{x['cmd']}` | {x['rc']} | {x['wall_s']} | {x['cpu_s']} | "
            f"{x['load_before']} / {x['load_after']} | {x.get('started_utc', '')} | {answer} |"
        )
    pe = r.get("per_estimate")
    if pe is None:
        return "\n".join([*lines, ""])
    lines += [
        "",
        f"Per estimate, form built ({pe['n_events']} events; {pe['workload']} on "
        f"{pe['gpu']}), {pe['n']} batch sizes in one process (load average "
        f"{pe['load_average']}; wall / CPU):",
        "",
        f"- exact estimate (live-bytes peaks, breakdown and the allocator replay): median "
        f"{pe['exact_median_ms']} / {pe['exact_median_cpu_ms']} ms, max {pe['exact_max_ms']} ms "
        f"wall (first in the process, loading and compiling the form: "
        f"{pe['first_in_process_ms']} / {pe['first_in_process_cpu_ms']} ms);",
        f"- one exact estimate splits into peaks and breakdown "
        f"{pe['split_ms']['peaks_and_breakdown']} / {pe['split_cpu_ms']['peaks_and_breakdown']}"
        f" ms and the allocator replay {pe['split_ms']['allocator_replay']} / "
        f"{pe['split_cpu_ms']['allocator_replay']} ms; the reference event-by-event replay of "
        f"the same form (the evaluator before, with today's allocator loop) "
        f"{pe['reference_replay_ms']} / {pe['reference_replay_cpu_ms']} ms;",
    ]
    if "form_load_ms" in pe:
        load, load_cpu = pe["form_load_ms"], pe["form_load_cpu_ms"]
        lines.append(
            f"- loading the form (as a warm `plan` does for each): reading its JSON "
            f"{load['read_json']} / {load_cpu['read_json']} ms, compiling the run's structure "
            f"to arrays {load['compile_run']} / {load_cpu['compile_run']} ms;"
        )
    lines += [
        f"- guide probe (exact peaks and breakdown, reserved bytes interpolated between the "
        f"exact replays made so far): median {pe['guide_median_ms']} / "
        f"{pe['guide_median_cpu_ms']} ms, max {pe['guide_max_ms']} ms wall; its reserved "
        f"bytes within {100 * pe['guide_worst_reserved_error']:.2f} % of the exact replay's "
        "here (a probe only leads the search: the answer and the value after it are replayed "
        "exactly).",
    ]
    if "replay" in pe:
        lines += [
            f"- the allocator replay that ran: {pe['replay']} ({pe['replays_run']} replays in "
            f"the process; a process loads the kernel at its fourth long replay, inside one "
            f"of these estimates: the max above); with the Python replay instead "
            f"(`MEMFIT_NO_JIT=1`) an exact estimate takes a median "
            f"{pe['python_replay_exact_median_ms']} / "
            f"{pe['python_replay_exact_median_cpu_ms']} ms.",
        ]
    jit = r.get("jit_first_call")
    if jit:
        lines += ["", "The compiled replay's first use in a fresh process (loading the kernel: "
                  "import numba, compile or load the machine code; then one 6000-event replay; "
                  "wall / CPU seconds):", ""]  # fmt: skip
        for name in ("cold_cache", "warm_cache", "python"):
            x = jit.get(name, {})
            lines.append(
                f"- {name.replace('_', ' ')}: {x.get('replay')}: loading "
                f"{x.get('load_kernel_wall_s')} / {x.get('load_kernel_cpu_s')} s, first replay "
                f"{x.get('first_replay_wall_s')} / {x.get('first_replay_cpu_s')} s, process "
                f"{x.get('process_wall_s')} s wall, {x.get('process_cpu_s')} s CPU (load "
                f"{x.get('load_before')});"
            )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
