"""``memfit gpus``: the GPU catalog with rates, on-demand prices and whether ``plan`` can rank each
GPU (argparse subcommand for :mod:`memfit.cli`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from memfit.errors import SpecError
from memfit.hardware import list_gpus
from memfit.hardware.prices import PRICES_ENV, load_prices
from memfit.plan.cost import Rates
from memfit.units import GiB

GPUS_EXAMPLES = """examples:
  memfit gpus
  memfit gpus --json
  memfit gpus --prices my-prices.json     # your $/GPU-hour over the catalog's
"""


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    g = sub.add_parser(
        "gpus",
        help="list the GPU catalog: memory, rates, on-demand prices, plan-ready",
        description="Every GPU of the catalog with its capacity (what torch can allocate: the "
        "torch-visible total where published, else estimated below nvidia-smi's memory.total; "
        "every fits verdict judges against it), bandwidth, dense bf16/fp8 tensor TFLOPS, "
        "GPU-to-GPU link, the on-demand $/GPU-hour with its provider and date, and whether "
        "`memfit plan` can rank it (it needs a compute rate and a memory bandwidth). Sources of "
        "every row, capacity and price, and nvidia-smi's totals: --json.",
        epilog=GPUS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument(
        "--prices",
        metavar="FILE",
        help=f"JSON/YAML price file overriding the catalog's prices (default: ${PRICES_ENV})",
    )
    g.add_argument("--json", action="store_true", help="print one JSON list")
    return {"gpus": cmd_gpus}


def plan_ready(gpu: Any) -> tuple[bool, str | None]:
    """Whether the cost model can time ``gpu`` (``memfit plan --gpu``), else why not."""
    try:
        Rates.of(gpu)
    except SpecError:
        return False, "no published compute rate or memory bandwidth: plan cannot rank it"
    return True, None


def cmd_gpus(args: argparse.Namespace) -> int:
    gpus = list_gpus()
    prices = load_prices(args.prices)
    if args.json:
        rows = []
        for g in gpus:
            ready, why = plan_ready(g)
            row = asdict(g) | {
                "capacity_bytes": g.capacity_bytes,
                "capacity_measured": g.capacity_measured,
                "price": prices.of(g).to_json(),
                "plan_ready": ready,
            }
            rows.append(row | {"plan_not_ready_reason": why})
        print(json.dumps(rows, indent=2))
        return 0

    def mark(g: Any) -> str:
        return "" if g.capacity_measured else "~"

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    # 100 columns: the price's provider and date, every source: --json
    print(
        f"{'name':<23}{'capacity':>9}  {'arch':<9}{'mem GB/s':>8}{'bf16 TF':>8}{'fp8 TF':>7}"
        f"{'link GB/s':>10}  {'form':<9}{'$/h':>6}  plan"
    )
    unpriced = 0
    estimated = sum(not g.capacity_measured for g in gpus)
    for g in gpus:
        price = prices.of(g)
        ready, _ = plan_ready(g)
        usd = "-" if price.usd_per_hour is None else f"{price.usd_per_hour:.2f}"
        unpriced += price.usd_per_hour is None
        print(
            f"{g.name:<23}{g.capacity_bytes / GiB:>5.1f} GiB{mark(g):<1} "
            f"{g.arch:<9}"
            f"{num(g.memory_bandwidth_gbps):>8}{num(g.bf16_dense_tflops):>8}"
            f"{num(g.fp8_dense_tflops):>7}{num(g.interconnect_gbps):>10}  "
            f"{g.form_factor or '-':<9}{usd:>6}  {'yes' if ready else 'no'}"
        )
    print(
        f"note: {len(gpus)} GPUs; capacity: what torch can allocate (total_memory), the figure\n"
        f"  verdicts use; ~ estimated ({estimated} GPUs: nothing published), else observed;\n"
        f"  TFLOPS dense (no sparsity); $/h: one GPU on demand, one published offer ({unpriced}\n"
        "  without a public price); plan: `memfit plan` can time it; sources, providers, dates,\n"
        "  nvidia-smi totals and reasons: --json"
    )
    if prices.files:
        print(f"note: prices from {', '.join(prices.files)} over the catalog's")
    return 0
