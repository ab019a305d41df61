"""``memfit layouts``: every dp x tp x pp x cp layout of N GPUs for a training job, with the peak
GPU of each, ranked by predicted step time (argparse subcommand for :mod:`memfit.cli`; the library
calls are :func:`memfit.estimate.parallel.enumerate_layouts` and
:func:`memfit.plan.layout_cost.layout_step_cost`); and the layout path of ``memfit plan``
(``--layout``, ``--nodes``, ``--gpus-per-node``, ``--export``: :func:`cmd_plan_layout`, the
library call :func:`memfit.plan.layout_plan.plan_layout`)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memfit import progress
from memfit.errors import SpecError
from memfit.estimate.parallel import LayoutPeak, enumerate_layouts
from memfit.estimate.parallel.shape import read_shape
from memfit.flags import EXIT_DOES_NOT_FIT, EXIT_OK, positive_int
from memfit.hardware import get_gpu
from memfit.hardware.prices import load_prices
from memfit.models import resolve_model
from memfit.plan.cost import Rates
from memfit.plan.layout_cost import DEFAULT_GPUS_PER_NODE, Topology, layout_step_cost
from memfit.plan.layout_export import export_layout
from memfit.plan.layout_plan import (
    GPUCount,
    LayoutOption,
    LayoutPlan,
    plan_layout,
    recommend_layout_gpus,
)
from memfit.units import GiB

LAYOUTS_EXAMPLES = """examples:
  memfit layouts llama-3.1-70b --gpus 64 --global-batch 256 --seq 8192 --gpu H100
  memfit layouts path/to/llama-3.1-405b --gpus 1024 --global-batch 1024 --seq 8192 --gpu H100 --json
"""
#: Order of the checkpointing modes when layouts tie: less recomputation first.
RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
VERDICT_ORDER = {"fits": 0, "tight": 1, "does not fit": 2, None: 3}


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    g = sub.add_parser(
        "layouts",
        help="every dp x tp x pp x cp layout of N GPUs for a training job, with its peak GPU",
        description="Every data-, tensor-, pipeline- and context-parallel layout of --gpus GPUs "
        "for --global-batch sequences of --seq tokens, each micro-batch size and checkpointing "
        "mode, estimated by the per-rank closed form (memfit.estimate.parallel) and judged on "
        "--gpu. Ranked by the verdict, then the predicted step time (memfit.plan.layout_cost: "
        "compute at the GPU's calibrated MFU, the schedule's pipeline bubble, tensor-, context-"
        "and expert-parallel traffic, FSDP / data-parallel collectives inside and across nodes); "
        "`memfit plan MODEL --layout` picks the fastest that fits and exports it.",
        epilog=LAYOUTS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("model", help="a bundled name, path/to/config.json or its folder, org/name")
    g.add_argument("--gpus", type=positive_int, required=True, help="GPUs in the job")
    g.add_argument(
        "--global-batch", type=positive_int, required=True, help="sequences per optimizer step"
    )
    g.add_argument("--seq", type=positive_int, required=True, help="tokens per sequence")
    g.add_argument("--gpu", help="the GPU to judge each layout on (e.g. H100)")
    g.add_argument(
        "--shard",
        choices=("fsdp", "zero1"),
        default="fsdp",
        help="how the data- and context-parallel ranks hold the model: fsdp (torchtitan's "
        "FSDP2) or zero1 (Megatron's distributed optimizer); default fsdp",
    )
    g.add_argument(
        "--pp-schedule", default="1f1b", help="pipeline schedule of pp > 1 layouts (default 1f1b)"
    )
    g.add_argument("--top", type=positive_int, default=10, help="layouts to print (default 10)")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument("--json", action="store_true", help="print one JSON object (every layout)")
    return {"layouts": cmd_layouts}


def rank_key(row: LayoutPeak, step_s: float) -> tuple[Any, ...]:
    """Fitting layouts first, then the fastest; ties to the least recomputation."""
    return (VERDICT_ORDER.get(row.verdict, 3), round(step_s, 9),
            RECOMPUTE_ORDER[row.checkpointing], row.device_used_bytes)  # fmt: skip


def cmd_layouts(args: argparse.Namespace) -> int:
    gpu = get_gpu(args.gpu) if args.gpu else None
    source = resolve_model(args.model)
    with progress.terminal(quiet=args.quiet, json_out=args.json):
        progress.report(f"estimating every layout of {args.gpus} GPUs")
        rows = enumerate_layouts(
            source,
            gpus=args.gpus,
            global_batch=args.global_batch,
            seq_len=args.seq,
            gpu=gpu,
            shard=args.shard,
            pp_schedule=args.pp_schedule,
        )
        costs = _costs(source, rows, args.seq, gpu)
        ranked = sorted(zip(rows, costs, strict=True), key=lambda rc: rank_key(rc[0], rc[1]))
    fits = [r for r in rows if r.verdict == "fits"]
    if args.json:
        out = [{**r.to_json(), "step_s": c} for r, c in ranked]
        print(json.dumps({"model": source.name, "gpu": getattr(gpu, "name", None),
                          "layouts": out}, indent=2))  # fmt: skip
    else:
        _print(ranked[: args.top], len(rows), len(fits), gpu)
    return EXIT_OK if fits or gpu is None else EXIT_DOES_NOT_FIT


def _costs(source: Any, rows: list[LayoutPeak], seq: int, gpu: Any) -> list[float]:
    """Predicted step time of each layout on ``gpu`` (H100-80GB's rates without one: the
    order, not the figure, is what the table uses then)."""
    g = gpu if gpu is not None else get_gpu("H100-80GB")
    shape, rates, topo = read_shape(source.spec), Rates.of(g), Topology.of(g)
    return [
        layout_step_cost(shape, replace(r.choice, seq_len=seq), rates, topo).step_s for r in rows
    ]


def _print(rows: list[tuple[LayoutPeak, float]], n_all: int, n_fit: int, gpu: Any) -> None:
    print(
        f"{'dp':>5}{'tp':>4}{'pp':>4}{'cp':>4}{'micro':>7}{'accum':>7}  {'ckpt':<10}"
        f"{'rank':>5}{'device GiB':>12}{'upper GiB':>11}{'bubble':>8}{'step s':>9}  verdict"
    )
    for r, step in rows:
        print(
            f"{r.dp:>5}{r.tp:>4}{r.pp:>4}{r.cp:>4}{r.micro_batch:>7}{r.grad_accum:>7}  "
            f"{r.checkpointing:<10}{r.peak_pp_rank:>5}{r.device_used_bytes / GiB:>12.1f}"
            f"{r.device_used_high_bytes / GiB:>11.1f}{r.bubble:>8.2f}{step:>9.2f}  "
            f"{r.verdict or '-'}"
        )
    where = f" on {gpu.name}" if gpu is not None else " (no --gpu: no verdict)"
    print(
        f"note: {n_all} layouts, {n_fit} fit{where}; ranked by the verdict, then the predicted "
        "step time (memfit.plan.layout_cost; without --gpu at H100-80GB's rates); rank: the "
        "pipeline rank that peaks; --json lists them all; `memfit plan MODEL --layout` searches "
        "schedules and sharding too and exports the pick"
    )


# -- memfit plan: the layout path ---------------------------------------------------------------
#: ``--export`` formats of the chosen layout (memfit.plan.layout_export).
EXPORTS = ("torchtitan", "torchtitan-toml", "megatron", "deepspeed", "accelerate")


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    """``plan``'s layout flags (the search runs with any of them, or past one node's GPUs)."""
    p.add_argument(
        "--layout",
        action="store_true",
        help="train: search dp/fsdp x tp x pp (schedules) x cp (x ep) layouts of --gpus GPUs for "
        "the fastest that fits (on by itself past one node's GPUs, or with --nodes)",
    )
    p.add_argument("--nodes", type=positive_int, help="nodes in the job (with --gpus-per-node)")
    p.add_argument(
        "--gpus-per-node",
        type=positive_int,
        help="GPUs per node (default: the GPU's platform, 8 for HGX / OAM boards)",
    )
    p.add_argument(
        "--export",
        choices=EXPORTS,
        help="print the chosen layout as that framework's config only (torchtitan: 0.3.0 CLI "
        "overrides; torchtitan-toml: the 0.2.2 TOML sections; megatron: pretrain_gpt.py "
        "arguments; deepspeed: JSON; accelerate: config YAML as JSON)",
    )


def wants_layout(args: argparse.Namespace) -> bool:
    """Whether ``plan`` runs the layout search: a training job with --layout, --nodes or
    --gpus-per-node, or more GPUs than one node holds."""
    if getattr(args, "mode", "train") != "train":
        return False
    if args.layout or args.nodes or args.gpus_per_node or args.export:
        return True
    per_node = DEFAULT_GPUS_PER_NODE
    if args.gpu:
        per_node = getattr(get_gpu(args.gpu), "scale_up_gpus", None) or per_node
    return (args.gpus or 1) > per_node


def _job_gpus(args: argparse.Namespace, gpu: Any) -> tuple[int, int]:
    """(GPUs, GPUs per node) from --gpus / --nodes / --gpus-per-node."""
    per_node = args.gpus_per_node or getattr(gpu, "scale_up_gpus", None) or DEFAULT_GPUS_PER_NODE
    gpus = args.gpus or 1
    if args.nodes:
        if gpus not in (1, args.nodes * per_node):
            raise SpecError(
                f"--gpus ({gpus}) disagrees with --nodes x --gpus-per-node ({args.nodes} x "
                f"{per_node} = {args.nodes * per_node}); give one or make them agree"
            )
        gpus = args.nodes * per_node
    return gpus, per_node


def cmd_plan_layout(args: argparse.Namespace) -> int:
    """``memfit plan MODEL --layout ...``: the fastest fitting layout, alternatives, the nearest
    that does not fit, and its exports (or, with --recommend-gpu, how many GPUs of each kind)."""
    if args.global_batch is None:
        raise SpecError("the layout search needs --global-batch (sequences per optimizer step)")
    source = resolve_model(args.model)
    prices = load_prices(args.prices)
    if args.recommend_gpu:
        return _recommend(args, source, prices)
    if args.gpu is None:
        raise SpecError("plan --layout needs --gpu NAME (or --recommend-gpu)")
    gpu = get_gpu(args.gpu)
    gpus, per_node = _job_gpus(args, gpu)
    plan = plan_layout(
        source, gpus=gpus, global_batch=args.global_batch, seq_len=args.seq, gpu=gpu,
        gpus_per_node=per_node, usd_per_gpu_hour=prices.of(gpu).usd_per_hour,
        n_alternatives=args.alternatives,
    )  # fmt: skip
    exports = None
    if plan.best is not None:
        exports = export_layout(
            plan.best.peak, seq_len=args.seq, global_batch=args.global_batch,
            n_layers=int(getattr(source.spec, "n_layers", 0) or 0),
            n_nodes=math.ceil(gpus / per_node),
        )  # fmt: skip
    if args.export:
        if exports is None:
            raise SpecError("no layout fits, so there is nothing to --export; see `--layout`")
        print(_one_export(exports, args.export))
    elif args.json:
        print(json.dumps({**plan.to_json(), "exports": exports}, indent=2))
    else:
        print(render_layout_plan(plan, exports))
    return EXIT_OK if plan.fits else EXIT_DOES_NOT_FIT


def _one_export(exports: dict[str, Any], name: str) -> str:
    if name == "torchtitan":
        return " ".join(exports["torchtitan"]["overrides"])
    if name == "torchtitan-toml":
        return str(exports["torchtitan_toml"])
    if name == "megatron":
        return " ".join(exports["megatron"]["args"])
    cfg = exports[name]["config"]
    if cfg is None:
        raise SpecError(f"--export {name}: {'; '.join(exports[name]['notes'])}")
    return json.dumps(cfg, indent=2)


def _recommend(args: argparse.Namespace, source: Any, prices: Any) -> int:
    rows = recommend_layout_gpus(
        source, global_batch=args.global_batch, seq_len=args.seq, prices=prices,
        gpus_per_node=args.gpus_per_node, max_gpus=args.gpus if args.gpus > 1 else None,
    )  # fmt: skip
    if args.json:
        print(json.dumps({"gpus": [r.to_json() for r in rows]}, indent=2))
    else:
        print(render_layout_advice(rows))
    return EXIT_OK if any(r.smallest for r in rows) else EXIT_DOES_NOT_FIT


def _layout_line(o: LayoutOption) -> str:
    p = o.peak
    sched = f" {p.pp_schedule}" if p.pp > 1 else ""
    ep = f" x ep {p.ep}" if p.ep > 1 else ""
    return (
        f"dp {p.dp} x tp {p.tp} x pp {p.pp}{sched} x cp {p.cp}{ep}, {p.shard}, micro-batch "
        f"{p.micro_batch} x {p.grad_accum}, {p.checkpointing} checkpointing"
    )


def _figures(o: LayoutOption, capacity: int) -> str:
    usd = o.usd_per_million_tokens
    price = f", ${usd:.2f} per 1M tokens" if usd is not None else ""
    return (
        f"step {o.cost.step_s:.2f} s, {o.cost.tokens_per_s:,.0f} tokens/s{price}; peak GPU "
        f"{o.peak.device_used_bytes / GiB:.1f} GiB (upper "
        f"{o.peak.device_used_high_bytes / GiB:.1f}) of {capacity / GiB:.1f} GiB: {o.peak.verdict}"
    )


def render_layout_plan(plan: LayoutPlan, exports: dict[str, Any] | None) -> str:
    cap = get_gpu(plan.gpu).capacity_bytes
    lines = [
        f"{plan.model}: {plan.gpus} x {plan.gpu} ({plan.gpus_per_node} per node), global batch "
        f"{plan.global_batch} x {plan.seq_len} tokens"
    ]
    if plan.best is not None:
        b = plan.best
        parts = ", ".join(f"{k} {v:.2f}" for k, v in b.cost.parts_s.items() if v >= 0.005)
        lines += ["fastest layout that fits:", f"  {_layout_line(b)}", f"  {_figures(b, cap)}",
                  f"  step time (s): {parts}"]  # fmt: skip
    else:
        lines.append("no layout fits")
    if plan.alternatives:
        lines.append("alternatives (fastest of other degrees):")
        lines += [f"  {_layout_line(a)}\n    {_figures(a, cap)}" for a in plan.alternatives]
    if plan.nearest_miss is not None:
        m = plan.nearest_miss
        what = "faster, does not fit" if plan.best is not None else "closest to fitting"
        lines += [f"nearest that does not fit ({what}):", f"  {_layout_line(m)}",
                  f"  {_figures(m, cap)}"]  # fmt: skip
    if exports is not None:
        lines += [
            "torchtitan 0.3: " + " ".join(exports["torchtitan"]["overrides"]),
            "Megatron-LM: " + " ".join(exports["megatron"]["args"]),
            "(--export torchtitan | torchtitan-toml | megatron | deepspeed | accelerate prints "
            "one config; --json has them all with their notes)",
        ]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def render_layout_advice(rows: list[GPUCount]) -> str:
    lines = [f"{'GPU':<12}{'fewest GPUs':>12}{'step s':>9}{'$/1M tok':>10}   {'cheapest':>9}"
             f"{'$/1M tok':>10}  tried"]  # fmt: skip
    for r in rows:
        s, c = r.smallest, r.cheapest
        if s is None or s.best is None:
            lines.append(f"{r.gpu:<12}{'none fits':>12}{'':>9}{'':>10}   {'':>9}{'':>10}  "
                         f"{', '.join(map(str, r.tried))}")  # fmt: skip
            continue
        lines.append(
            f"{r.gpu:<12}{s.gpus:>12}{s.best.cost.step_s:>9.2f}{_usd(s):>10}   "
            f"{(c.gpus if c else s.gpus):>9}{_usd(c or s):>10}  {', '.join(map(str, r.tried))}"
        )
    lines.append(
        "note: per training GPU (SXM / OAM / superchip), the fewest GPUs (powers of two from the "
        "model-state floor) on which a layout fits, and the cheapest per 1M tokens of the counts "
        "tried; `memfit plan MODEL --layout --gpu NAME --gpus N` shows the layout"
    )
    return "\n".join(lines)


def _usd(p: LayoutPlan) -> str:
    usd = p.best.usd_per_million_tokens if p.best is not None else None
    return "-" if usd is None else f"{usd:.2f}"
