"""Checkpointed (and LoRA) default answers as whole processes: which engine answered, whether the
trace confirmed, the verdict and the figures (issue 32, ``ckpt``).

Each command runs as ``python -m memfit ...`` in a new process with a fresh, empty answers cache
(``MEMFIT_CACHE_DIR``: a new temporary folder, so a confirmation traces), with the memfit source
tree ``--src`` (default: this checkout's ``src``; a copy of an older commit gives the "before"
column). Per run: wall seconds, CPU seconds, exit code, and from the text output the
``engine:`` / ``why:`` / ``confirmed:`` lines, peak allocated, peak reserved, device used and
the verdict line. Prints one JSON object per command; ``--out`` also writes them to a file.

    PYTHONPATH=src .venv/bin/python benchmarks/ckpt_confirm.py --out /tmp/after.jsonl
    git archive HEAD~3 src | tar -x -C /tmp/before
    PYTHONPATH=src .venv/bin/python benchmarks/ckpt_confirm.py --src /tmp/before/src
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: The issue's command first, then checkpointed jobs of each behaviour: LoRA with checkpointing
#: (class band below the wide top), a full fine-tune with checkpointing (class band above it),
#: one that straddles its GPU either way, a QLoRA job; then LoRA without checkpointing.
COMMANDS: tuple[str, ...] = (
    "estimate mistral-7b-v0.1 --lora-rank 16 --checkpointing full --gpu L4",
    "estimate llama-3.2-1b --lora-rank 16 --checkpointing full --batch 3 --seq 2048 --gpu L4",
    "estimate llama-3.2-1b --checkpointing full --batch 4 --seq 2048 --precision bf16-true "
    "--gpu A100-40GB",
    "estimate qwen3-1.7b --checkpointing full --batch 8 --seq 2048 --precision bf16-true "
    "--gpu A100-80GB",
    "estimate llama-3.1-8b --quant nf4-dq --lora-rank 16 --checkpointing full --seq 4096 --gpu L4",
    "estimate llama-3.1-8b --lora-rank 16 --seq 2048 --precision bf16-true --gpu L4",
)

_LINES = {
    "engine": r"^engine: (.*)$",
    "why": r"^\s*why: (.*)$",
    "confirmed": r"^\s*confirmed: (.*)$",
    "allocated": r"^peak allocated\s+(\S+ \S+)",
    "reserved": r"^peak reserved\s+(\S+ \S+)",
    "device": r"^device used\s+(\S+ \S+)\s+\[[^\]]*– (\S+ \S+)\]",
    "verdict": r"^verdict: (.*)$",
}


def parse(out: str) -> dict[str, Any]:
    """The lines of ``memfit estimate``'s text output this benchmark reports."""
    found: dict[str, Any] = {}
    for key, pattern in _LINES.items():
        m = re.search(pattern, out, flags=re.MULTILINE)
        if m is None:
            continue
        found[key] = m.group(1) if key != "device" else f"{m.group(1)} (upper {m.group(2)})"
    return found


def run_once(args: str, src: Path) -> dict[str, Any]:
    """One whole process of ``python -m memfit ARGS`` on the source tree ``src``."""
    with tempfile.TemporaryDirectory(prefix="memfit-ckpt-") as cache_dir:
        env = {**os.environ, "MEMFIT_CACHE_DIR": cache_dir, "PYTHONPATH": str(src)}
        env.pop("MEMFIT_NO_CACHE", None)
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "memfit", *shlex.split(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        out, err = proc.communicate()
        wall_s = time.perf_counter() - started
    return {
        "command": f"memfit {args}",
        "wall_s": round(wall_s, 2),
        "rc": proc.returncode,
        **parse(out),
        "stderr_tail": err.strip().splitlines()[-1][:200] if err.strip() else "",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", type=Path, default=ROOT / "src", help="the memfit source tree")
    p.add_argument("--only", help="comma-separated indices of COMMANDS")
    p.add_argument("--out", type=Path, help="also write the JSON lines here")
    args = p.parse_args(argv)
    picked = [int(i) for i in args.only.split(",")] if args.only else range(len(COMMANDS))
    lines = []
    for i in picked:
        row = {"index": i, "load_average": round(os.getloadavg()[0], 2)}
        row.update(run_once(COMMANDS[i], args.src.resolve()))
        lines.append(json.dumps(row))
        print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
