"""Where a cold `fit` spends its time building a grown derived form (issue 11, "cold").

    PYTHONPATH=src python benchmarks/cold_build_profile.py [--workers 1,2] [--layers 36]

For each job (the QLoRA fits of benchmarks/fastpath_speed.py: the Qwen3-8B-shaped ``granite``
config, nf4, LoRA r16, full checkpointing, seq 4096, on an L4 under ``bf16`` and on an
H100-80GB under ``bf16-true``) and each worker setting (``MEMFIT_TRACE_WORKERS``: 1 traces in
one process, 2 lets the build fork a worker), one fresh process with its own empty
``MEMFIT_CACHE_DIR`` runs ``memfit fit`` in-process with the build's phases wrapped in timers
(wall and CPU of this process; a forked worker's CPU is counted in the process total, as
``getrusage`` of the children it waited for). Writes ``benchmarks/results/cold_build_profile.md``
and ``.json``; the 1-minute load average before and after each run is written next to it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

JOBS = [("L4", "bf16"), ("H100-80GB", "bf16-true")]
QLORA = ["--seq", "4096", "--solve", "batch", "--json", "--checkpointing", "full",
         "--lora-rank", "16", "--quant", "nf4"]  # fmt: skip


def _child(model: str, gpu: str, precision: str) -> dict[str, Any]:
    """One cold fit in this process, its phases timed."""
    t0w, t0c = time.perf_counter(), time.process_time()
    acc: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    traces: list[dict[str, Any]] = []

    def wrap(mod: Any, name: str, label: str) -> None:
        f = getattr(mod, name)

        @functools.wraps(f)
        def timed(*a: Any, **k: Any) -> Any:
            w, c = time.perf_counter(), time.process_time()
            try:
                return f(*a, **k)
            finally:
                e = acc[label]
                e[0] += time.perf_counter() - w
                e[1] += time.process_time() - c
                e[2] += 1
                if name == "_trace_once":
                    traces.append({"layers": a[4], "batch": a[1].batch_size,
                                   "wall_s": round(time.perf_counter() - w, 2),
                                   "cpu_s": round(time.process_time() - c, 2)})  # fmt: skip

        setattr(mod, name, timed)

    import memfit.cli as cli

    acc["import memfit.cli"] = [time.perf_counter() - t0w, time.process_time() - t0c, 1]
    w, c = time.perf_counter(), time.process_time()
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from memfit.estimate.derived import cache, grown, layers, record
    from memfit.estimate.trace import build, engine, quantized, steps

    acc["import torch, transformers, peft, the trace engine"] = [
        time.perf_counter() - w, time.process_time() - c, 1]  # fmt: skip
    wrap(build, "build_hf_model", "trace: build the model on meta")
    wrap(build, "apply_lora_", "trace: peft LoRA wrapping")
    wrap(quantized, "quantize_", "trace: nf4 stand-ins")
    wrap(build, "meta_to_fake_", "trace: meta -> fake parameters")
    wrap(steps, "example_inputs", "trace: inputs")
    wrap(steps, "run_train_steps", "trace: 2 train steps on fake tensors (tracker on)")
    wrap(engine, "flatten_trace", "trace: flatten")
    wrap(engine, "replay_reserved", "trace: allocator simulation (reserved bytes)")
    wrap(record.Recorder, "on_run", "trace: recorder keeps the run")
    wrap(engine, "_trace_once", "trace: whole (this process)")
    wrap(grown, "to_sequence", "grow: runs to sequences")
    wrap(layers, "learn", "grow: learn the layer rule")
    wrap(grown, "_full", "grow: grow to full depth")
    wrap(layers, "grow", "grow: layers.grow (all calls)")
    wrap(cache, "store", "form: write to the disk cache")
    wrap(grown, "record_grown", "record_grown (all)")
    out = sys.stdout
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    rc: Any = 0
    try:
        cli.main(["fit", model, "--gpu", gpu, "--precision", precision, *QLORA])
    except SystemExit as exc:
        rc = exc.code
    finally:
        sys.stdout = out
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    acc["whole process (this process)"] = [
        time.perf_counter() - t0w, time.process_time() - t0c, 1]  # fmt: skip
    return {
        "rc": rc,
        "phases": {
            k: {"wall_s": round(v[0], 2), "cpu_s": round(v[1], 2), "n": v[2]}
            for k, v in acc.items()
        },  # fmt: skip
        "traces_here": traces,
        "worker_cpu_s": round(kids.ru_utime + kids.ru_stime, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "GPU", "PRECISION"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(*args.child)))
        return
    from fastpath_speed import QWEN3_8B_SHAPE

    work = Path(tempfile.mkdtemp())
    model = work / "qwen3-8b-shape.json"
    model.write_text(json.dumps({**QWEN3_8B_SHAPE, "num_hidden_layers": args.layers}))
    rows = []
    for n in args.workers.split(","):
        for gpu, precision in JOBS:
            cache = work / f"cache-{gpu}-{precision}-{n}"
            env = {**os.environ, "MEMFIT_CACHE_DIR": str(cache), "MEMFIT_TRACE_WORKERS": n,
                   "PYTHONPATH": str(ROOT / "src")}  # fmt: skip
            load = os.getloadavg()[0]
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(model), gpu, precision],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            wall = time.perf_counter() - started
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({"gpu": gpu, "precision": precision, "workers": int(n),
                         "process_wall_s": round(wall, 2), "load_before": round(load, 1),
                         "load_after": round(os.getloadavg()[0], 1), **got})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, shared",
              "layers": args.layers, "rows": rows}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cold_build_profile.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
