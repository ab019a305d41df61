"""Throughput of `memfit web`'s API on analytic estimates (a benchmark, not a test).

Starts the server on a free loopback port (the same app and worker pool `memfit web` runs), sends
analytic estimates over HTTP for a fixed number of requests, from 1 and from 2 concurrent
clients, and reports estimates per second and latency percentiles. Jobs vary across bundled
models and shapes so no answer is served from a cache (there is none; each request runs
`memfit estimate ... --json` in a worker). Target: at least 20 analytic estimates per second on a
2-core machine. Writes benchmarks/results/web_api_speed.md.

    PYTHONPATH=src python benchmarks/web_api_speed.py              # 200 requests per run
    PYTHONPATH=src python benchmarks/web_api_speed.py --requests 40
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
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


def queries(n: int, engine: str = "analytic") -> list[str]:
    """``engine``: the ``engine=`` parameter; ``auto`` leaves it out (the default engine)."""
    out = []
    param = "" if engine == "auto" else f"engine={engine}&"
    for i in range(n):
        model = MODELS[i % len(MODELS)]
        batch, seq = 1 + i % 8, 256 * (1 + i % 4)
        out.append(f"model={model}&{param}batch={batch}&seq={seq}&precision=bf16&gpu=A100-80GB")
    return out


def fetch(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return time.perf_counter() - t0


def run(base: str, n: int, clients: int, engine: str = "analytic") -> dict[str, Any]:
    urls = [f"{base}/api/estimate?{q}" for q in queries(n, engine)]
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
    args = ap.parse_args()
    engines = args.engines.split(",")
    with running(run=memfit_main, parser_factory=build_parser, n_workers=2) as base:
        for engine in engines:  # warm-up: each worker imports memfit and reads the configs
            run(base, 10, 1, engine)
        rows = [run(base, args.requests, c, e) for e in engines for c in (1, 2)]
    lines = [
        "# Web API speed",
        "",
        f"`PYTHONPATH=src python benchmarks/web_api_speed.py --requests {args.requests} "
        f"--engines {args.engines}` on {platform.machine()} ({os.cpu_count()} logical CPUs, "
        f"shared with other work), Python {sys.version.split()[0]}, at commit {_commit()}. Each "
        "request: `GET /api/estimate?...` over HTTP to the `memfit web` app (uvicorn, 2 worker "
        "processes), which runs `memfit estimate ... --json` in a worker and returns its "
        "output; engine `auto` sends no `engine=` (the default engine: the analytic engine "
        "where the fast-path grid validates the job, docs/engines.md), `analytic` sends "
        f"`engine=analytic`. Models cycle through {', '.join(MODELS)}; batch 1-8, seq "
        f"256-1024, bf16, on A100-80GB. Target: >= {TARGET_PER_S:g} estimates/s "
        f"(issue 32: >= {TARGET_DEFAULT_PER_S:g} on the default engine).",
        "",
        "| engine | clients | requests | wall s | estimates / s | p50 ms | p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['clients']} | {r['requests']} | {r['wall_s']:.2f} | "
            f"{r['per_s']:.1f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} |"
        )
    OUTPUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _commit() -> str:
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=ROOT, check=False)  # fmt: skip
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
