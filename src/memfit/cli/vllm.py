"""``memfit vllm``: what ``vllm serve MODEL …`` will do on a GPU (memfit.cli adds it by
``register``).

Flags are spelled as ``vllm serve`` spells them, so a pasted command line works; flags that do not
change memory (``--port``, ``--host``, ``--served-model-name``…) are accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memfit import api, progress
from memfit.errors import MemfitError, NotModelledError, SpecError
from memfit.flags import count_at_most, finite_float, positive_int
from memfit.hardware.catalog import get_gpu
from memfit.jobflags import runtime_serving_job, serving_job
from memfit.report.serving import (
    render_not_modelled,
    render_serving_plan,
    render_startup,
    serving_plan_json,
    startup_json,
)
from memfit.serving.command import serve_command
from memfit.serving.startup import not_modelled_answer
from memfit.spec.rules import MAX_GPUS
from memfit.spec.serving import VllmConfig

#: --tensor-parallel-size, --pipeline-parallel-size, --gpus: 1 to MAX_GPUS (a parallel degree is a
#: loop and list size in the serving model; 2**31 pipeline stages took > 6 GB before this limit).
GPU_COUNT = count_at_most(MAX_GPUS, "GPUs (memfit.spec.rules.MAX_GPUS)")

VLLM_EXAMPLES = """examples:
  memfit vllm llama-3.1-8b --gpu L40S
  memfit vllm meta-llama/Llama-3.1-8B-Instruct --gpu H100 --max-model-len 32768 --json
  memfit vllm qwen2.5-72b --gpu H100 --tensor-parallel-size 4 --kv-cache-dtype fp8
  memfit vllm llama-3.1-70b --gpu A100-80GB --tp 2 --quantization fp8 --vllm-version 0.11

Prints the lines vLLM logs at start-up (Model loading took…, Available KV cache memory…, GPU KV
cache size…, Maximum concurrency for L tokens per request…), then the verdict. Exit 0: it starts;
1: it fails (vLLM's own error, and the largest --max-model-len / smallest
--gpu-memory-utilization that would start); 2: bad input. How it is modelled: docs/serving.md.
"""

#: ``vllm serve`` flags that do not change start-up memory: accepted so a pasted line parses.
_IGNORED_VALUED = (
    "--host",
    "--port",
    "--served-model-name",
    "--api-key",
    "--seed",
    "--swap-space",
    "--tokenizer",
    "--revision",
    "--download-dir",
    "--uvicorn-log-level",
    "--chat-template",
    "--tool-call-parser",
    "--reasoning-parser",
    "--load-format",
    "--distributed-executor-backend",
)
_IGNORED_SWITCHES = (
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--disable-log-requests",
    "--disable-log-stats",
    "--trust-remote-code",
    "--enable-chunked-prefill",
    "--enable-auto-tool-choice",
)


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    """The ``vllm serve`` flags memfit models (``vllm``, and ``fit/plan --runtime vllm``)."""
    g = p.add_argument_group("vllm serve flags")
    g.add_argument(
        "--tensor-parallel-size",
        "-tp",
        "--tp",
        dest="tp",
        type=GPU_COUNT,
        default=None,
        help="tensor-parallel GPUs (default 1)",
    )
    g.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        "--pp",
        dest="pp",
        type=GPU_COUNT,
        default=None,
        help="pipeline stages (default 1)",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=finite_float,
        default=None,
        help="fraction of GPU memory vLLM may use (default: the version's: 0.9; 0.92 from 0.20; "
        "1.0 with 0.34's extensible KV cache)",
    )
    g.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="context length (default: the model's max_position_embeddings)",
    )
    g.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=None,
        help="concurrent sequences (default 1024 on >=70 GiB GPUs except A100, else 256)",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        help="tokens per step (default 8192 on >=70 GiB GPUs except A100, else 2048)",
    )
    g.add_argument(
        "--block-size", type=positive_int, default=None, help="KV block (default 16; 64 from 0.34)"
    )
    g.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 | fp8_e4m3 | fp8_e5m2")
    g.add_argument("--dtype", default="auto", help="auto | half | float16 | bfloat16 | float32")
    g.add_argument(
        "--quantization",
        "-q",
        default=None,
        help="fp8 (online) | awq | gptq | compressed-tensors | bitsandbytes …",
    )
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    g.add_argument(
        "--max-cudagraph-capture-size",
        type=positive_int,
        default=None,
        help="largest CUDA graph batch (0.13+; default min(2 x max_num_seqs, 512))",
    )
    g.add_argument(
        "--cpu-offload-gb", type=finite_float, default=0.0, help="GiB of weights in CPU RAM"
    )
    g.add_argument(
        "--vllm-version",
        default=None,
        help="vLLM version to model, 0.4 to 0.34 (default: the installed vLLM's, else the newest "
        "modelled, 0.34; 0.6 = V0 engine; 0.20+ counts the CUDA graph estimate in the budget; "
        "0.34 sizes the KV cache after warmup, the extensible KV cache)",
    )


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the ``vllm`` subcommand; return its handler by name."""
    p = sub.add_parser(
        "vllm",
        help="will `vllm serve` start on this GPU: KV cache, tokens, max concurrency",
        description="Model vLLM's start-up memory accounting (weights, profile-run activation "
        "peak, non-torch memory, KV cache blocks) and print the lines vLLM logs. Flags that do "
        "not change memory (--port, --host, --served-model-name, --enable-prefix-caching, "
        "--trust-remote-code…) are accepted and ignored: paste a whole `vllm serve` line.",
        epilog=VLLM_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="bundled name, hub id, or path to config.json / a model dir")
    p.add_argument("--gpu", required=True, help="GPU name (see `memfit gpus`)")
    p.add_argument(
        "--gpus",
        type=GPU_COUNT,
        default=None,
        help="GPUs in all (sets --tensor-parallel-size when it is not given)",
    )
    add_vllm_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    ign = p.add_argument_group("accepted and ignored (no effect on memory)")
    for flag in _IGNORED_VALUED:
        ign.add_argument(flag, dest=f"ignored_{flag[2:]}", default=None, help=argparse.SUPPRESS)
    for flag in _IGNORED_SWITCHES:
        ign.add_argument(
            flag, dest=f"ignored_{flag[2:]}", action="store_true", help=argparse.SUPPRESS
        )
    return {"vllm": cmd_vllm}


def cmd_vllm(args: argparse.Namespace) -> int:
    config = serving_job(args, args.gpus)
    gpu = get_gpu(args.gpu)
    try:
        s = api.estimate(args.model, config, gpu=gpu)
    except NotModelledError as exc:  # not bad input: say so, with the nearest answer (exit 1)
        n = not_modelled_answer(_spec_or_none(args.model), args.model, gpu, config, str(exc))
        print(
            json.dumps(n.to_json(), indent=2) if args.json else render_not_modelled(n, args.model)
        )
        return 1
    command = serve_command(args.model, config)
    nearest = _nearest_start(args, config, gpu, s)
    print(
        json.dumps(startup_json(s, command, nearest), indent=2)
        if args.json
        else render_startup(s, args.model, nearest)
    )
    return 0 if s.starts else 1


def _spec_or_none(model: str) -> Any:
    try:
        return api.serving_spec(model)
    except MemfitError:
        return None


def _nearest_start(args: argparse.Namespace, config: Any, gpu: Any, s: Any) -> Any:
    """For a start-up that fails for memory and that no --gpu-memory-utilization or
    --max-model-len rescues on this GPU: the serving planner's first configuration on GPUs of
    the same kind (more of them with tensor parallelism, fp8 weights / KV where the GPU has
    them) that holds one request of the asked length; None otherwise."""
    if s.starts or s.refused_layout or s.largest_max_model_len:
        return None
    if s.smallest_gpu_memory_utilization is not None:
        return None
    progress.report("looking for the nearest configuration that starts")
    try:
        # the length the start-up used (the model's own when --max-model-len is unset)
        asked = config if config.max_model_len else replace_len(config, s.max_model_len)
        options = api.plan(args.model, asked, gpu=gpu, concurrency=1, max_gpus=8)
    except MemfitError:
        return None
    return options[0] if options else None


# -- fit / plan / upgrade --runtime vllm -------------------------------------------------------
def add_runtime_flags(p: argparse.ArgumentParser, *, concurrency: bool = False) -> None:
    """``--runtime hf|vllm`` and the vLLM knobs the other commands take (their own --tp, --gpus,
    --seq, --new-tokens and --quant carry the rest)."""
    p.add_argument(
        "--runtime",
        choices=("hf", "vllm", "sglang", "llama.cpp"),
        default="hf",
        help="hf: Hugging Face generate() (default); vllm: `vllm serve` "
        "(KV blocks under --gpu-memory-utilization; see `memfit vllm`); sglang: "
        "`sglang.launch_server` (`memfit sglang`); llama.cpp: `llama-server` / Ollama "
        "(`memfit llama-server`; MODEL as NAME:Q4_K_M or a .gguf)",
    )
    g = p.add_argument_group("--runtime vllm")
    g.add_argument(
        "--gpu-memory-utilization",
        type=finite_float,
        default=None,
        help="vllm: fraction of GPU memory vLLM may use (default: the version's; 1.0 from 0.34)",
    )
    g.add_argument("--kv-cache-dtype", default="auto", help="vllm: auto | fp8")
    g.add_argument(
        "--vllm-version",
        default=None,
        help="vllm: version to model (default: the installed vLLM's, else the newest modelled)",
    )
    if concurrency:
        g.add_argument(
            "--concurrency",
            type=positive_int,
            default=None,
            help="vllm: concurrent requests of --seq (+ --new-tokens) tokens to serve",
        )


def cmd_fit_vllm(args: argparse.Namespace) -> int:
    """``memfit fit --runtime vllm --solve concurrency|max-model-len``."""
    if args.gpu is None or args.gpu_memory is not None:
        raise SpecError("fit --runtime vllm needs --gpu NAME (vLLM's budget is a GPU's total)")
    if args.solve not in ("concurrency", "max-model-len"):
        raise SpecError(
            f"--solve {args.solve} with --runtime vllm: solve concurrency or max-model-len"
        )
    gpu = get_gpu(args.gpu)
    tp_flag, n_gpus = getattr(args, "tp", None) or 1, getattr(args, "gpus", None) or 1
    tp = tp_flag if tp_flag > 1 else n_gpus  # one replica over --gpus, unless --tp says less
    length = args.seq + (args.new_tokens or 0)
    if args.solve == "concurrency":
        config = runtime_serving_job(args, tp=tp, length=length)
        value, best = api.fit(args.model, config, gpu=gpu, solve="concurrency")
        s = best if best is not None else api.estimate(args.model, config, gpu=gpu)
        answer = f"{value} concurrent requests of {length:,} tokens"
    else:
        config = runtime_serving_job(args, tp=tp, length=None)
        value, best = api.fit(
            args.model, config, gpu=gpu, solve="max-model-len", concurrency=args.batch or 1
        )
        s = best if best is not None else api.estimate(args.model, config, gpu=gpu)
        answer = f"--max-model-len {value:,} (holding {args.batch or 1} request(s))"
        config = replace_len(config, value or None)
    command = serve_command(args.model, config) if value else None
    if args.json:
        record = startup_json(s, command)
        record.update({"solve": args.solve, "max_value": value, "fits": value > 0})
        print(json.dumps(record, indent=2))
    else:
        print(render_startup(s, args.model))
        print(f"vLLM holds {answer}" if value else "nothing fits: " + (s.error or ""))
        if command:
            print(command)
    return 0 if value > 0 else 1


def replace_len(config: VllmConfig, length: int | None) -> VllmConfig:
    return replace(config, max_model_len=length)


def cmd_plan_vllm(args: argparse.Namespace) -> int:
    """``memfit plan --mode infer --runtime vllm --concurrency N --seq L``."""
    if args.mode != "infer":
        raise SpecError("--runtime vllm plans inference: pass --mode infer")
    want = args.concurrency or args.batch or 1
    length = args.seq + (args.new_tokens or 0)
    base = runtime_serving_job(args, length=length)
    gpu = None if args.gpu is None or args.recommend_gpu else get_gpu(args.gpu)
    options = api.plan(
        args.model, base, gpu=gpu, concurrency=want,
        max_gpus=args.gpus if args.gpus and args.gpus > 1 else (None if gpu is None else 8),
        allow_quant=not args.no_quant,
    )  # fmt: skip
    if args.json:
        print(json.dumps(serving_plan_json(options, want, length), indent=2))
    else:
        print(render_serving_plan(options, want, length, where=args.gpu))
    return 0 if options else 1
