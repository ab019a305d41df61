"""Throughput of `memfit web`'s API on analytic estimates (a benchmark, not a test).

Starts the server on a free loopback port (the same app and worker pool `memfit web` runs), sends
analytic estimates over HTTP for a fixed number of requests, from 1 and from 2 concurrent
clients, and reports estimates per second and latency percentiles. Each request runs
`memfit estimate ... --json` in a worker. Jobs cycle through 40 combinations of bundled models
and shapes (16 of them do not fit, and their "nearest change that fits" is searched); a worker
keeps the nearest change it searched per job (memfit.plan.nearest), so a repeated job that does
not fit is answered without a second search. ``--unique`` gives every request its own job (the
sequence is one token shorter per cycle of 40), so no kept answer serves any request: the cold
search's cost. Target: at least 20 analytic estimates per second on a 2-core machine. Writes
benchmarks/results/web_api_speed.md (``--output`` another file).

``--workload mix`` (issue 32) sends what users send instead: distinct jobs (:func:`mix_queries`:
8 bundled models from 0.6B to 9B, inference, LoRA with checkpointing, QLoRA, full fine-tunes, on
5 GPUs from 24 to 80 GB; no two requests of a pass share a job), for each engine on a server
started for it with an empty answers cache (``MEMFIT_CACHE_DIR`` a fresh folder): a cold pass
(the server's first requests: its workers' first imports and reads), a pass of other new jobs on
the now warm server, the cold pass's jobs again (repeats: kept traces and nearest changes
answer them) and new jobs from 2 clients. Each row says how many answers each engine gave,
how many did not fit (the nearest-change search) and how many the trace confirmed. Writes
benchmarks/results/web_api_mix.md.

``--workload mix --in-process`` runs the same jobs through the command line's handler in this
process instead (what one worker does per request, without HTTP), with their CPU time: on a
shared machine the wall time of a pass moves with the other work, the CPU time much less.

    PYTHONPATH=src python benchmarks/web_api_speed.py              # 200 requests per run
    PYTHONPATH=src python benchmarks/web_api_speed.py --requests 40 --unique
    PYTHONPATH=src python benchmarks/web_api_speed.py --workload mix --requests 40
    PYTHONPATH=src python benchmarks/web_api_speed.py --workload mix --in-process --requests 40
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from memfit.cli import build_parser
from memfit.cli import main as memfit_main
from memfit.web.serve import running

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "web_api_speed.md"
MIX_OUTPUT = ROOT / "benchmarks" / "results" / "web_api_mix.md"
MODELS = ("gpt2", "llama-3.2-1b", "llama-3.1-8b", "mistral-7b-v0.1", "qwen3-0.6b")
TARGET_PER_S = 20.0
TARGET_DEFAULT_PER_S = 100.0


def queries(n: int, engine: str = "analytic", *, unique: bool = False, start: int = 0) -> list[str]:
    """``engine``: the ``engine=`` parameter; ``auto`` leaves it out (the default engine).
    ``unique``: no two requests (from ``start`` on, across calls) share a job."""
    out = []
    param = "" if engine == "auto" else f"engine={engine}&"
    for i in range(start, start + n):
        model = MODELS[i % len(MODELS)]
        # gpt2 holds 1024 positions: a unique job is one token shorter per cycle of 40
        batch, seq = 1 + i % 8, 256 * (1 + i % 4) - ((i // 40) % 128 if unique else 0)
        out.append(f"model={model}&{param}batch={batch}&seq={seq}&precision=bf16&gpu=A100-80GB")
    return out


#: The mix's models (bundled, 0.6B to 9B), kinds of job and GPUs (24 to 80 GB).
MIX_MODELS = (
    "qwen3-0.6b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "qwen2.5-7b",
    "llama-3.1-8b",
    "mistral-7b-v0.1",
    "gemma-2-9b",
    "qwen3-8b",
)
MIX_KINDS = {  # no precision: the default (bf16-true); "bf16": bf16-mixed (AMP)
    "infer": "mode=infer&batch={b2}&seq={seq}&new-tokens=256",
    "lora": "batch={b}&seq={seq}&lora-rank=16&checkpointing=full",
    "qlora": "batch={b}&seq={seq}&lora-rank=16&quant=nf4&checkpointing=full",
    "full": "batch={b}&seq={seq}&precision=bf16",
    "chat": "mode=infer&batch={b}&seq={seq2}&new-tokens=512",
}
MIX_GPUS = ("RTX-4090", "L4", "A100-80GB", "H100-80GB", "A100-40GB")


def mix_queries(n: int, engine: str = "auto", *, start: int = 0) -> list[str]:
    """Jobs ``start`` to ``start + n`` of the mix: job ``i`` is kind ``i % 5``, model
    ``(i // 5) % 8``, GPU ``(i // 40) % 5``, batch 1-8, sequence 512-4096 (8 tokens shorter per
    200 jobs), so any 5 jobs in a row are one of each kind and no two of the first 12 800 are
    the same job."""
    param = "" if engine == "auto" else f"engine={engine}&"
    out = []
    kinds = list(MIX_KINDS.values())
    for i in range(start, start + n):
        cycle = i // 200
        b = 1 + (3 * i + cycle) % 8
        seq = (512, 1024, 2048, 4096)[(i // 5) % 4] - 8 * (cycle % 64)
        job = kinds[i % len(kinds)].format(b=b, b2=2 * b, seq=seq, seq2=seq // 2)
        model = MIX_MODELS[(i // len(kinds)) % len(MIX_MODELS)]
        gpu = MIX_GPUS[(i // 40) % len(MIX_GPUS)]
        out.append(f"model={model}&{param}{job}&gpu={gpu}")
    return out


def fetch(url: str) -> float:
    return fetch_answer(url)[0]


def fetch_answer(url: str) -> tuple[float, str]:
    """The request's latency and what answered it: the engine, "+nearest" for a job that does
    not fit (its nearest change was searched or kept), "+confirmed" where the trace confirmed;
    "HTTP 503" / "HTTP 504" where the server was busy or the job ran past its time."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=600) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:  # say which job, and what the server answered
        if exc.code in (503, 504):  # busy / ran past its time: an answer the user sees, counted
            return time.perf_counter() - t0, f"HTTP {exc.code}"
        text = exc.read().decode(errors="replace")[:300]
        raise RuntimeError(f"{url}: HTTP {exc.code}: {text}") from None
    dt = time.perf_counter() - t0
    what = str(body.get("engine"))
    if body.get("confirmed"):
        what += "+confirmed"
    if "nearest_fit" in body:
        what += "+nearest"
    return dt, what


def run(
    base: str,
    n: int,
    clients: int,
    engine: str = "analytic",
    *,
    unique: bool = False,
    start: int = 0,
) -> dict[str, Any]:
    urls = [f"{base}/api/estimate?{q}" for q in queries(n, engine, unique=unique, start=start)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        latencies = sorted(ex.map(fetch, urls))
    wall = time.perf_counter() - t0
    return {
        "engine": engine,
        "clients": clients,
        "requests": n,
        "wall_s": wall,
        "per_s": n / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
    }


def run_mix(base: str, n: int, clients: int, engine: str, start: int, name: str) -> dict[str, Any]:
    urls = [f"{base}/api/estimate?{q}" for q in mix_queries(n, engine, start=start)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        got = list(ex.map(fetch_answer, urls))
    wall = time.perf_counter() - t0
    latencies = sorted(dt for dt, _ in got)
    return {
        "engine": engine,
        "pass": name,
        "clients": clients,
        "requests": n,
        "distinct": len(set(urls)),
        "wall_s": wall,
        "per_s": n / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "answers": Counter(what for _, what in got),
    }


def mix_main(args: argparse.Namespace) -> None:
    """The mix's passes for each engine (module docstring), each engine on its own server."""
    rows = []
    load_before = os.getloadavg()[0]
    for engine in args.engines.split(","):
        n = args.auto_requests if engine == "auto" and args.auto_requests else args.requests
        with tempfile.TemporaryDirectory() as cache:
            os.environ["MEMFIT_CACHE_DIR"] = cache  # the spawned workers read it
            with running(run=memfit_main, parser_factory=build_parser, n_workers=2) as base:
                rows.append(run_mix(base, n, 1, engine, 0, "cold server, new jobs"))
                rows.append(run_mix(base, n, 1, engine, n, "warm server, new jobs"))
                rows.append(run_mix(base, n, 1, engine, 0, "warm server, repeats"))
                rows.append(run_mix(base, n, 2, engine, 2 * n, "warm server, new jobs"))
    kinds = ", ".join(MIX_KINDS)
    auto_n = f" --auto-requests {args.auto_requests}" if args.auto_requests else ""
    lines = [
        "# Web API speed: a mix of distinct jobs",
        "",
        f"`PYTHONPATH=src python benchmarks/web_api_speed.py --workload mix --requests "
        f"{args.requests}{auto_n} --engines {args.engines}` on {platform.machine()} "
        f"({os.cpu_count()} logical CPUs, shared with other work), Python "
        f"{sys.version.split()[0]}, at commit {_commit()}. "
        "Each request: `GET /api/estimate?...` over HTTP to the `memfit web` app (uvicorn, 2 "
        "worker processes running `memfit estimate ... --json`). Jobs: "
        f"{', '.join(MIX_MODELS)}; kinds {kinds} (`mix_queries`: batch 1-8, sequence "
        f"512-4096; the default precision, bf16-true, but for the full fine-tunes' bf16, i.e. "
        f"bf16-mixed); GPUs {', '.join(MIX_GPUS)}. Each engine gets its own server with an "
        "empty answers cache (`MEMFIT_CACHE_DIR`): a cold pass (the server's first requests), "
        "other new jobs on the warm server, the cold pass's jobs again (repeats), new jobs from "
        "2 clients; no job of a new-jobs pass was sent before. `auto` sends no `engine=` (the "
        "default engine); the server runs at most one job that may trace at a time, and every "
        "`auto` job may. Answers: which engine answered, `+nearest` where the job does not fit "
        "(the nearest change that fits is searched, or kept from an earlier search), "
        "`+confirmed` where the trace confirmed the analytic answer, `HTTP 503` where the "
        "job waited past the server's 30 s for the one trace slot (`HTTP 504`: ran past its "
        "time). Load average (1 min) "
        f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| engine | pass | clients | requests (distinct) | wall s | estimates / s | p50 ms "
        "| p95 ms | answers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        answers = ", ".join(f"{k} {v}" for k, v in sorted(r["answers"].items()))
        lines.append(
            f"| {r['engine']} | {r['pass']} | {r['clients']} | {r['requests']} "
            f"({r['distinct']}) | {r['wall_s']:.2f} | {r['per_s']:.1f} | {r['p50_ms']:.1f} | "
            f"{r['p95_ms']:.1f} | {answers} |"
        )
    output = args.output or MIX_OUTPUT
    output.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_mix_in_process(n: int, engine: str, start: int, name: str) -> dict[str, Any]:
    """The mix's jobs ``start`` to ``start + n`` through :func:`memfit.cli.main` in this process
    (a worker's loop: :func:`memfit.web.workers.run_cli` on the argv :func:`build_job` makes),
    each job's wall and CPU time."""
    import urllib.parse

    from memfit.web.query import build_job
    from memfit.web.workers import run_cli

    parser = build_parser()
    rows = []
    for q in mix_queries(n, engine, start=start):
        job = build_job(
            parser, "estimate", urllib.parse.parse_qsl(q), pasted=None, allow_paths=True
        )
        t0, c0 = time.perf_counter(), time.process_time()
        code, out, _ = run_cli(list(job.argv), run=memfit_main, parser=parser)
        rows.append((time.perf_counter() - t0, time.process_time() - c0, code, out))
    cpu = [c for _, c, _, _ in rows]
    wall = sum(w for w, _, _, _ in rows)
    nearest = [c for _, c, _, out in rows if '"nearest_fit"' in out]
    return {
        "engine": engine,
        "pass": name,
        "requests": n,
        "wall_s": wall,
        "cpu_s": sum(cpu),
        "per_cpu_s": n / sum(cpu),
        "p50_cpu_ms": 1000 * statistics.median(cpu),
        "p95_cpu_ms": 1000 * sorted(cpu)[int(0.95 * (len(cpu) - 1))],
        "nearest": len(nearest),
        "nearest_cpu_ms": 1000 * statistics.mean(nearest) if nearest else 0.0,
        "others_cpu_ms": 1000 * (sum(cpu) - sum(nearest)) / max(n - len(nearest), 1),
    }


def mix_in_process_main(args: argparse.Namespace) -> None:
    """``--workload mix --in-process``: the mix's passes (new jobs, new jobs, repeats) in this
    process, with their CPU time (module docstring)."""
    load_before = os.getloadavg()[0]
    rows = []
    for engine in args.engines.split(","):
        n = args.requests
        with tempfile.TemporaryDirectory() as cache:
            os.environ["MEMFIT_CACHE_DIR"] = cache
            rows.append(run_mix_in_process(n, engine, 0, "first jobs (imports, first reads)"))
            rows.append(run_mix_in_process(n, engine, n, "new jobs"))
            rows.append(run_mix_in_process(n, engine, 2 * n, "new jobs"))
            rows.append(run_mix_in_process(n, engine, 0, "repeats of the first jobs"))
    lines = [
        "| engine | pass | jobs | wall s | CPU s | estimates / CPU s | p50 CPU ms | p95 CPU ms "
        "| does not fit: jobs, mean CPU ms | fits: mean CPU ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['pass']} | {r['requests']} | {r['wall_s']:.2f} | "
            f"{r['cpu_s']:.2f} | {r['per_cpu_s']:.1f} | {r['p50_cpu_ms']:.1f} | "
            f"{r['p95_cpu_ms']:.1f} | {r['nearest']}, {r['nearest_cpu_ms']:.0f} | "
            f"{r['others_cpu_ms']:.1f} |"
        )
    head = (
        f"`PYTHONPATH=src python benchmarks/web_api_speed.py --workload mix --in-process "
        f"--requests {args.requests} --engines {args.engines}` on {platform.machine()} "
        f"({os.cpu_count()} logical CPUs, shared with other work), Python "
        f"{sys.version.split()[0]}, this script at commit {_commit()}, memfit imported from "
        f"`{_memfit_src()}`: the mix's jobs (`mix_queries`, as "
        "`--workload mix` sends them) run one after another through `memfit estimate ... "
        "--json`'s handler in one process, as one `memfit web` worker runs them (no HTTP, one "
        "client), each with an empty answers cache at the start (`MEMFIT_CACHE_DIR`); CPU time "
        "is `time.process_time()` per job. Load average (1 min) "
        f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end."
    )
    text = "\n".join([f"## {args.title or 'in-process mix'}", "", head, "", *lines, ""])
    print(text)
    if args.output:
        with args.output.open("a") as f:
            f.write(text + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workload",
        choices=("grid", "mix"),
        default="grid",
        help="grid: 40 jobs of 5 models cycled (the first figures); mix: distinct jobs of "
        "every kind (mix_queries), cold and warm server, repeats",
    )
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument(
        "--engines",
        default="auto,analytic",
        help="comma-separated: auto (the default engine: no engine= parameter), analytic",
    )
    ap.add_argument(
        "--unique",
        action="store_true",
        help="every request its own job: no nearest change kept by a worker serves it",
    )
    ap.add_argument(
        "--auto-requests",
        type=int,
        default=None,
        help="--workload mix: requests per pass for the auto engine (default --requests): "
        "its new jobs that the fast path does not validate are traced, seconds each",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="--workload mix: the jobs through the CLI's handler in this process, with their "
        "CPU time (appended to --output under --title)",
    )
    ap.add_argument("--title", default="", help="--in-process: the section's title")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    if args.workload == "mix" and args.in_process:
        mix_in_process_main(args)
        return
    if args.workload == "mix":
        mix_main(args)
        return
    args.output = args.output or OUTPUT
    engines = args.engines.split(",")
    unique = " --unique" if args.unique else ""
    load_before = os.getloadavg()[0]  # the machine is shared: say how busy it was
    with running(run=memfit_main, parser_factory=build_parser, n_workers=2) as base:
        # warm-up: each worker imports memfit and reads the configs (with --unique on jobs
        # after the measured ones)
        after = args.requests * 2 * len(engines) if args.unique else 0
        for engine in engines:
            run(base, 10, 1, engine, unique=args.unique, start=after)
        rows, start = [], 0
        for e in engines:
            for c in (1, 2):
                rows.append(run(base, args.requests, c, e, unique=args.unique, start=start))
                start += args.requests if args.unique else 0
    lines = [
        "# Web API speed",
        "",
        f"`PYTHONPATH=src python benchmarks/web_api_speed.py --requests {args.requests} "
        f"--engines {args.engines}{unique}` on {platform.machine()} ({os.cpu_count()} logical "
        "CPUs, "
        f"shared with other work), Python {sys.version.split()[0]}, at commit {_commit()}. Each "
        "request: `GET /api/estimate?...` over HTTP to the `memfit web` app (uvicorn, 2 worker "
        "processes), which runs `memfit estimate ... --json` in a worker and returns its "
        "output; engine `auto` sends no `engine=` (the default engine: the analytic engine "
        "where the fast-path grid validates the job, docs/engines.md), `analytic` sends "
        f"`engine=analytic`. Models cycle through {', '.join(MODELS)}; batch 1-8, seq "
        f"256-1024, bf16, on A100-80GB: 40 distinct jobs, 16 of which do not fit (their nearest "
        "change that fits is searched, and kept by the worker that searched it); "
        + (
            "`--unique`: every request's sequence is one token shorter per cycle of 40 (runs "
            "start where the previous one ended), so no request repeats a job and no kept "
            "answer serves it. "
            if args.unique
            else "a repeated job that does not fit is answered from the worker's kept answer. "
        )
        + f"Target: >= {TARGET_PER_S:g} estimates/s "
        f"(issue 32: >= {TARGET_DEFAULT_PER_S:g} on the default engine). Load average (1 min) "
        f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| engine | clients | requests | wall s | estimates / s | p50 ms | p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['clients']} | {r['requests']} | {r['wall_s']:.2f} | "
            f"{r['per_s']:.1f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} |"
        )
    args.output.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _memfit_src() -> str:
    """Where memfit was imported from (a before/after pair runs this script on two trees)."""
    import memfit

    return str(Path(memfit.__file__).resolve().parents[1])


def _commit() -> str:
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=ROOT, check=False)  # fmt: skip
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
