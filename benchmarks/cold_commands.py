"""Whole cold processes: the README's examples and the commonest commands, timed (issue 32).

Each command runs as ``python -m memfit ...`` in a new process with a fresh, empty answers
cache (``MEMFIT_CACHE_DIR`` set to a new temporary folder: no trace answer, derived form or
diffusion trace kept from before), then once more with the same folder (``--repeat``: what a
user's second run of the same command costs — a cache hit where the first run traced). The
numba kernel's machine code is not in that folder (memfit keeps it beside its own code,
``estimate/allocator/kernel_cache.py``): a first use compiles it in a background process and
the command answers with the Python replay meanwhile (``estimate/allocator/jit.py``).

Per run: wall seconds, the child's peak RSS (``wait4``), the exit code, and the ``engine:`` line
of the text output (which engine answered and whether the trace confirmed it). Writes
``benchmarks/results/cold_commands.json`` and ``.md`` (quoted in docs/performance.md).

    PYTHONPATH=src .venv/bin/python benchmarks/cold_commands.py               # every command
    PYTHONPATH=src .venv/bin/python benchmarks/cold_commands.py --only 0,1,5 --repeat
    PYTHONPATH=src .venv/bin/python benchmarks/cold_commands.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

#: README's examples (README.md, "Quick start"; the ones that need a file, a hub download or
#: user code left out) and the commonest commands.
COMMANDS: tuple[str, ...] = (
    "--help",
    "models",
    "gpus",
    "estimate llama-3.1-8b --lora-rank 16 --seq 2048 --precision bf16-true --gpu L4",
    "estimate llama-3.1-8b --batch 2 --seq 4096 --gpu H100",
    "estimate llama-3.1-8b --batch 2 --seq 4096 --precision bf16-true --gpu H100",
    "estimate mistral-7b-v0.1 --lora-rank 16 --checkpointing full --gpu L4",
    "estimate qwen3-0.6b --lora-rank 16 --lora-targets q,v --seq 4096 --gpu L4",
    "estimate llama-3.1-8b --mode infer --seq 8192 --new-tokens 256 --gpu L40S",
    "estimate qwen3-8b --lora-rank 16 --seq 4096 --gpu L4",
    "estimate deepseek-v2-lite --mode infer --seq 4096 --new-tokens 64 --gpu L40S",
    "estimate vit-base-patch16-224 --image-size 384 --batch 32",
    "estimate whisper-small --batch 16 --seq 448 --checkpointing full",
    "estimate flux.1-dev --mode infer --pipeline-offload model --gpu L4",
    "estimate flux.1-dev --mode infer --gpu L4",
    "estimate llama-3.1-8b --quant nf4-dq --lora-rank 16 --checkpointing full --seq 4096 --gpu L4",
    "estimate llama-2-7b --gpus 8 --shard zero3 --seq 4096 --gpu H100",
    "estimate llama-3.1-70b --engine analytic --mode infer --quant int4-awq",
    "estimate gpt-oss-20b --mode infer --gpu H100",
    "estimate llama-3.2-1b --lora-rank 16 --batch 4 --seq-dist 300,250,1024 --gpu L4",
    "fit llama-3.2-1b --solve batch --lora-rank 16 --seq-dist 300,250,1024 --gpu L4",
    "plan llama-3.1-8b --gpu L4 --seq 4096 --global-batch 16",
    "plan llama-3.1-8b --gpu L4 --seq 4096 --global-batch 16 --lora-rank 16 --allow quant",
    "plan llama-3.1-8b --gpu T4 --seq 2048 --global-batch 16 --lora-rank 16 --quant nf4-dq",
    "fit llama-3.1-8b --gpu A100-80GB --solve batch --seq 4096 --lora-rank 16",
    "upgrade llama-3.1-8b --gpu T4 --seq 4096",
    "vllm llama-3.1-8b --gpu L40S --max-model-len 8192",
    "doctor llama-3.1-8b --gpu L4 --sized-by weights",
    "estimate gpt2 --batch 2 --seq 256 --gpu T4",
    "estimate qwen2.5-7b --lora-rank 16 --seq 2048 --gpu L4",
    # what `auto` answered command 3 with before issue 32 (one trace), for the comparison
    "estimate llama-3.1-8b --lora-rank 16 --seq 2048 --precision bf16-true --gpu L4 --engine trace",
    "estimate llama-3.1-8b --lora-rank 16 --seq 2048 --precision bf16-true --gpu L4 --confirm",
    # issue 32: `plan` <= 5 s cold for bundled models; README's other plan examples
    "plan llama-3.2-1b --gpu L4 --seq 2048 --global-batch 8",
    "plan qwen2.5-7b --gpu L4 --seq 2048 --global-batch 16 --lora-rank 16",
    "plan mistral-7b-v0.1 --gpu A100-80GB --seq 4096 --global-batch 16",
    "plan qwen3-8b --gpu H100 --seq 4096 --global-batch 32 --lora-rank 16",
    "plan gemma-2-9b --gpu L40S --seq 2048 --global-batch 16 --lora-rank 16",
    "plan flux.1-dev --mode infer --gpu RTX-3060",
    "plan llama-3.2-1b --lora-rank 16 --batch 4 --seq-dist 300,250,1024 --gpu L4",
    "plan llama-3.1-8b --recommend-gpu --rank cost --seq 4096 --global-batch 16",
    # added 2026-12-07 (evening): FSDP2 and fp16 inference on the fast path, the tight plan
    "estimate llama-3.1-8b --gpus 8 --shard fsdp --seq 4096 --gpu H200",
    "estimate llama-3.2-1b --mode infer --seq 4096 --gpu T4",
    "plan qwen3-8b --gpu L4 --seq 1024 --global-batch 1 --lora-rank 16",
)


def run_once(args: str, cache_dir: str) -> dict[str, Any]:
    """One whole process of ``python -m memfit ARGS`` with ``cache_dir`` as its answers cache."""
    env = {**os.environ, "MEMFIT_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT / "src")}
    env.pop("MEMFIT_NO_CACHE", None)
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "memfit", *shlex.split(args)],
            stdout=out_f,
            stderr=err_f,
            text=True,
            env=env,
            cwd=ROOT,
        )
        _pid, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
        wall_s = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    rss_mib = usage.ru_maxrss / 1024
    engine = next((line.strip() for line in out.splitlines() if line.startswith("engine")), "")
    why = [line.strip() for line in out.splitlines() if line.strip().startswith(("why:", "conf"))]
    return {
        "wall_s": round(wall_s, 2),
        # the child's user + system CPU seconds: what the command costs, less sensitive than
        # wall seconds to the other work on a shared machine
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "rss_mib": rss_mib,
        "rc": proc.returncode,
        "engine": " | ".join([engine, *why])[:300],
        "stderr_tail": err.strip().splitlines()[-1][:200] if err.strip() else "",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated indices of COMMANDS (--list shows them)")
    p.add_argument("--repeat", action="store_true", help="run each command again, warm cache")
    p.add_argument("--list", action="store_true", help="list the commands with their indices")
    p.add_argument("--out", type=Path, default=RESULTS / "cold_commands")
    args = p.parse_args(argv)
    if args.list:
        for i, c in enumerate(COMMANDS):
            print(f"{i:3d}  memfit {c}")
        return 0
    picked = [int(i) for i in args.only.split(",")] if args.only else list(range(len(COMMANDS)))
    rows = []
    for i in picked:
        with tempfile.TemporaryDirectory(prefix="memfit-cold-") as cache_dir:
            row: dict[str, Any] = {"index": i, "command": f"memfit {COMMANDS[i]}"}
            row["cold"] = run_once(COMMANDS[i], cache_dir)
            if args.repeat:
                row["repeat"] = run_once(COMMANDS[i], cache_dir)
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_end": round(os.getloadavg()[0], 1),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "argv": sys.argv[1:],
    }  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(render(meta, rows))
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Cold commands: whole processes, fresh answers cache (issue 32)",
        "",
        f"Written by `benchmarks/cold_commands.py {' '.join(meta['argv'])}` at commit "
        f"{meta['commit']}, {meta['written']}; python {meta['python']}, {meta['cpus']} CPUs "
        f"shared with other work (load average at the end: {meta['load_average_end']}). "
        "`cold`: a new process with an empty `MEMFIT_CACHE_DIR`; `repeat`: the same command "
        "again with that cache. RSS: the process's peak resident memory.",
        "",
        "| # | command | cold s | cold RSS MiB | repeat s | exit | engine (why; confirmed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, rep = r["cold"], r.get("repeat")
        rss = "—" if c["rss_mib"] is None else f"{c['rss_mib']:.0f}"
        again = "—" if rep is None else f"{rep['wall_s']:.2f}"
        lines.append(
            f"| {r['index']} | `{r['command']}` | {c['wall_s']:.2f} | {rss} | {again} | {c['rc']} "
            f"| {c['engine'] or '—'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
