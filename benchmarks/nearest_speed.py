"""The "nearest change that fits" search's answers and speed on jobs that do not fit (issue 32).

``--record`` writes the answers of the code as it stands to tests/plan/data/nearest_answers.json
(``tests/plan/test_nearest_recorded.py`` compares every later search against them: recorded
once, from main's code before the search was made cheaper, so a faster search must give the
same answers). Without it: each job's in-process time, first as ``memfit estimate --engine
analytic`` answers it (the estimate, then its nearest change: one call of the CLI's handler,
imports done, nothing kept from an earlier job), written to benchmarks/results/nearest_speed.md.

    PYTHONPATH=src python benchmarks/nearest_speed.py --record
    PYTHONPATH=src python benchmarks/nearest_speed.py
    PYTHONPATH=src python benchmarks/nearest_speed.py --count

``--count``: each job's work in one search, counted rather than timed (the same on a busy
machine): the analytic engine's simulations (a training step or a generation of one workload)
and its block recordings (an embedding, layer or head run through the op graph, the rest kept).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "tests" / "plan" / "data" / "nearest_answers.json"
OUTPUT = ROOT / "benchmarks" / "results" / "nearest_speed.md"

#: (model, workload fields, GPU): jobs that do not fit, of every kind the search covers
#: (full fine-tunes, LoRA, QLoRA, inference, a data-parallel job), plus one it answers with
#: the command only (--compile) and one where nothing fits.
JOBS: list[tuple[str, dict[str, Any], str]] = [
    ("llama-3.1-8b", {"batch_size": 2, "seq_len": 4096, "precision": "bf16-mixed"}, "L4"),
    ("qwen3-0.6b", {"batch_size": 8, "seq_len": 4096, "precision": "bf16-mixed"}, "RTX-4090"),
    ("llama-3.2-3b", {"batch_size": 4, "seq_len": 2048, "precision": "bf16-mixed"}, "A100-40GB"),
    ("mistral-7b-v0.1", {"batch_size": 4, "seq_len": 1024, "precision": "bf16-mixed"}, "H100-80GB"),
    ("gemma-2-9b", {"batch_size": 2, "seq_len": 2048, "precision": "bf16-mixed"}, "A100-80GB"),
    (
        "qwen3-8b",
        {"batch_size": 8, "seq_len": 1024, "lora_rank": 16, "precision": "bf16-mixed"},
        "L4",
    ),
    (
        "mistral-7b-v0.1",
        {"batch_size": 8, "seq_len": 4096, "lora_rank": 16, "checkpointing": "full"},
        "RTX-4090",
    ),
    (
        "llama-3.1-8b",
        {"batch_size": 4, "seq_len": 2048, "lora_rank": 64, "lora_targets": ("q_proj", "v_proj")},
        "T4",
    ),
    (
        "gemma-2-9b",
        {"batch_size": 8, "seq_len": 4096, "lora_rank": 16, "quant": "nf4"}
        | {"checkpointing": "full"},
        "RTX-4090",
    ),
    (
        "qwen2.5-7b",
        {"batch_size": 4, "seq_len": 4096, "lora_rank": 16, "quant": "nf4", "prepare_kbit": True},
        "L4",
    ),
    (
        "llama-3.1-8b",
        {"batch_size": 4, "seq_len": 4096, "lora_rank": 16, "lora_dropout": 0.05}
        | {"lora_modules_to_save": ("embed_tokens", "lm_head")},
        "L4",
    ),
    (
        "qwen3-8b",
        {"batch_size": 4, "seq_len": 2048, "lora_rank": 16, "quant": "nf4", "prepare_kbit": True}
        | {"lora_dropout": 0.1},
        "T4",
    ),
    ("llama-3.1-8b", {"mode": "infer", "batch_size": 64, "seq_len": 4096, "new_tokens": 256}, "L4"),
    (
        "qwen3-8b",
        {"mode": "infer", "batch_size": 8, "seq_len": 16384, "new_tokens": 512},
        "A100-40GB",
    ),
    ("llama-3.1-8b", {"batch_size": 4, "seq_len": 2048, "gpus": 2}, "A100-40GB"),
    ("gemma-3-27b", {"batch_size": 1, "seq_len": 2048, "lora_rank": 16}, "RTX-4090"),
    ("llama-3.1-70b", {"batch_size": 1, "seq_len": 2048, "lora_rank": 16, "quant": "nf4"}, "L4"),
    (
        "llama-3.2-1b",
        {"batch_size": 8, "seq_len": 8192, "precision": "bf16-true", "compile": True},
        "L4",
    ),
]


def workload(fields: dict[str, Any]) -> Any:
    from memfit.spec import WorkloadSpec

    return WorkloadSpec(**{"mode": "train", **fields})


def answers() -> list[dict[str, Any]]:
    """Each job's nearest change (``NearestFit.to_json``), nothing kept between jobs."""
    from memfit.plan import nearest

    out = []
    for model, fields, gpu in JOBS:
        nearest._ANSWERS.clear()
        found = nearest.nearest_fit(model, workload(fields), gpu, model_name=model)
        out.append(
            {
                "model": model,
                "workload": fields,
                "gpu": gpu,
                "nearest_fit": None if found is None else found.to_json(),
            }
        )
    return out


def cli_args(model: str, fields: dict[str, Any], gpu: str) -> list[str]:
    """``memfit estimate`` arguments for the job (the flags as the CLI spells them)."""
    args = ["estimate", model, "--gpu", gpu, "--engine", "analytic", "--json"]
    for key, value in fields.items():
        flag = "--" + {"batch_size": "batch", "seq_len": "seq"}.get(key, key).replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, tuple):
            args += [flag, ",".join(value)]
        else:
            args += [flag, str(value)]
    return args


def forget() -> None:
    """Drop what the process keeps between jobs (kept answers, block profiles, candidate
    spaces, the last simulation): each timed job is a new one."""
    from memfit.estimate.analytic import api, distributed, engine
    from memfit.plan import nearest, search, space

    # (what a module does not have is skipped: the script also times main's code before)
    simulations = getattr(api, "_SIMULATIONS", getattr(api, "_LAST", {}))  # main's: _LAST
    for kept in (nearest._ANSWERS, engine._BLOCKS, simulations, space._SHARED_PARTS):
        kept.clear()
    for name in ("_JOB_KEYS", "_VIEWS"):
        getattr(engine, name, getattr(space, name, {})).clear()
    memos = (
        search.judged_candidates,
        getattr(search, "judged_stacks", None),  # (kept across batch sizes; not on main)
        getattr(distributed, "_gathered_walks", None),
    )
    for memo in memos:
        if memo is not None:
            memo.cache_clear()


def time_job(model: str, fields: dict[str, Any], gpu: str) -> tuple[float, float, float, float]:
    """(the search alone: wall, CPU; ``memfit estimate ... --engine analytic --json``
    in-process; the answer read back from the disk cache by a process that keeps nothing):
    seconds, wall but the one CPU time (the machine is shared: CPU time is what the search
    costs, wall what it took beside the other work)."""
    from memfit.cli import main
    from memfit.plan import nearest

    os.environ["MEMFIT_NO_CACHE"] = "1"  # searched: nothing read from the disk cache
    forget()
    t0, c0 = time.perf_counter(), time.process_time()
    nearest.nearest_fit(model, workload(fields), gpu, model_name=model)
    search_s, search_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    forget()
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(cli_args(model, fields, gpu))
    cli_s = time.perf_counter() - t0
    if code != 1 or "nearest_fit" not in json.loads(out.getvalue()):
        raise SystemExit(f"{model} {fields} on {gpu}: exit {code}, expected a does-not-fit answer")
    del os.environ["MEMFIT_NO_CACHE"]
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MEMFIT_CACHE_DIR"] = cache
        nearest.nearest_fit(model, workload(fields), gpu, model_name=model)  # kept on disk
        forget()
        t0 = time.perf_counter()
        nearest.nearest_fit(model, workload(fields), gpu, model_name=model)
        kept_s = time.perf_counter() - t0
        del os.environ["MEMFIT_CACHE_DIR"]
    return search_s, search_cpu_s, cli_s, kept_s


def speed(repeats: int) -> list[str]:
    time_job(*JOBS[0])  # imports and first reads, not timed
    rows = []
    for model, fields, gpu in JOBS:
        runs = [time_job(model, fields, gpu) for _ in range(repeats)]
        search_ms, cpu_ms, cli_ms, kept_ms = [
            1000 * statistics.median(r[i] for r in runs) for i in range(4)
        ]
        job = ", ".join(f"{k}={v}" for k, v in fields.items())
        rows.append(
            f"| {model} | {job} | {gpu} | {search_ms:.0f} | {cpu_ms:.0f} | {cli_ms:.0f} | "
            f"{kept_ms:.1f} |"
        )
    return rows


def count() -> list[str]:
    """Each job's simulations and block recordings in one search (nothing kept before it)."""
    import importlib

    api = importlib.import_module("memfit.estimate.analytic.api")
    engine = importlib.import_module("memfit.estimate.analytic.engine")
    from memfit.plan import nearest

    counts = {"simulate": 0, "_run_block": 0}

    def counted(module: Any, name: str) -> None:
        real = getattr(module, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        setattr(module, name, call)

    counted(api, "simulate")  # api's own name: estimate_many and _simulated call it
    counted(engine, "_run_block")
    os.environ["MEMFIT_NO_CACHE"] = "1"
    rows = []
    for model, fields, gpu in JOBS:
        forget()
        counts.update(simulate=0, _run_block=0)
        nearest.nearest_fit(model, workload(fields), gpu, model_name=model)
        job = ", ".join(f"{k}={v}" for k, v in fields.items())
        rows.append(f"| {model} | {job} | {gpu} | {counts['simulate']} | {counts['_run_block']} |")
    return rows


def commit() -> str:
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return got.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write the answers file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--count", action="store_true", help="count simulations, not time")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--title", default="", help="a section title (appended to --output)")
    args = parser.parse_args()
    if args.record:
        ANSWERS.write_text(json.dumps(answers(), indent=1) + "\n")
        print(f"wrote {ANSWERS}")
        return
    if args.count:
        import memfit

        text = "\n".join(
            [
                f"## {args.title or 'work per search'} (memfit from "
                f"`{Path(memfit.__file__).resolve().parents[1]}`, script at {commit()})",
                "",
                "`PYTHONPATH=src python benchmarks/nearest_speed.py --count`: one search per "
                "job (`nearest_fit`, `MEMFIT_NO_CACHE=1`, nothing kept from an earlier job); "
                "`simulations`: calls of the analytic engine's `simulate` (one workload's "
                "training step or generation); `block recordings`: embedding / layer / head "
                "blocks run through the op graph (the others were kept).",
                "",
                "| model | job | GPU | simulations | block recordings |",
                "|---|---|---|---|---|",
                *count(),
                "",
            ]
        )
        print(text)
        with args.output.open("a") as f:
            f.write(text + "\n")
        return
    load = os.getloadavg()[0]
    rows = speed(args.repeats)
    lines = [
        f"## {args.title or 'nearest change search'} (commit {commit()})",
        "",
        f"`PYTHONPATH=src python benchmarks/nearest_speed.py --repeats {args.repeats}` on "
        f"{platform.machine()} ({os.cpu_count()} logical CPUs, shared), Python "
        f"{platform.python_version()}; load average (1 min) {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end. In-process, imports done, nothing kept from "
        "an earlier job (kept answers, block profiles, candidate spaces dropped); median of "
        f"{args.repeats}. `search`: `memfit.plan.nearest.nearest_fit` alone; `estimate`: "
        "`memfit estimate MODEL ... --engine analytic --json` (the CLI's handler: the estimate "
        "and its nearest change), both with `MEMFIT_NO_CACHE=1`; `kept`: `nearest_fit` again "
        "after the process forgot it, read from the disk cache (`MEMFIT_CACHE_DIR`).",
        "",
        "| model | job | GPU | search ms | search CPU ms | estimate ms | kept ms |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    with args.output.open("a") as f:
        f.write(("" if args.output.exists() and args.output.stat().st_size else "") + text + "\n")


if __name__ == "__main__":
    main()
