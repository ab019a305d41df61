"""Byte-for-byte behaviour snapshot: what memfit answers today, to hold a refactor to it.

Runs one group per wing of memfit, all but ``trace`` in 6-8 minutes on a shared 2-core machine
(``--only GROUP[,GROUP]`` runs a subset; ``--check`` then compares only those groups):
- ``analytic``: the analytic engine on every case of the analytic-vs-trace grid
  (``analytic_vs_trace.CASES``), keeping the whole ``MemoryEstimate.to_json()`` (every component,
  phase, range, note); torch-free, about a minute;
- ``trace``: the trace engine on the small models of that grid (``--trace``; a few minutes);
- ``cli``: the CLI's data commands (``plan``, ``fit``, ``upgrade``, ``doctor``, ``estimate``) with
  ``--json`` on a handful of text-model jobs;
- ``diffusion``: diffusion pipeline inference (``estimate PIPELINE --mode infer``, traced);
- ``diffusion_train``: diffusion training (``estimate`` / ``fit`` / ``plan`` ``--mode train``);
- ``vllm``: vLLM start-up (``memfit vllm``) and ``fit`` / ``plan`` / ``upgrade --runtime vllm``;
- ``llamacpp``: llama.cpp / Ollama start-up (``memfit llama-server``);
- ``seqdist``: variable-length runs (``--seq-dist`` on ``estimate``, ``fit``, ``plan``);
- ``check``: ``memfit check`` on the example job files of the tests and a ``vllm serve`` line;
- ``sglang``: SGLang start-up (``memfit sglang``), starts and fails;
- ``text``: the text renderings (no ``--json``) of a few of the above, lines' timings scrubbed.
Every CLI run keeps its exit code, stdout and stderr's tail, and runs from the repository root
(job files are named relative to it, so the snapshot holds from any checkout).

``--write FILE`` records the snapshot; ``--check FILE`` re-runs it and lists every difference
(exit 1 when anything moved). Wall times and the trace engine's timing notes are left out.

    .venv/bin/python benchmarks/behaviour_snapshot.py --write /tmp/before.json
    .venv/bin/python benchmarks/behaviour_snapshot.py --check /tmp/before.json
    .venv/bin/python benchmarks/behaviour_snapshot.py --check /tmp/before.json --only vllm,check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
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

#: Inputs of the runs below that no bundled name covers, relative to the repository root.
_FILES = "benchmarks/configs/snapshot"
_JOBS = "tests/jobfiles/examples"

#: Diffusion pipeline inference: each traces the pipeline's components (~10 s).
DIFFUSION_RUNS: list[str] = [
    "estimate flux.1-dev --mode infer --gpu L4",
    "estimate flux.1-dev --mode infer --pipeline-offload model --gpu L4",
    "estimate sdxl-base-1.0 --mode infer --pipeline-offload model --vae-tiling --gpu T4",
]

#: Diffusion training: one traced run (FLUX extrapolated from a few blocks) is ~15 s; ``fit`` on a
#: card the set-up phase overflows stops at its first probe, ``plan`` on an H100 stops after the
#: first three combinations (all fit).
DIFFUSION_TRAIN_RUNS: list[str] = [
    "estimate flux.1-dev --mode train --lora-rank 16 --resolution 512 --checkpointing full "
    "--gpu RTX-4090",
    "fit flux.1-dev --mode train --lora-rank 16 --resolution 512 --checkpointing full "
    "--solve batch --gpu RTX-4090",
    "plan flux.1-dev --mode train --lora-rank 16 --resolution 512 --gpu H100",
]

#: vLLM start-up (fast: no trace).
VLLM_RUNS: list[str] = [
    "vllm llama-3.1-8b --gpu L40S --max-model-len 8192",
    "vllm llama-3.1-70b --gpu L40S",  # does not start
    "vllm llama-3.1-70b --gpu H100 --tensor-parallel-size 4 --max-model-len 32768",
    "vllm qwen2.5-72b --gpu H100 --tp 4 --kv-cache-dtype fp8",
    "vllm llama-3.1-8b --gpu A100-40GB --vllm-version 0.6 --enforce-eager",
    "fit llama-3.1-8b --gpu L40S --solve concurrency --mode infer --seq 8192 --runtime vllm",
    "fit llama-3.1-8b --gpu L4 --solve max-model-len --runtime vllm",
    "plan llama-3.1-8b --gpu L40S --mode infer --seq 8192 --runtime vllm --concurrency 64",
    "plan llama-3.1-70b --mode infer --seq 8192 --runtime vllm --concurrency 32 --recommend-gpu",
    "upgrade llama-3.1-8b --gpu L4 --mode infer --seq 4096 --context 8192 --concurrency 16 "
    "--runtime vllm",
]

#: llama.cpp / Ollama (``memfit llama-server``; bundled configs with a file type and the shipped
#: GGUF header; no trace, milliseconds).
LLAMACPP_RUNS: list[str] = [
    "llama-server llama-3.1-8b:Q4_K_M --gpu RTX-3060 -c 16384",
    "llama-server llama-3.1-70b:Q4_K_M --gpu RTX-4090 -c 8192 -ngl 40 -fa off",  # partial offload
    "llama-server qwen2.5-7b:Q8_0 --gpu RTX-4090 -c 32768 -ctk q8_0 -ctv q8_0 -np 2",
    "llama-server gemma-3-12b --gpu L4 -c 32768 -np 1",  # sliding-window layers
    "llama-server llama-3.1-70b:Q4_0 --gpu RTX-3090 --gpus 2 -ts 3,2 -c 4096",
    "llama-server tests/fixtures/gguf/llama-3.2-1b-Q4_K_M.header.gguf --gpu T4 -c 8192",
]

#: Variable-length runs: the replay traces the step at a few lengths whatever ``--engine`` says
#: (about a minute for llama-3.2-1b, ``--engine analytic`` sizing its fixed shape); the others on
#: a 2-layer Llama with a 32k vocabulary (its fp32 logits make reserved memory grow over a run).
SEQDIST_RUNS: list[str] = [
    "estimate llama-3.2-1b --engine analytic --lora-rank 16 --batch 4 --seq-dist 300,250,1024 "
    "--gpu L4",
    f"estimate {_FILES}/llama-wide-vocab --precision bf16-true --lora-rank 4 --batch 4 "
    "--seq-dist 150,100,512 --run-steps 30 --gpu T4",
    f"fit {_FILES}/llama-wide-vocab --solve batch --precision bf16-true --lora-rank 4 "
    "--seq-dist 150,100,512 --run-steps 30 --gpu-memory 1380MiB",
    f"plan {_FILES}/llama-wide-vocab --lora-rank 4 --batch 2 --seq-dist 150,100,512 "
    "--run-steps 30 --gpu T4",
]

#: ``memfit check`` on job files (the torchtune recipe is traced through torchtune, ~30 s).
CHECK_RUNS: list[str] = [
    f"check {_JOBS}/axolotl-llama3-qlora.yml --gpu RTX-4090",
    f"check {_JOBS}/trl-sft-config.yaml --gpu RTX-4090",
    f"check {_JOBS}/trl-sft-config.yaml {_JOBS}/accelerate-fsdp2.yaml --gpu RTX-4090",
    f"check {_JOBS}/llamafactory-qwen3-lora-sft-otfq.yaml {_JOBS}/ds_z2_config.json --gpu RTX-4090",
    f"check {_JOBS}/torchtune-llama3_1-8B_qlora_single_device.yaml --gpu RTX-4090",
    f"check {_FILES}/vllm-serve.sh --gpu L40S",
]

#: Image and speech models: the job's media (``--image-size``, ``--audio-seconds``) through every
#: command that takes them (issue 28: the media are a field of the job, nothing else carries them).
MEDIA_RUNS: list[str] = [
    "estimate vit-base-patch16-224 --image-size 384 --batch 8 --gpu T4",
    "estimate detr-resnet-50 --mode infer --image-size 640 --gpu T4",
    "estimate whisper-large-v3 --mode infer --audio-seconds 95 --gpu L4",
    "fit vit-base-patch16-224 --image-size 384 --solve batch --gpu L4",
    "doctor whisper-large-v3 --audio-seconds 20 --mode infer --gpu T4",
]

#: Text renderings (no ``--json``): one per renderer, cheap jobs where the JSON groups have them.
TEXT_RUNS: list[str] = [
    "estimate gpt2 --batch 2 --seq 256 --gpu T4",
    "estimate mistral-7b-v0.1 --engine analytic --lora-rank 16 --checkpointing full --gpu L4",
    "plan opt-125m --gpu L4 --seq 512 --global-batch 8 --confirm none",
    "fit gpt2 --gpu T4 --solve concurrency --seq 512 --mode infer",
    "upgrade llama-3.1-8b --gpu T4 --seq 4096",
    "doctor gpt2 --gpu T4 --batch 64 --seq 1024",
    "estimate sd3.5-medium --mode infer --gpu T4",
    "estimate flux.1-dev --mode train --lora-rank 16 --resolution 512 --checkpointing full "
    "--optimizer adamw-8bit --gpu RTX-4090",
    "vllm llama-3.1-8b --gpu L40S --max-model-len 8192",
    f"check {_JOBS}/axolotl-llama3-qlora.yml --gpu RTX-4090",
    f"check {_FILES}/vllm-serve.sh --gpu L40S",
    f"estimate {_FILES}/llama-wide-vocab --precision bf16-true --lora-rank 4 --batch 4 "
    "--seq-dist 150,100,512 --run-steps 30 --gpu T4",
]

#: SGLang start-up: defaults by GPU and TP, MLA, fp8 KV, each way it fails.
SGLANG_RUNS = [
    "sglang llama-3.1-8b --gpu H100",
    "sglang llama-3.1-8b --gpu L4 --context-length 8192",
    "sglang llama-3.1-70b --gpu H200 --tp 8",
    "sglang deepseek-v3 --gpu H200 --tp 8 --kv-cache-dtype fp8_e4m3",
    "sglang qwen2.5-72b --gpu H100 --tp 4 --mem-fraction-static 0.9 --page-size 16",
    "sglang llama-3.1-8b --gpu L40S --mem-fraction-static 0.3",  # not enough memory
    "sglang llama-3.1-70b --gpu L4",  # weights do not load
    "sglang llama-3.1-8b --gpu H100 --context-length 1000000",  # refused before loading
]

#: The CLI groups: name -> (commands, --json or text).
CLI_GROUPS: dict[str, tuple[list[str], bool]] = {
    "diffusion": (DIFFUSION_RUNS, True),
    "diffusion_train": (DIFFUSION_TRAIN_RUNS, True),
    "vllm": (VLLM_RUNS, True),
    "llamacpp": (LLAMACPP_RUNS, True),
    "seqdist": (SEQDIST_RUNS, True),
    "check": (CHECK_RUNS, True),
    "media": (MEDIA_RUNS, True),
    "text": (TEXT_RUNS, False),
    "sglang": (SGLANG_RUNS, True),
}
GROUPS = ("analytic", "trace", "cli", *CLI_GROUPS)

#: Fields that measure the machine, not memfit's answer.
_VOLATILE = ("wall_s", "elapsed_s", "seconds", "time_s", "duration_s", "search_s", "confirm_s")


def _volatile(key: str, value: Any) -> bool:
    """How long memfit took (not what it answered: ``step_s`` is a predicted step time)."""
    return key.endswith(_VOLATILE)


def _scrub(value: Any) -> Any:
    if isinstance(value, str) and str(ROOT) in value:  # a checkout's path (library warnings)
        value = value.replace(str(ROOT), "<repo>")
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if not _volatile(str(k), v)}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, str) and "\n" in value:  # a text rendering, stderr: line by line
        return _scrub_text(value)
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


#: Timings in the text renderings: the engine line's "; 5.5 s", "traced in 5.5 s", a plan's
#: "(0.12 s)" and "3.4 s in all".
_TEXT_TIMING = re.compile(r"(?<=; )\d+(?:\.\d+)? s\b|(?<=traced in )\d+(?:\.\d+)? s\b"
                          r"|(?<=\()\d+(?:\.\d+)? s(?=\))|\d+(?:\.\d+)? s(?= in all)")  # fmt: skip


def _scrub_text(text: str) -> str:
    """Only the lines that say how long memfit took: the engine line, a plan's search line."""
    return "\n".join(
        _TEXT_TIMING.sub("<timing>", line)
        if line.startswith(("engine: ", "searched ")) or "traced in " in line
        else line
        for line in text.split("\n")
    )


def _cli(args: list[str], *, as_json: bool = True) -> dict[str, Any]:
    memfit_bin = Path(sys.executable).with_name("memfit")
    env = dict(os.environ, COLUMNS="120")
    run = subprocess.run(
        [str(memfit_bin), *args, *(["--json"] if as_json else [])],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    body: Any
    if as_json:
        try:
            body = _scrub(json.loads(run.stdout))
        except json.JSONDecodeError:
            body = _scrub(run.stdout)
    else:
        body = _scrub(run.stdout)
    return {"rc": run.returncode, "stdout": body, "stderr": _scrub(run.stderr.strip()[-2000:])}


def snapshot(trace: bool, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The groups of ``only`` (None: all but ``trace``, which ``trace`` adds)."""
    # what memfit answers, not what an earlier run left in the disk caches (trace answers read
    # back say so: trace["cached"], a plan note); children inherit it
    os.environ["MEMFIT_NO_CACHE"] = "1"
    wanted = set(only) if only is not None else {g for g in GROUPS if g != "trace" or trace}
    snap: dict[str, Any] = {}
    if "analytic" in wanted:
        snap["analytic"] = _estimates("analytic", None)
    if "trace" in wanted:
        snap["trace"] = _estimates("trace", TRACE_MODELS)
    if "cli" in wanted:
        snap["cli"] = {}
        for args in CLI_RUNS:
            print(f"  memfit {' '.join(args)}", file=sys.stderr, flush=True)
            snap["cli"][" ".join(args)] = _cli(args)
    for group, (runs, as_json) in CLI_GROUPS.items():
        if group not in wanted:
            continue
        snap[group] = {}
        for line in runs:
            print(f"  [{group}] memfit {line}", file=sys.stderr, flush=True)
            snap[group][line] = _cli(shlex.split(line), as_json=as_json)
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


def _groups(value: str) -> tuple[str, ...]:
    names = tuple(g.strip() for g in value.split(",") if g.strip())
    unknown = [g for g in names if g not in GROUPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown group(s) {', '.join(unknown) or '(none)'}; groups: {', '.join(GROUPS)}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="record the snapshot in FILE")
    group.add_argument(
        "--check", type=Path, help="compare with the snapshot in FILE (the groups it holds)"
    )
    parser.add_argument("--trace", action="store_true", help="also trace the small models")
    parser.add_argument(
        "--only",
        type=_groups,
        default=None,
        metavar="GROUP[,GROUP]",
        help=f"run only these groups ({', '.join(GROUPS)}); --check compares only them",
    )
    args = parser.parse_args()
    if args.write:
        snap = snapshot(args.trace, args.only)
        args.write.write_text(json.dumps(snap, indent=1, sort_keys=True))
        print(f"wrote {args.write} ({', '.join(snap)})")
        return 0
    before = _scrub(json.loads(args.check.read_text()))
    # the groups FILE holds (an older or an --only snapshot is checked on what it recorded)
    only = args.only or tuple(g for g in GROUPS if g in before or (g == "trace" and args.trace))
    missing = [g for g in only if g not in before]
    if args.only is not None and missing:
        print(f"{args.check} has no group {', '.join(missing)}", file=sys.stderr)
        return 2
    before = {g: before[g] for g in only if g in before}
    after = snapshot(args.trace or "trace" in before, only)
    diffs: list[str] = []
    _diff(before, after, "", diffs)
    for line in diffs:
        print(line)
    print(f"{len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
