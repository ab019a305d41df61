"""Byte-for-byte behaviour snapshot: what memfit answers today, to hold a refactor to it.

Runs, torch-free and in about a minute,
- the analytic engine on every case of the analytic-vs-trace grid (``analytic_vs_trace.CASES``),
  keeping the whole ``MemoryEstimate.to_json()`` (every component, phase, range, note);
- the trace engine on the small models of that grid (``--trace``; a few minutes);
- the CLI's data commands (``plan``, ``fit``, ``upgrade``, ``doctor``, ``estimate``) with
  ``--json`` on a handful of jobs, keeping exit code and output.

``--write FILE`` records the snapshot; ``--check FILE`` re-runs it and lists every difference
(exit 1 when anything moved). Wall times and the trace engine's timing notes are left out.

    .venv/bin/python benchmarks/behaviour_snapshot.py --write /tmp/before.json
    .venv/bin/python benchmarks/behaviour_snapshot.py --check /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.analytic_vs_trace import CASES  # noqa: E402

#: Small models of the grid, traced with ``--trace`` (seconds each on 2 cores).
TRACE_MODELS = ("gpt2", "qwen2.5-0.5b", "t5-small", "bloom-560m", "opt-350m", "bert-base-uncased")

#: CLI data commands: every search command on a few jobs (analytic search, no trace confirm
#: where ``--engine`` is not accepted the default policy runs).
CLI_RUNS: list[list[str]] = [
    ["estimate", "llama-3.2-1b", "--engine", "analytic", "--batch", "4", "--seq", "2048"],
    [
        "estimate",
        "llama-3.1-8b",
        "--engine",
        "analytic",
        "--mode",
        "infer",
        "--seq",
        "8192",
        "--new-tokens",
        "256",
        "--gpu",
        "L40S",
    ],
    [
        "estimate",
        "mistral-7b-v0.1",
        "--engine",
        "analytic",
        "--lora-rank",
        "16",
        "--checkpointing",
        "full",
        "--gpu",
        "L4",
    ],
    [
        "estimate",
        "llama-3.1-8b",
        "--engine",
        "analytic",
        "--quant",
        "nf4-dq",
        "--lora-rank",
        "16",
        "--checkpointing",
        "full",
        "--seq",
        "4096",
        "--gpu",
        "L4",
    ],
    [
        "estimate",
        "llama-2-7b",
        "--engine",
        "analytic",
        "--gpus",
        "8",
        "--shard",
        "zero3",
        "--seq",
        "4096",
        "--gpu",
        "H100",
    ],
    ["estimate", "gpt2", "--batch", "2", "--seq", "256", "--gpu", "T4"],
    [
        "plan",
        "llama-3.1-8b",
        "--gpu",
        "L4",
        "--seq",
        "4096",
        "--global-batch",
        "16",
        "--confirm",
        "none",
    ],
    ["plan", "opt-125m", "--gpu", "L4", "--seq", "512", "--global-batch", "8", "--confirm", "none"],
    [
        "plan",
        "llama-3.1-70b",
        "--gpu",
        "H100-80GB",
        "--gpus",
        "4",
        "--mode",
        "infer",
        "--seq",
        "8192",
        "--batch",
        "32",
        "--confirm",
        "none",
    ],
    [
        "fit",
        "qwen2.5-0.5b",
        "--gpu",
        "T4",
        "--solve",
        "batch",
        "--seq",
        "1024",
        "--lora-rank",
        "16",
    ],
    ["fit", "gpt2", "--gpu", "T4", "--solve", "concurrency", "--seq", "512", "--mode", "infer"],
    ["upgrade", "llama-3.1-8b", "--gpu", "T4", "--seq", "4096"],
    ["upgrade", "llama-3.1-8b", "--gpu", "L4", "--mode", "infer", "--seq", "4096"],
    ["doctor", "qwen2.5-0.5b", "--gpu", "T4", "--sized-by", "weights", "--seq", "1024"],
    ["doctor", "gpt2", "--gpu", "T4", "--batch", "64", "--seq", "1024"],
]

#: Fields that measure the machine, not memfit's answer.
_VOLATILE = ("wall_s", "elapsed_s", "seconds", "time_s", "duration_s", "search_s", "confirm_s")


def _volatile(key: str, value: Any) -> bool:
    """How long memfit took (not what it answered: ``step_s`` is a predicted step time)."""
    return key.endswith(_VOLATILE)


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if not _volatile(str(k), v)}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, str) and (" ms" in value or "traced in" in value):
        return "<timing>"
    return value


def _estimates(engine: str, models: tuple[str, ...] | None) -> dict[str, Any]:
    import memfit

    out: dict[str, Any] = {}
    for model, overrides, _ in CASES:
        if models is not None and model not in models:
            continue
        key = f"{engine} {model} {json.dumps(overrides, sort_keys=True)}"
        try:
            est = memfit.estimate(model, memfit.WorkloadSpec(**overrides), engine=engine)
            out[key] = _scrub(est.to_json())
        except memfit.MemfitError as exc:
            out[key] = {"error": type(exc).__name__, "message": str(exc)}
        print(f"  {key}", file=sys.stderr, flush=True)
    return out


def _cli(args: list[str]) -> dict[str, Any]:
    memfit_bin = Path(sys.executable).with_name("memfit")
    env = dict(os.environ, COLUMNS="120")
    run = subprocess.run(
        [str(memfit_bin), *args, "--json"], capture_output=True, text=True, env=env, check=False
    )
    try:
        body: Any = _scrub(json.loads(run.stdout))
    except json.JSONDecodeError:
        body = run.stdout
    return {"rc": run.returncode, "stdout": body, "stderr": run.stderr.strip()[-2000:]}


def snapshot(trace: bool) -> dict[str, Any]:
    # what memfit answers, not what an earlier run left in the disk caches (trace answers read
    # back say so: trace["cached"], a plan note); children inherit it
    os.environ["MEMFIT_NO_CACHE"] = "1"
    snap: dict[str, Any] = {"analytic": _estimates("analytic", None)}
    if trace:
        snap["trace"] = _estimates("trace", TRACE_MODELS)
    snap["cli"] = {}
    for args in CLI_RUNS:
        print(f"  memfit {' '.join(args)}", file=sys.stderr, flush=True)
        snap["cli"][" ".join(args)] = _cli(args)
    return snap


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: {'added' if k not in a else 'removed'}")
            else:
                _diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: {json.dumps(a)[:300]} -> {json.dumps(b)[:300]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="record the snapshot in FILE")
    group.add_argument("--check", type=Path, help="compare with the snapshot in FILE")
    parser.add_argument("--trace", action="store_true", help="also trace the small models")
    args = parser.parse_args()
    if args.write:
        args.write.write_text(json.dumps(snapshot(args.trace), indent=1, sort_keys=True))
        print(f"wrote {args.write}")
        return 0
    before = _scrub(json.loads(args.check.read_text()))
    after = snapshot(args.trace or "trace" in before)
    diffs: list[str] = []
    _diff(before, after, "", diffs)
    for line in diffs:
        print(line)
    print(f"{len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
