"""``memfit plan``, ``fit``, ``upgrade`` and ``doctor``: argparse subcommands for :mod:`memfit.cli`.

Each handler builds the request, calls :mod:`memfit.plan`, and prints text or ``--json``.
Exit codes: 0 a plan / answer exists, 1 nothing fits (the closest attempt is printed), 2 bad input.
``upgrade``: 0 no upgrade needed (stay / optimize first), 1 upgrade recommended, 2 bad input or
undetermined. ``doctor``: 0 for every completed check, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from memfit.errors import SpecError
from memfit.units import format_bytes

EXIT_OK, EXIT_DOES_NOT_FIT = 0, 1

PLAN_EXAMPLES = """examples:
  memfit plan llama-3.1-8b --gpu L4 --mode train --seq 4096 --global-batch 16
  memfit plan llama-3.1-8b --gpu A100-80GB --seq 4096 --global-batch 16 --keep-full-finetune
  memfit plan llama-3.1-8b --gpu H100-80GB --gpus 8 --seq 4096 --global-batch 64 --json
  memfit plan llama-3.1-70b --gpu H100-80GB --gpus 4 --mode infer --seq 8192 --batch 32
  memfit plan llama-3.1-8b --recommend-gpu --seq 4096 --global-batch 16 --max-quality-risk low
"""
FIT_EXAMPLES = """examples:
  memfit fit llama-3.1-8b --gpu A100-80GB --solve batch --seq 4096 --checkpointing full
  memfit fit llama-3.1-8b --gpu-memory 24GB --solve seq --lora-rank 16 --quant nf4-dq
  memfit fit llama-3.1-8b --gpu L40S --solve concurrency --mode infer --seq 8192 --json
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
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction (0.05) or a percent (5%), got {text!r}"
        ) from None
    return value


def _size(text: str) -> int:
    from memfit.units import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``plan`` and ``fit`` to the ``memfit`` subparsers; return their handlers."""
    from memfit.cli import _integer, add_flags
    from memfit.plan import DEFAULT_HEADROOM, GOALS, RISK_LEVELS, SOLVES
    from memfit.plan.request import CONFIRM_MODES

    headroom_help = (
        f"fraction of GPU memory left free (default {DEFAULT_HEADROOM:g}; 0 plans to the limit "
        "itself); plans are checked against the estimate's upper range end"
    )
    p = sub.add_parser(
        "plan",
        help="the fastest technique combination that fits, with the settings to use",
        description="Search precision, quantization, micro-batch x accumulation, checkpointing, "
        "optimizer, LoRA/QLoRA, freezing and ZeRO/FSDP/offload; rank the plans that fit by "
        "predicted step time (roofline); show alternatives and why faster plans do not fit.",
        epilog=PLAN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="bundled name, config.json path or dir, or hub id")
    p.add_argument("--gpu", help="GPU name (see `memfit gpus`); its rates rank the plans")
    add_flags(p, "plan", "--gpus")
    p.add_argument("--gpu-memory", type=_size, help="override the GPU memory: 24GB or 24GiB")
    add_flags(p, "plan", "--mode", "--seq", "--batch", "--global-batch", "--new-tokens")
    p.add_argument("--goal", choices=GOALS, default="throughput")
    p.add_argument("--headroom", type=_headroom, default=DEFAULT_HEADROOM, help=headroom_help)
    p.add_argument("--keep-full-finetune", action="store_true", help="no LoRA, freezing or quant")
    p.add_argument("--no-quant", action="store_true", help="keep 16-bit weights")
    add_flags(p, "plan", "--prepare-kbit")
    p.add_argument("--max-quality-risk", choices=RISK_LEVELS, default="high")
    p.add_argument("--allow-offload", action="store_true", help="try ZeRO-Offload to host RAM")
    add_flags(p, "plan", "--lora-rank")
    p.add_argument("--alternatives", type=_integer, default=4, help="runners-up shown (default 4)")
    p.add_argument(
        "--confirm",
        choices=CONFIRM_MODES,
        default=None,
        help="plans the trace engine confirms: every plan shown (default), the recommended one "
        "only, or none (seconds faster per plan of a 7B model); --recommend-gpu defaults to none",
    )
    p.add_argument(
        "--recommend-gpu",
        action="store_true",
        help="list GPUs (and counts) on which a plan fits, fastest first",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    f = sub.add_parser(
        "fit",
        help="the largest batch, longest sequence or most concurrent requests that fit",
        description="Solve one dimension of the job (flags as `memfit estimate`) against the GPU "
        "memory minus headroom: doubling then bisection on the fast engine, confirmed by trace.",
        epilog=FIT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f.add_argument("model", help="bundled name, config.json path or dir, or hub id")
    f.add_argument("--gpu", help="GPU name (see `memfit gpus`)")
    f.add_argument("--gpu-memory", type=_size, help="GPU memory: 24GB (10^9) or 24GiB (2^30)")
    f.add_argument("--solve", choices=SOLVES, required=True)
    f.add_argument("--headroom", type=_headroom, default=DEFAULT_HEADROOM, help=headroom_help)
    add_flags(f, "fit")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    _register_upgrade(sub, headroom_help)
    _register_doctor(sub, headroom_help)
    return {"plan": cmd_plan, "fit": cmd_fit, "upgrade": cmd_upgrade, "doctor": cmd_doctor}


def _register_upgrade(sub: Any, headroom_help: str) -> None:
    from memfit.cli import _integer, add_flags
    from memfit.plan import DEFAULT_HEADROOM, RISK_LEVELS
    from memfit.plan.upgrade import DEFAULT_MAX_QUALITY_RISK, MAX_TRACE_FALLBACKS

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
    u.add_argument("--concurrency", type=_integer, help="infer: requests served at once")
    u.add_argument("--context", type=_integer, help="infer: tokens per request (prompt + new)")
    u.add_argument("--throughput-target", type=float, help="tokens/s the job must reach (all GPUs)")
    u.add_argument("--headroom", type=_headroom, default=DEFAULT_HEADROOM, help=headroom_help)
    u.add_argument(
        "--max-quality-risk",
        choices=RISK_LEVELS,
        default=DEFAULT_MAX_QUALITY_RISK,
        help=f"riskiest plan that counts as optimized (default {DEFAULT_MAX_QUALITY_RISK})",
    )
    u.add_argument(
        "--trace-fallbacks",
        type=_integer,
        default=MAX_TRACE_FALLBACKS,
        help="trace-engine estimates for combinations the analytic engine does not model yet "
        f"(default {MAX_TRACE_FALLBACKS}; seconds each)",
    )
    u.add_argument("--no-recommend", action="store_true", help="skip the catalog GPU scan")
    u.add_argument("--json", action="store_true", help="print one JSON object")


def _register_doctor(sub: Any, headroom_help: str) -> None:
    from memfit.cli import add_flags
    from memfit.plan import DEFAULT_HEADROOM
    from memfit.plan.doctor import BATCH_FROM, CHOSE_GPU_BY, SIZED_BY

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
    d.add_argument("--json", action="store_true", help="print one JSON object")


# -- plan -------------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    from memfit.plan import PlanRequest, plan, recommend_gpus

    request = PlanRequest(
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
        lora_ranks=tuple(args.lora_rank or (16, 64)),
        prepare_kbit=args.prepare_kbit,
        n_alternatives=args.alternatives,
        confirm=args.confirm or ("none" if args.recommend_gpu else "shown"),
    )
    if args.recommend_gpu:
        advice = recommend_gpus(args.model, request)
        if args.json:
            print(
                json.dumps({"gpus": [a.to_json() for a in advice], "notes": advice.notes}, indent=2)
            )
        else:
            print(render_advice(advice, confirm=request.confirm))
        return EXIT_OK if advice else EXIT_DOES_NOT_FIT
    if args.gpu is None:
        raise SpecError("plan needs --gpu NAME (its rates rank the plans) or --recommend-gpu")
    result = plan(args.model, request, gpu=args.gpu, gpu_memory_bytes=args.gpu_memory)
    print(json.dumps(result.to_json(), indent=2) if args.json else render_plan(result))
    return EXIT_OK if result.fits else EXIT_DOES_NOT_FIT


def _rate(tokens_per_s: float) -> str:
    if tokens_per_s >= 1e6:
        return f"{tokens_per_s / 1e6:.1f}M"
    return f"{tokens_per_s / 1000:.1f}k" if tokens_per_s >= 1000 else f"{tokens_per_s:.0f}"


def _mem(opt: Any) -> str:
    return format_bytes(opt.need_bytes) if opt.need_bytes is not None else "n/a"


def render_plan(p: Any) -> str:
    from memfit.estimate.result import COMPONENTS
    from memfit.plan.cost import COST_CONSTANTS
    from memfit.plan.export import export_settings

    r, b = p.request, p.budget
    batch = f"global batch {r.global_batch}" if r.global_batch else f"batch {r.per_rank_batch}"
    lines = [
        f"memfit plan: {p.model_name}, {r.mode} seq {r.seq_len}, {batch}, on {r.gpus} x "
        f"{b.gpu_name}: limit {format_bytes(b.limit_bytes)} ({format_bytes(b.capacity_bytes)} "
        f"- {format_bytes(b.headroom_bytes)} headroom)",
        f"searched {p.n_candidates} combinations: {p.n_estimated} estimated by {p.search_engine} "
        f"({p.search_s:.2f} s), {p.n_pruned} skipped as dominated; "
        + (
            f"{p.n_confirmed} estimated by {p.confirm_engine} to confirm ({p.confirm_s:.1f} s), "
            f"{p.n_overruled} overruled; "
            if p.confirm_engine
            else ""
        )
        + f"{p.elapsed_s:.1f} s in all",
        "",
    ]
    rec = p.recommended or p.closest
    if p.recommended is None:
        lines.append("NOTHING FITS. closest attempt:" if rec else "NOTHING FITS.")
    if rec is not None:
        mfu = COST_CONSTANTS["mfu"][0]
        if p.recommended is not None:
            lines.append(f"recommended: {rec.settings.describe()}")
        else:
            lines.append(f"  {rec.settings.describe()}: {rec.reason}")
        lines.append(
            f"  predicted {rec.cost.step_s:.3g} s/step, {_rate(rec.cost.tokens_per_s)} tokens/s "
            f"(roofline at MFU {mfu:.0%}); quality risk: {rec.risk}"
        )
        lines += [f"    - {why}" for why in rec.risk_reasons]
        lines.append("")
        base = p.baseline.estimate
        lines.append(f"  {'memory at the peak':<22}{'naive baseline':>16}{'this plan':>16}")
        for c in COMPONENTS:
            old = format_bytes(base.components.get(c, 0)) if base else "n/a"
            new = format_bytes(rec.estimate.components.get(c, 0)) if rec.estimate else "n/a"
            lines.append(f"  {c:<22}{old:>16}{new:>16}")
        lines.append(f"  {'device (upper end)':<22}{_mem(p.baseline):>16}{_mem(rec):>16}")
        lines.append(f"  naive baseline: {p.baseline.settings.describe()}")
    if p.recommended is not None:
        lines += ["", "settings:"]
        for key, value in export_settings(rec.settings, r, p.model_name).items():
            text = json.dumps(value, indent=2) if isinstance(value, dict) else value
            lines.append(f"  {key}: " + text.replace("\n", "\n    "))
    if p.alternatives:
        lines += ["", f"alternatives:  {'s/step':>8} {'tokens/s':>9} {'memory':>11}  risk"]
        for a in p.alternatives:
            lines.append(
                f"  {a.settings.describe()}\n  {'':<14}{a.cost.step_s:>8.3g} "
                f"{_rate(a.cost.tokens_per_s):>9} {_mem(a):>11}  {a.risk}"
            )
    if p.rejected:
        head = (
            "faster plans that do not fit, closest first:"
            if p.recommended
            else "attempts, closest first:"
        )
        lines += ["", head]
        for x in p.rejected:
            lines.append(f"  {x.settings.describe()} ({x.cost.step_s:.3g} s/step)\n    {x.reason}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def render_advice(advice: list[Any], *, confirm: str | None = None) -> str:
    notes = list(getattr(advice, "notes", []))
    if confirm == "none" and advice:
        engine = advice[0].best.estimate.engine if advice[0].best.estimate else "search"
        notes.append(
            f"memory by the {engine} engine (upper range end), not confirmed by the trace engine "
            "(--confirm recommended does, seconds per GPU); confirm your pick with "
            "`memfit plan MODEL --gpu NAME --gpus N`"
        )
    if not advice:
        lines = ["no GPU in the catalog (up to 8 per job) fits a plan for this job"]
        return "\n".join(lines + [f"note: {n}" for n in notes])
    lines = [f"{'gpu':<24}{'count':>6}{'tokens/s':>10}{'per GPU':>9}{'memory':>12}  risk    plan"]
    for a in advice:
        lines.append(
            f"{a.gpu:<24}{a.gpus:>6}{_rate(a.best.cost.tokens_per_s):>10}"
            f"{_rate(a.tokens_per_s_per_gpu):>9}{_mem(a.best):>12}  {a.best.risk:<8}"
            f"{a.best.settings.describe()}"
        )
    return "\n".join(lines + [f"note: {n}" for n in notes])


# -- fit --------------------------------------------------------------------------------------
def cmd_fit(args: argparse.Namespace) -> int:
    from memfit.cli import _workload
    from memfit.plan import fit

    if args.gpu is None and args.gpu_memory is None:
        raise SpecError("fit needs --gpu NAME or --gpu-memory SIZE (e.g. 24GB)")
    result = fit(
        args.model,
        _workload(args),
        solve=args.solve,
        gpu=args.gpu,
        gpu_memory_bytes=args.gpu_memory,
        headroom=args.headroom,
    )
    print(json.dumps(result.to_json(), indent=2) if args.json else render_fit(result))
    return EXIT_OK if result.fits else EXIT_DOES_NOT_FIT


def render_fit(r: Any) -> str:
    what = {"batch": "batch size", "seq": "sequence length", "concurrency": "concurrent requests"}
    b = r.budget
    confirmed = r.confirmed_by not in (None, r.search_engine)
    lines = [
        f"largest {what[r.solve]} that fits {b.gpu_name}: {r.max_value}",
        f"  limit {format_bytes(b.limit_bytes)} = {format_bytes(b.capacity_bytes)} - "
        f"{format_bytes(b.headroom_bytes)} headroom; searched with {r.search_engine}"
        f"{', confirmed by ' + r.confirmed_by if confirmed else ''} "
        f"({r.n_estimates} estimates)",
    ]
    est = r.estimate
    if est is not None:
        from memfit.plan.budget import need_bytes

        high = need_bytes(est)
        lines.append(
            f"  at {'that' if r.fits else 'the smallest'} value: device "
            f"{format_bytes(est.device_used_bytes)} (upper end {format_bytes(high)}), peak "
            f"allocated {format_bytes(est.peak_allocated_bytes)}"
        )
    if r.kv_table:
        lines += ["", f"  {'context':>8} {'requests':>9} {'KV cache':>12}"]
        for row in r.kv_table:
            lines.append(
                f"  {row['context_tokens']:>8} {row['max_concurrency']:>9} "
                f"{format_bytes(row['kv_cache_bytes']):>12}"
            )
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


# -- upgrade ----------------------------------------------------------------------------------
STATUS_MARK = {
    "triggered": "[x]",
    "not_triggered": "[ ]",
    "not_applicable": "[-]",
    "unknown": "[?]",
}


def cmd_upgrade(args: argparse.Namespace) -> int:
    from memfit.plan.upgrade import upgrade_verdict

    v = upgrade_verdict(
        args.model, gpu=args.gpu, mode=args.mode, seq_len=args.seq, batch_size=args.batch,
        global_batch=args.global_batch, gpus=args.gpus, new_tokens=args.new_tokens,
        concurrency=args.concurrency, context=args.context,
        throughput_target=args.throughput_target, headroom=args.headroom,
        max_quality_risk=args.max_quality_risk, recommend=not args.no_recommend,
        trace_fallbacks=args.trace_fallbacks,
    )  # fmt: skip
    print(json.dumps(v.to_json(), indent=2) if args.json else render_upgrade(v))
    if v.verdict == "undetermined":
        return 2
    return EXIT_DOES_NOT_FIT if v.upgrade else EXIT_OK


def render_upgrade(v: Any) -> str:
    r = v.request
    job = f"{r.mode} seq {r.seq_len}"
    if r.mode == "infer":
        job += f", {v.concurrency} concurrent requests of {v.context_tokens} tokens"
    elif r.global_batch:
        job += f", global batch {r.global_batch}"
    lines = [f"memfit upgrade: {v.model_name}, {job}, on {r.gpus} x {v.gpu_name}", ""]
    for item in v.items:
        lines.append(f"{STATUS_MARK[item.status]} {item.title}: {item.status.replace('_', ' ')}")
        lines.append(f"    {item.evidence}")
    lines += ["", f"verdict: {v.summary}"]
    if v.resolving:
        lines.append("GPUs that resolve the triggered items (fastest first):")
        lines.append(render_advice(v.resolving[:N_RESOLVING_SHOWN]))
        if len(v.resolving) > N_RESOLVING_SHOWN:
            lines.append(f"... and {len(v.resolving) - N_RESOLVING_SHOWN} more (--json)")
    lines += [f"note: {n}" for n in v.notes]
    return "\n".join(lines)


#: GPUs listed in the text output of ``upgrade`` (``--json`` lists all).
N_RESOLVING_SHOWN = 8


# -- doctor -----------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace) -> int:
    from memfit.cli import _workload
    from memfit.plan.doctor import doctor

    report = doctor(
        args.model, _workload(args), gpu=args.gpu, sized_by=args.sized_by,
        quality_checked=args.quality_checked, batch_from=args.batch_from,
        benchmarked=args.benchmarked, log=args.log, chose_gpu_by=args.chose_gpu_by,
        headroom=args.headroom,
    )  # fmt: skip
    print(json.dumps(report.to_json(), indent=2) if args.json else render_doctor(report))
    return EXIT_OK


def render_doctor(r: Any) -> str:
    where = f" on {r.gpu_name}" if r.gpu_name else ""
    lines = [
        f"memfit doctor: {r.model_name}{where}: {len(r.applying)} of {len(r.findings)} mistakes "
        f"apply, {sum(f.applies == 'unknown' for f in r.findings)} unknown "
        f"(engine {r.estimate.engine})",
        "",
    ]
    mark = {"yes": "[x]", "no": "[ ]", "unknown": "[?]"}
    for f in r.findings:
        lines.append(f"{mark[f.applies]} {f.title}: {f.applies}")
        lines.append(f"    {f.evidence}")
        if f.applies != "no":
            lines.append(f"    next: {f.next_step}")
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)
