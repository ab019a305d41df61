"""``memfit plan``, ``fit``, ``upgrade`` and ``doctor``: argparse subcommands for :mod:`memfit.cli`.

Each handler builds the request, calls :mod:`memfit.plan`, and prints text or ``--json``.
Exit codes: 0 a plan / answer exists, 1 nothing fits (the closest attempt is printed), 2 bad input.
``upgrade``: 0 no upgrade needed (stay / optimize first), 1 upgrade recommended, 2 bad input or
undetermined. ``doctor``: 0 when the job fits ``--gpu`` (or none is given), 1 when it is tight or
does not fit (THE verdict rule, memfit.estimate.verdict), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memfit import api, progress
from memfit.cli import diffusion as cli_diffusion
from memfit.cli import from_files as cli_from
from memfit.cli import layouts as cli_layouts
from memfit.cli import outputs as cli_outputs
from memfit.cli import seqdist as cli_seqdist
from memfit.cli import vllm as cli_vllm
from memfit.cli.engine import add_engine_flags, options_from
from memfit.cli.runtimes import OTHER_RUNTIMES, cmd_fit_runtime, cmd_plan_runtime
from memfit.errors import SpecError
from memfit.flags import (
    add_flags,
    finite_float,
    integer,
    non_negative_int,
    quoted,
    workload_from_args,
    workload_kwargs,
)
from memfit.hardware.prices import PRICES_ENV, load_prices
from memfit.plan import (
    DEFAULT_HEADROOM,
    GOALS,
    RISK_LEVELS,
    SOLVES,
    PlanRequest,
    recommend_gpus,
)
from memfit.plan.advice import DEFAULT_RANK, RANKS, rank_advice
from memfit.plan.doctor import BATCH_FROM, CHOSE_GPU_BY, SIZED_BY, doctor
from memfit.plan.nearest import NearestFit, nearest_fit
from memfit.plan.recipe import ALLOW, parse_allow
from memfit.plan.request import CONFIRM_MODES
from memfit.plan.upgrade import DEFAULT_MAX_QUALITY_RISK, MAX_TRACE_FALLBACKS, upgrade_verdict
from memfit.report.advice import render_advice
from memfit.report.checklist import render_doctor, render_upgrade
from memfit.report.plan import render_fit, render_plan
from memfit.spec import with_kernel_defaults
from memfit.units import parse_bytes

EXIT_OK, EXIT_DOES_NOT_FIT = 0, 1

PLAN_EXAMPLES = """examples:
  memfit plan llama-3.1-8b --gpu L4 --mode train --seq 4096 --global-batch 16
  memfit plan llama-3.1-8b --gpu L4 --seq 4096 --global-batch 16 --allow lora,quant
  memfit plan llama-3.1-8b --gpu L4 --seq 2048 --lora-rank 16 --precision bf16-true
  memfit plan llama-3.1-8b --gpu A100-80GB --seq 4096 --global-batch 16 --keep-full-finetune
  memfit plan llama-3.1-8b --gpu H100-80GB --gpus 8 --seq 4096 --global-batch 64 --json
  memfit plan llama-3.1-70b --gpu H100-80GB --gpus 4 --mode infer --seq 8192 --batch 32
  memfit plan llama-3.1-8b --recommend-gpu --seq 4096 --global-batch 16 --max-quality-risk low
  memfit plan llama-3.1-8b --recommend-gpu --mode infer --seq 2048 --new-tokens 256 --rank cost
  memfit plan llama-3.2-1b --recommend-gpu --seq 2048 --global-batch 8 --prices my-prices.json
  memfit plan llama-3.1-70b --gpu H100 --nodes 8 --global-batch 256 --seq 8192
  memfit plan llama-3.1-70b --gpu H100 --gpus 64 --layout --global-batch 256 --export megatron
  memfit plan llama-3.1-70b --recommend-gpu --layout --global-batch 256 --seq 8192
  memfit plan flux.1-dev --gpu RTX-4090 --mode train --lora-rank 16 --resolution 512
  memfit plan flux.1-dev --gpu RTX-3060 --mode infer --height 768 --width 768
"""
FIT_EXAMPLES = """examples:
  memfit fit llama-3.1-8b --gpu A100-80GB --solve batch --seq 4096 --checkpointing full
  memfit fit llama-3.1-8b --gpu-memory 24GB --solve seq --lora-rank 16 --quant nf4-dq
  memfit fit llama-3.1-8b --gpu L40S --solve concurrency --mode infer --seq 8192 --json
  memfit fit sdxl-base-1.0 --gpu T4 --mode train --lora-rank 4 --solve resolution
  memfit fit sdxl-base-1.0 --gpu T4 --mode infer --solve batch --height 768 --width 768
"""
UPGRADE_EXAMPLES = """examples:
  memfit upgrade llama-3.1-8b --gpu L4 --mode train --seq 4096 --global-batch 16
  memfit upgrade llama-3.2-1b --gpu A100-80GB --seq 2048 --global-batch 32 --throughput-target 1e5
  memfit upgrade llama-3.1-8b --gpu L4 --mode infer --seq 4096 --concurrency 16 --context 8192
  memfit upgrade llama-3.1-70b --gpu H100-80GB --gpus 4 --mode infer --seq 8192 --json
"""
DOCTOR_EXAMPLES = """examples:
  memfit doctor llama-3.1-8b --gpu A100-80GB --seq 4096 --batch 4 --lora-rank 16 \\
      --checkpointing full --optimizer adamw-8bit --sized-by weights --batch-from guess
  memfit doctor llama-3.1-8b --gpu L4 --mode infer --seq 4096 --batch 8 --quant int4-awq \\
      --no-quality-checked --chose-gpu-by vram
  memfit doctor gpt2 --gpu T4 --seq 1024 --batch 8 --log run.jsonl --json
"""


def _headroom(text: str) -> float:
    """``0.05``, ``5%``: a fraction of the capacity left free."""
    try:
        value = finite_float(text[:-1]) / 100 if text.endswith("%") else finite_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction (0.05) or a percent (5%), got {quoted(text)}"
        ) from None
    return value


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``plan`` and ``fit`` to the ``memfit`` subparsers; return their handlers."""
    headroom_help = (
        f"fraction of GPU memory left free (default {DEFAULT_HEADROOM:g}; 0 plans to the limit "
        "itself); plans are checked against the estimate's upper range end"
    )
    p = sub.add_parser(
        "plan",
        help="the job as asked, then the least change that makes it fit, with the settings",
        description="Estimate the job as asked (precision, optimizer, full fine-tune or LoRA) "
        "and say whether it fits; then change only what it must: memory-only changes first "
        "(checkpointing, micro-batch x accumulation, attention kernel, ZeRO/FSDP, offload), "
        "fastest first by the roofline; result-changing ones (quantization, LoRA, freezing, "
        "8-bit states, pure 16-bit weights) only when nothing memory-only fits, least quality "
        "risk first, or when --allow names them. Each change is labelled memory-only or "
        "changes the result.",
        epilog=PLAN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", help="bundled name, config.json path or dir, or hub id")
    p.add_argument("--gpu", help="GPU name (see `memfit gpus`); its rates rank the plans")
    add_flags(p, "plan", "--gpus")
    p.add_argument("--gpu-memory", type=_size, help="override the GPU memory: 24GB or 24GiB")
    add_flags(p, "plan", "--mode", "--seq", "--batch", "--global-batch", "--new-tokens")
    p.add_argument("--goal", choices=GOALS, default="throughput")
    p.add_argument("--headroom", type=_headroom, default=DEFAULT_HEADROOM, help=headroom_help)
    p.add_argument("--keep-full-finetune", action="store_true", help="no LoRA, freezing or quant")
    p.add_argument("--no-quant", action="store_true", help="keep 16-bit weights")
    add_flags(p, "plan", "--prepare-kbit", "--optimizer-in-bwd", "--loss", "--kernels")
    p.add_argument("--max-quality-risk", choices=RISK_LEVELS, default="high")
    p.add_argument("--allow-offload", action="store_true", help="try ZeRO-Offload to host RAM")
    add_flags(
        p,
        "plan",
        "--lora-rank",
        "--lora-targets",
        "--lora-modules-to-save",
        "--lora-dropout",
        "--quant",
        "--precision",
        "--optimizer",
        "--attention",
    )
    add_flags(p, "plan", "--resolution", "--train-text-encoder", "--cache-latents")
    add_flags(p, "plan", "--max-sequence-length")  # diffusion training (cli_diffusion_train)
    cli_diffusion.add_plan_flags(p)  # diffusion inference (--mode infer: --height, --quant ...)
    p.add_argument(
        "--allow",
        action="append",
        metavar="LIST",
        help="result-changing techniques the plan may use as freely as memory-only ones "
        f"(comma-separated, repeatable): {', '.join(ALLOW)}; presets: any, none (default: "
        "memory-only changes first, the others only when nothing memory-only fits)",
    )
    cli_from.add_from(p)
    cli_seqdist.add_flags(p)  # --seq-dist: the recommended plan replayed over the run
    p.add_argument(
        "--alternatives", type=non_negative_int, default=4, help="runners-up shown (default 4)"
    )
    p.add_argument(
        "--confirm",
        choices=CONFIRM_MODES,
        nargs="?",
        const="shown",
        default=None,
        help="plans the trace engine confirms: auto (default: the recommended plan, only where "
        "the analytic engine's validated error band could change its verdict), every plan "
        "shown (--confirm alone), the recommended one only, or none (each trace of a 7B model "
        "costs seconds); --recommend-gpu defaults to none",
    )
    p.add_argument(
        "--recommend-gpu",
        action="store_true",
        help="list GPUs (and counts) on which a plan fits, with speed, price and cost per 1M "
        "tokens, in --rank order",
    )
    _add_price_flags(p)
    add_engine_flags(p, framework=True, confirm=False)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    cli_vllm.add_runtime_flags(p, concurrency=True)
    cli_outputs.add_share_flags(p, snapshot=False)  # --html
    cli_layouts.add_plan_flags(p)  # --layout, --nodes, --gpus-per-node, --export (issue 30)
    f = sub.add_parser(
        "fit",
        help="the largest batch, longest sequence or most concurrent requests that fit",
        description="Solve one dimension of the job (flags as `memfit estimate`) against the GPU "
        "memory minus headroom: doubling then bisection on the fast engine, confirmed by trace. "
        "Answers the largest value that fits and the largest that is only tight (its estimate "
        "within the GPU, its upper end plus headroom not); exit 0 only when a value fits.",
        epilog=FIT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f.add_argument("model", nargs="?", help="bundled name, config.json path or dir, or hub id")
    f.add_argument("--gpu", help="GPU name (see `memfit gpus`)")
    f.add_argument("--gpu-memory", type=_size, help="GPU memory: 24GB (10^9) or 24GiB (2^30)")
    f.add_argument(
        "--solve", choices=(*SOLVES, "max-model-len", "n-gpu-layers", "resolution"), required=True
    )
    f.add_argument("--headroom", type=_headroom, default=DEFAULT_HEADROOM, help=headroom_help)
    add_flags(f, "fit")
    cli_diffusion.add_fit_flags(f)  # diffusion inference (--mode infer: --height, --width ...)
    cli_seqdist.add_flags(f)  # --seq-dist: solve the batch over a variable-length run
    cli_from.add_from(f)
    add_engine_flags(f, framework=True)
    f.add_argument("--json", action="store_true", help="print one JSON object")
    cli_vllm.add_runtime_flags(f)
    _register_upgrade(sub, headroom_help)
    _register_doctor(sub, headroom_help)
    return {"plan": cmd_plan, "fit": cmd_fit, "upgrade": cmd_upgrade, "doctor": cmd_doctor}


def _register_upgrade(sub: Any, headroom_help: str) -> None:
    u = sub.add_parser(
        "upgrade",
        help="the 'when should you upgrade' checklist as a verdict, with the numbers",
        description="Plan the job on the GPU, solve the longest context, the largest batch and "
        "the most concurrent requests, and check the seed's upgrade checklist: optimized plan "
        "still too big, context out of reach, throughput target out of reach, KV cache "
        "exhausted, only impractical recomputation/offload fits, missing bf16/fp8, decode "
        "bandwidth. Prints each item's evidence, a verdict (stay / optimize first / upgrade) "
        "and the catalog GPUs that resolve the triggered items.",
        epilog=UPGRADE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    u.add_argument("model", help="bundled name, config.json path or dir, or hub id")
    u.add_argument("--gpu", required=True, help="the GPU you have or plan to use")
    add_flags(u, "upgrade", "--gpus", "--mode", "--seq")
    add_flags(u, "upgrade", "--batch", "--global-batch", "--new-tokens")
    # the job's recipe, as plan spells it (the flag table's planner rows): kept by every plan
    add_flags(
        u,
        "upgrade",
        "--lora-rank",
        "--lora-targets",
        "--lora-modules-to-save",
        "--lora-dropout",
        "--quant",
        "--kernels",
        "--loss",
        "--prepare-kbit",
        "--optimizer-in-bwd",
        "--precision",
        "--optimizer",
        "--attention",
    )
    u.add_argument("--concurrency", type=integer, help="infer: requests served at once")
    u.add_argument("--context", type=integer, help="infer: tokens per request (prompt + new)")
    u.add_argument(
        "--throughput-target", type=finite_float, help="tokens/s the job must reach (all GPUs)"
    )
    u.add_argument("--headroom", type=_headroom, default=DEFAULT_HEADROOM, help=headroom_help)
    u.add_argument(
        "--max-quality-risk",
        choices=RISK_LEVELS,
        default=DEFAULT_MAX_QUALITY_RISK,
        help=f"riskiest plan that counts as optimized (default {DEFAULT_MAX_QUALITY_RISK})",
    )
    u.add_argument(
        "--trace-fallbacks",
        type=integer,
        default=MAX_TRACE_FALLBACKS,
        help="trace-engine estimates for combinations the analytic engine does not model yet "
        f"(default {MAX_TRACE_FALLBACKS}; seconds each)",
    )
    u.add_argument("--no-recommend", action="store_true", help="skip the catalog GPU scan")
    _add_price_flags(u)
    add_engine_flags(u)
    u.add_argument("--json", action="store_true", help="print one JSON object")
    cli_vllm.add_runtime_flags(u)


def _add_price_flags(parser: argparse.ArgumentParser) -> None:
    """``--rank`` and ``--prices`` of the GPU advice (plan --recommend-gpu, upgrade)."""
    parser.add_argument(
        "--rank",
        choices=RANKS,
        default=DEFAULT_RANK,
        help=f"order of the GPU advice (default {DEFAULT_RANK}): cost = $ per 1M tokens, "
        "cheapest first (unpriced GPUs last); speed = tokens/s; memory = most memory left free",
    )
    parser.add_argument(
        "--prices",
        metavar="FILE",
        help="JSON/YAML price file overriding the catalog's on-demand $/GPU-hour, e.g. "
        f'{{"prices": {{"H100": 2.49}}}} (default: ${PRICES_ENV} if set)',
    )


def _register_doctor(sub: Any, headroom_help: str) -> None:
    d = sub.add_parser(
        "doctor",
        help="check a described job for the seven common memory mistakes",
        description="Estimate the job (flags as `memfit estimate`) and check it for weights-only "
        "sizing, quantization without a quality check, an unprofiled batch size, an ignored "
        "sequence length / KV cache, techniques stacked without benchmarking, reserved memory "
        "mistaken for a leak (--log), and a GPU chosen by VRAM alone. Facts only you know make "
        "a finding yes/no; left out, it is unknown unless the numbers decide it.",
        epilog=DOCTOR_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("model", help="bundled name, config.json path or dir, or hub id")
    d.add_argument("--gpu", help="the GPU the job runs on (see `memfit gpus`)")
    d.add_argument("--headroom", type=_headroom, default=DEFAULT_HEADROOM, help=headroom_help)
    add_flags(d, "doctor")
    d.add_argument("--sized-by", choices=SIZED_BY, help="how the job's memory was sized")
    d.add_argument(
        "--quality-checked",
        action=argparse.BooleanOptionalAction,
        help="was the quantized model's quality checked on an eval set",
    )
    d.add_argument("--batch-from", choices=BATCH_FROM, help="where the batch size came from")
    d.add_argument(
        "--benchmarked",
        action=argparse.BooleanOptionalAction,
        help="were the stacked techniques benchmarked (step time with and without)",
    )
    d.add_argument("--log", help="a run log of memfit monitor (checks leak vs allocator cache)")
    d.add_argument("--chose-gpu-by", choices=CHOSE_GPU_BY, help="why this GPU was chosen")
    add_engine_flags(d)
    d.add_argument("--json", action="store_true", help="print one JSON object")


# -- plan -------------------------------------------------------------------------------------
def _lora_targets(args: argparse.Namespace) -> tuple[str, ...] | str:
    """``--lora-targets`` as the workload reads it (the flag table's parser), or all-linear."""
    if not getattr(args, "lora_targets", None):
        return "all-linear"
    if not args.lora_rank:
        raise SpecError("--lora-targets names what LoRA adapts: add --lora-rank")
    return workload_kwargs({"lora_targets": args.lora_targets, "lora_rank": 1}, "plan")[
        "lora_targets"
    ]


def _lora_dropout(args: argparse.Namespace) -> float:
    """``--lora-dropout`` as the workload reads it, or 0."""
    text = getattr(args, "lora_dropout", None)
    if text is None:
        return 0.0
    if not args.lora_rank:
        raise SpecError("--lora-dropout is the LoRA adapters' dropout: add --lora-rank")
    return float(workload_kwargs({"lora_dropout": text}, "plan")["lora_dropout"])


def _modules_to_save(args: argparse.Namespace) -> tuple[str, ...]:
    """``--lora-modules-to-save`` as the workload reads it, or none."""
    text = getattr(args, "lora_modules_to_save", None)
    if not text:
        return ()
    if not args.lora_rank:
        raise SpecError("--lora-modules-to-save trains modules beside LoRA: add --lora-rank")
    return tuple(workload_kwargs({"lora_modules_to_save": text}, "plan")["lora_modules_to_save"])


def _kernel_fields(args: argparse.Namespace) -> dict[str, Any]:
    """``--kernels`` / ``--loss`` as the request reads them, with Unsloth's defaults filled in
    where the job does not set them, by the rule ``memfit estimate`` applies
    (:func:`memfit.spec.with_kernel_defaults`): the recipe checkpoints to host RAM and runs the
    fused cross-entropy, as ``FastLanguageModel`` does."""
    kernels = getattr(args, "kernels", None) or "hf"
    fields = with_kernel_defaults(
        {"mode": args.mode, "kernels": kernels, "loss": args.loss, "checkpointing": None}
    )
    fields.pop("mode")
    fields["loss"] = fields["loss"] or "full"
    fields["checkpointing"] = fields["checkpointing"] or "none"
    return fields


def recipe_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The job's recipe as ``plan`` and ``upgrade`` read it from their shared flags (the flag
    table's planner rows): precision, optimizer, attention, LoRA at the asked ranks (kept:
    never a full fine-tune), its targets / modules to save / dropout, the weight format, the
    loss and the kernels with Unsloth's defaults (:func:`_kernel_fields`), as
    :class:`PlanRequest` fields. One reading, so ``upgrade --lora-rank 16`` asks the planner
    for the job ``plan --lora-rank 16`` plans."""
    if args.lora_rank and args.mode == "infer":  # as estimate says it (spec/workload.py)
        raise SpecError("lora_rank is a training technique; it has no effect with mode 'infer'")
    return {
        **_kernel_fields(args),
        "lora_ranks": tuple(args.lora_rank or (16, 64)),
        "lora_asked": bool(args.lora_rank),
        "prepare_kbit": args.prepare_kbit,
        "optimizer_in_bwd": args.optimizer_in_bwd,
        "precision": args.precision,
        "optimizer": args.optimizer,
        "attention": args.attention,
        "quant": args.quant,
        "lora_targets": _lora_targets(args),
        "lora_modules_to_save": _modules_to_save(args),
        "lora_dropout": _lora_dropout(args),
    }


def _asked_from_file(args: argparse.Namespace, recipe: dict[str, Any]) -> dict[str, Any]:
    """``plan --from FILE``: the file's micro-batch and checkpointing as the job as asked
    (memfit.cli.from_files), where the global batch is still the file's (a --global-batch given
    over it asks another job: the planner's recipe then), the file's micro-batch divides the
    per-GPU batch (`--gpus` over the file keeps it where it does), and the kernels' defaults
    (``recipe``: :func:`recipe_fields`) do not set the checkpointing."""
    micro = getattr(args, "asked_micro_batch", None)
    if micro is None or args.mode != "train" or args.global_batch is None:
        return {}
    if args.global_batch != getattr(args, "asked_global_batch", None):
        return {}
    if (args.global_batch // max(args.gpus, 1)) % micro:
        return {}
    out: dict[str, Any] = {"asked_micro_batch": micro}
    ckpt = getattr(args, "asked_checkpointing", None)
    if ckpt and ckpt != "none" and recipe["checkpointing"] == "none":
        out["checkpointing"] = ckpt
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    cli_outputs.check_output_paths(args)  # --html: a typo is refused before the search
    if args.model and cli_diffusion.is_pipeline(args.model):  # diffusion training / inference
        return cli_diffusion.cmd_plan_pipeline(args)
    cli_diffusion.refuse_pipeline_flags(args)
    if cli_layouts.wants_layout(args):  # dp/tp/pp/cp/ep layouts of a multi-GPU training job
        return cli_layouts.cmd_plan_layout(args)

    if args.seq_dist is not None and (args.recommend_gpu or args.runtime != "hf"):
        raise SpecError("--seq-dist plans one GPU's training run: drop --recommend-gpu / --runtime")
    if args.runtime == "vllm":
        return cli_vllm.cmd_plan_vllm(args)
    if args.runtime in OTHER_RUNTIMES:
        return cmd_plan_runtime(args, "plan")
    recipe = recipe_fields(args)
    request = PlanRequest(
        **{**recipe, **_asked_from_file(args, recipe)},
        mode=args.mode,
        seq_len=args.seq,
        batch_size=args.batch,
        global_batch=args.global_batch,
        new_tokens=args.new_tokens,
        gpus=args.gpus,
        goal=args.goal,
        headroom=args.headroom,
        keep_full_finetune=args.keep_full_finetune,
        allow_quant=not args.no_quant,
        max_quality_risk=args.max_quality_risk,
        allow_offload=args.allow_offload,
        n_alternatives=args.alternatives,
        confirm=args.confirm or ("none" if args.recommend_gpu else "auto"),
        allow=parse_allow(args.allow),
    )
    if args.recommend_gpu:
        prices = load_prices(args.prices)
        advice = recommend_gpus(args.model, request, rank=args.rank, prices=prices)
        if args.json:
            out = {
                "rank": advice.rank,
                "gpus": [a.to_json() for a in advice],
                "notes": advice.notes,
            }
            print(json.dumps(out, indent=2))
        else:
            print(render_advice(advice, confirm=request.confirm))
        return EXIT_OK if advice else EXIT_DOES_NOT_FIT
    if args.gpu is None:
        raise SpecError("plan needs --gpu NAME (its rates rank the plans) or --recommend-gpu")
    if args.seq_dist is not None:
        return cli_seqdist.cmd_plan(args, request)
    result = api.plan(
        args.model,
        request,
        gpu=args.gpu,
        options=options_from(args),
        gpu_memory_bytes=args.gpu_memory,
    )
    cli_outputs.write_plan_outputs(args, result)
    info = cli_from.plan_answer(args, args.engine)  # a torchtune / LitGPT file: who answered
    if args.json:
        print(json.dumps({**result.to_json(), **info}, indent=2))
    else:
        print(render_plan(result) + cli_from.answer_lines(info))
    return EXIT_OK if result.fits else EXIT_DOES_NOT_FIT


# -- fit --------------------------------------------------------------------------------------
def cmd_fit(args: argparse.Namespace) -> int:
    if args.model and cli_diffusion.is_pipeline(args.model):  # diffusion training / inference
        return cli_diffusion.cmd_fit_pipeline(args)
    cli_diffusion.refuse_pipeline_flags(args)
    if args.solve == "resolution":
        raise SpecError("--solve resolution is for diffusion pipelines; use --solve seq")
    if args.runtime == "vllm":
        return cli_vllm.cmd_fit_vllm(args)
    if args.runtime in OTHER_RUNTIMES:
        return cmd_fit_runtime(args)
    if args.solve == "n-gpu-layers":
        raise SpecError("--solve n-gpu-layers is llama.cpp's: add --runtime llama.cpp")
    if args.solve == "max-model-len":
        raise SpecError("--solve max-model-len is vLLM's: add --runtime vllm (or --solve seq)")
    if args.seq_dist is not None:
        return cli_seqdist.cmd_fit(args, workload_from_args(args))
    if args.gpu is None and args.gpu_memory is None:
        raise SpecError("fit needs --gpu NAME or --gpu-memory SIZE (e.g. 24GB)")
    result = api.fit(
        args.model,
        workload_from_args(args),
        gpu=args.gpu,
        options=options_from(args),
        solve=args.solve,
        gpu_memory_bytes=args.gpu_memory,
        headroom=args.headroom,
    )
    info, lines, confirmed = cli_from.confirm_fit(args, result)  # a torchtune / LitGPT file
    nearest = _fit_nearest(args, result) if not info else None
    if nearest is not None:
        info["nearest_fit"] = nearest.to_json()
        lines += "\n" + nearest.text()
    print(
        json.dumps({**result.to_json(), **info}, indent=2)
        if args.json
        else render_fit(result) + lines
    )
    return result.exit_code if confirmed else EXIT_DOES_NOT_FIT  # the verdict rule's code


def _fit_nearest(args: argparse.Namespace, result: Any) -> NearestFit | None:
    """When not even the smallest value fits or is tight on a named GPU: the nearest change
    that makes the job fit (memfit.plan.nearest), as ``estimate`` names it."""
    est = result.estimate
    if result.verdict != "does not fit" or args.gpu is None or est is None:
        return None
    workload = workload_from_args(args)
    if workload.mode != "train" or args.solve not in ("batch", "seq"):
        return None
    settled = replace(workload, precision=est.workload["precision"])
    progress.report("looking for the nearest change that fits")
    return nearest_fit(args.model, settled, args.gpu, model_name=str(args.model))


# -- upgrade ----------------------------------------------------------------------------------
def cmd_upgrade(args: argparse.Namespace) -> int:
    prices = load_prices(args.prices)  # bad price files fail before the (slow) checklist
    if args.runtime in OTHER_RUNTIMES:
        return cmd_plan_runtime(args, "upgrade")
    v = upgrade_verdict(
        args.model, gpu=args.gpu, mode=args.mode, seq_len=args.seq, batch_size=args.batch,
        global_batch=args.global_batch, gpus=args.gpus, new_tokens=args.new_tokens,
        concurrency=args.concurrency, context=args.context,
        throughput_target=args.throughput_target, headroom=args.headroom,
        max_quality_risk=args.max_quality_risk, recommend=not args.no_recommend,
        trace_fallbacks=args.trace_fallbacks, runtime=args.runtime, recipe=recipe_fields(args),
    )  # fmt: skip
    v = replace(v, resolving=rank_advice(v.resolving, args.rank, prices=prices))
    print(json.dumps(v.to_json(), indent=2) if args.json else render_upgrade(v))
    if v.verdict == "undetermined":
        return 2
    return EXIT_DOES_NOT_FIT if v.upgrade else EXIT_OK


# -- doctor -----------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor(
        args.model, workload_from_args(args), gpu=args.gpu, sized_by=args.sized_by,
        quality_checked=args.quality_checked, batch_from=args.batch_from,
        benchmarked=args.benchmarked, log=args.log, chose_gpu_by=args.chose_gpu_by,
        headroom=args.headroom,
    )  # fmt: skip
    print(json.dumps(report.to_json(), indent=2) if args.json else render_doctor(report))
    return report.exit_code
