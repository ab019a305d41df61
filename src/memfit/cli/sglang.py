"""``memfit sglang``: what ``python -m sglang.launch_server --model-path MODEL …`` will do on a
GPU (memfit.cli adds it by ``register``).

Flags are spelled as ``sglang.launch_server`` spells them (``server_args.py``), so a pasted
command line works; flags that do not change start-up memory (``--host``, ``--port``,
``--trust-remote-code``…) are accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from memfit import api
from memfit.cli.runtimes import print_not_modelled
from memfit.errors import NotModelledError, SpecError
from memfit.flags import count_at_most, finite_float, positive_int
from memfit.hardware.catalog import get_gpu
from memfit.jobflags import sglang_job
from memfit.report.sglang import render_sglang, sglang_json
from memfit.serving.sglang_command import launch_command
from memfit.spec.rules import MAX_GPUS

GPU_COUNT = count_at_most(MAX_GPUS, "GPUs (memfit.spec.rules.MAX_GPUS)")

SGLANG_EXAMPLES = """examples:
  memfit sglang llama-3.1-8b --gpu H100
  memfit sglang --model-path llama-3.1-8b --gpu L40S --context-length 32768 --port 30000
  memfit sglang llama-3.1-70b --gpu H200 --tp 8 --mem-fraction-static 0.9 --json
  memfit sglang deepseek-v3 --gpu H200 --tp 8 --kv-cache-dtype fp8_e4m3

Prints the lines SGLang logs at start-up (Load weight end … mem usage, KV Cache is allocated.
#tokens …, Memory pool end, Capture cuda graph end, max_total_num_tokens=…) and the verdict.
Exit 0: it starts; 1: it fails (SGLang's own error, and the --mem-fraction-static or
--context-length that would start); 2: bad input. How it is modelled: docs/serving.md.
"""

#: ``launch_server`` flags that do not change start-up memory: accepted so a pasted line parses.
_IGNORED_VALUED = (
    "--host",
    "--port",
    "--served-model-name",
    "--api-key",
    "--random-seed",
    "--tokenizer-path",
    "--revision",
    "--download-dir",
    "--log-level",
    "--chat-template",
    "--tool-call-parser",
    "--reasoning-parser",
    "--load-format",
    "--schedule-policy",
    "--grammar-backend",
)
_IGNORED_SWITCHES = (
    "--trust-remote-code",
    "--disable-radix-cache",
    "--enable-metrics",
    "--log-requests",
    "--skip-server-warmup",
)


def add_sglang_flags(p: argparse.ArgumentParser) -> None:
    """The ``sglang.launch_server`` flags memfit models."""
    g = p.add_argument_group("sglang.launch_server flags")
    g.add_argument(
        "--tp-size",
        "--tp",
        "--tensor-parallel-size",
        dest="tp_size",
        type=GPU_COUNT,
        default=1,
        help="tensor-parallel GPUs (default 1)",
    )
    g.add_argument(
        "--dp-size",
        "--dp",
        "--data-parallel-size",
        dest="dp_size",
        type=GPU_COUNT,
        default=1,
        help="data-parallel replicas (default 1)",
    )
    g.add_argument(
        "--ep-size",
        "--ep",
        "--expert-parallel-size",
        dest="ep_size",
        type=GPU_COUNT,
        default=1,
        help="expert-parallel GPUs (default 1)",
    )
    g.add_argument(
        "--enable-dp-attention",
        action="store_true",
        help="attention data-parallel over --dp-size (KV heads split tp/dp ways)",
    )
    g.add_argument(
        "--mem-fraction-static",
        type=finite_float,
        default=None,
        help="fraction for weights + KV pool (default: SGLang's, by GPU memory and TP)",
    )
    g.add_argument(
        "--context-length",
        type=positive_int,
        default=None,
        help="context length (default: the model's)",
    )
    g.add_argument(
        "--max-running-requests",
        type=positive_int,
        default=None,
        help="concurrent requests (default: from the KV pool, 2048-4096)",
    )
    g.add_argument(
        "--max-total-tokens", type=positive_int, default=None, help="cap on the KV pool's tokens"
    )
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="prefill chunk (default by GPU memory: 2048-16384; -1 off)",
    )
    g.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8_e5m2 | fp8_e4m3 | bf16")
    g.add_argument(
        "--cuda-graph-max-bs",
        type=positive_int,
        default=None,
        help="largest captured decode batch (default by GPU memory and TP)",
    )
    g.add_argument("--disable-cuda-graph", action="store_true", help="no CUDA graphs")
    g.add_argument("--page-size", type=positive_int, default=1, help="KV page (default 1)")
    g.add_argument("--quantization", default=None, help="fp8 (online) | awq | gptq | …")
    g.add_argument("--dtype", default="auto", help="auto | half | float16 | bfloat16 | float32")
    g.add_argument(
        "--attention-backend",
        default=None,
        help="flashinfer | fa3 | triton: sizes its CUDA-graph state (default: SGLang's own choice)",
    )
    g.add_argument(
        "--sglang-version",
        default=None,
        help="SGLang release to model: 0.4.x or 0.5.x (default 0.5: 0.5.3 and later); the default "
        "--mem-fraction-static rule changed in 0.4.7 and 0.5.3",
    )


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the ``sglang`` subcommand; return its handler by name."""
    p = sub.add_parser(
        "sglang",
        help="will `sglang.launch_server` start on this GPU: KV tokens, CUDA graphs",
        description="Model SGLang's start-up memory accounting (mem_fraction_static, weights, "
        "KV pool tokens, request table, CUDA graphs) and print the lines SGLang logs. Flags "
        "that do not change memory (--host, --port, --trust-remote-code…) are accepted and "
        "ignored: paste a whole `python -m sglang.launch_server` line.",
        epilog=SGLANG_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="bundled name, hub id, or path to config.json / a model dir",
    )
    p.add_argument(
        "--model-path",
        "--model",
        dest="model_path",
        default=None,
        help="as launch_server takes it (instead of MODEL)",
    )
    p.add_argument("--gpu", required=True, help="GPU name (see `memfit gpus`)")
    add_sglang_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    ign = p.add_argument_group("accepted and ignored (no effect on memory)")
    for flag in _IGNORED_VALUED:
        ign.add_argument(flag, dest=f"ignored_{flag[2:]}", default=None, help=argparse.SUPPRESS)
    for flag in _IGNORED_SWITCHES:
        ign.add_argument(
            flag, dest=f"ignored_{flag[2:]}", action="store_true", help=argparse.SUPPRESS
        )
    return {"sglang": cmd_sglang}


def model_of(args: argparse.Namespace) -> str:
    """MODEL or --model-path (one of them, not two that differ)."""
    if args.model and args.model_path and args.model != args.model_path:
        raise SpecError(
            f"MODEL ({args.model!r}) and --model-path ({args.model_path!r}) differ: give one"
        )
    model = args.model or args.model_path
    if not model:
        raise SpecError("memfit sglang needs a model: MODEL or --model-path NAME")
    return str(model)


def cmd_sglang(args: argparse.Namespace) -> int:
    model = model_of(args)
    config = sglang_job(args)
    gpu = get_gpu(args.gpu)
    try:
        s = api.estimate(model, config, gpu=gpu)
    except NotModelledError as exc:  # not bad input: said with the nearest answers (exit 1)
        return print_not_modelled("sglang", model, gpu, str(exc), as_json=args.json)
    command = launch_command(model, config)
    print(json.dumps(sglang_json(s, command), indent=2) if args.json else render_sglang(s, model))
    return 0 if s.starts else 1
