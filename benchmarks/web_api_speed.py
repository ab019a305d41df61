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

    PYTHONPATH=src python benchmarks/web_api_speed.py              # 200 requests per run
    PYTHONPATH=src python benchmarks/web_api_speed.py --requests 40 --unique
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from memfit.cli import build_parser
from memfit.cli import main as memfit_main
from memfit.web.serve import running

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "web_api_speed.md"
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


def fetch(url: str) -> float:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
    except urllib.error.HTTPError as exc:  # say which job, and what the server answered
        body = exc.read().decode(errors="replace")[:300]
        raise RuntimeError(f"{url}: HTTP {exc.code}: {body}") from None
    return time.perf_counter() - t0


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    ap.add_argument("--output", type=Path, default=OUTPUT)
    args = ap.parse_args()
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


def _commit() -> str:
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=ROOT, check=False)  # fmt: skip
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
