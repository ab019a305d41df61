"""Calibrate and check the planner's step-time model (``memfit.plan.cost``) on published figures.

Loads ``benchmarks/data/step_time_published.jsonl`` (each point: model, GPU, settings, the quoted
source and the measured figure), predicts each with ``train_step_cost`` / ``infer_cost`` and
writes ``benchmarks/results/step_time_calibration.md``: per point measured, predicted and error,
the median absolute and worst error overall and per technique, the leave-one-out error of the
fit, and a pairwise ranking check (points of one source that differ in one setting: does the
model order them as measured?).

The free constants (MFU per GPU generation, dequantization traffic per kernel family, host
overhead per layer, host-link efficiency, decode bandwidth) are fitted by class: each constant is
solved (bisection on a log scale) so that the median log-ratio predicted/measured time of the
points of its class is 0; the classes are disjoint enough that three sweeps converge. No point has
its own constant. ``--fit`` prints the fitted values (to copy into cost.py, rounded); without it
the shipped constants are evaluated and the leave-one-out refit is reported beside them.

Error sign: + means memfit predicts a slower step (more time) than measured (the safe side).

    PYTHONPATH=src python benchmarks/step_time_calibration.py [--fit]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from memfit.hardware import get_gpu
from memfit.models.bundled import find_bundled
from memfit.models.model_spec import ModelSpec
from memfit.models.param_count import count_params
from memfit.plan import cost
from memfit.plan.cost import ModelFacts, Rates, infer_cost, train_step_cost
from memfit.plan.space import Settings

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "step_time_published.jsonl"
RESULT = ROOT / "results" / "step_time_calibration.md"


@dataclass
class Point:
    raw: dict[str, Any]
    facts: ModelFacts
    rates: Rates
    settings: Settings

    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def gpus(self) -> int:
        return int(self.raw.get("gpus", 1))

    @property
    def tokens(self) -> float:
        """Tokens of one step over all GPUs (training) or generated (decode)."""
        r, s = self.raw, self.settings
        if r["mode"] == "infer":
            return float(s.micro_batch * r["new_tokens"])
        return float(s.micro_batch * s.grad_accum * r["seq_len"] * s.dp)

    def predicted_step_s(self) -> float:
        r = self.raw
        if r["mode"] == "infer":
            c = infer_cost(
                self.settings, self.facts, self.rates, seq_len=r["seq_len"],
                new_tokens=r["new_tokens"], eager_overhead=not r["compiled"],
            )  # fmt: skip
        else:
            c = train_step_cost(
                self.settings, self.facts, self.rates, seq_len=r["seq_len"],
                trainable_fraction=r["trainable_fraction"], eager_overhead=not r["compiled"],
            )  # fmt: skip
        return c.step_s

    def measured_step_s(self) -> float:
        """The measured figure as the time of the step memfit predicts."""
        unit, v = self.raw["unit"], float(self.raw["value"])
        if unit == "tokens_per_s_total" or unit == "decode_tokens_per_s":
            return self.tokens / v
        if unit == "tokens_per_s_per_gpu":
            return self.tokens / (v * self.gpus)
        if unit == "s_per_step":
            return v
        if unit == "min_per_1k_micro_batches":
            return v * 60 / 1000
        if unit == "tflops_per_gpu_megatron":
            return megatron_flops(self) / (v * 1e12)
        raise ValueError(f"{self.id}: unknown unit {unit!r}")

    def implied_mfu(self) -> float:
        """The FLOP utilization the measured time implies at memfit's FLOP count (recompute
        included); above :data:`PLAUSIBLE_MFU` the point is reported but not fitted."""
        if self.raw["mode"] != "train":
            return 0.0
        c = train_step_cost(
            self.settings, self.facts, self.rates, seq_len=self.raw["seq_len"],
            trainable_fraction=self.raw["trainable_fraction"],
        )  # fmt: skip
        return c.parts_s["compute"] * cost.mfu(self.rates) / self.measured_step_s()

    def log_ratio(self) -> float:
        return math.log(self.predicted_step_s() / self.measured_step_s())

    @property
    def tokens_per_micro_batch(self) -> int:
        return int(self.settings.micro_batch * self.raw["seq_len"])


def megatron_flops(p: Point) -> float:
    """Megatron-LM's FLOPs of one step with recomputation (Narayanan et al. 2021, §5.1):
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    b, s = p.settings.micro_batch * p.settings.grad_accum, p.raw["seq_len"]
    n_l, h, v = p.facts.n_layers, p.facts.d_model, p.facts.vocab_size
    return 96 * b * s * n_l * h * h * (1 + s / (6 * h) + v / (16 * n_l * h))


def load_points(path: Path = DATA) -> list[Point]:
    points = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        if "model" in raw:
            bundled = find_bundled(raw["model"])
            if bundled is None:
                raise SystemExit(f"{raw['id']}: model {raw['model']!r} is not bundled")
            spec = ModelSpec.from_config(json.loads(bundled.config_path.read_text()))
            facts = ModelFacts.from_spec(spec, count_params(spec, "causal-lm") or 0)
        else:
            m = raw["model_facts"]
            facts = ModelFacts(
                n_params=m["n_params"], n_layers=m["n_layers"], d_model=m["d_model"],
                vocab_size=m["vocab_size"],
                kv_bytes_per_token_per_byte=2 * m["n_layers"] * m["n_kv_heads"] * m["head_dim"],
                tied_embeddings=m["tied_embeddings"],
            )  # fmt: skip
        settings = Settings(**raw["settings"], grad_accum=raw.get("grad_accum", 1))
        points.append(Point(raw, facts, Rates.of(get_gpu(raw["gpu"])), settings))
    return points


# -- the free constants and their classes -----------------------------------------------------


@dataclass(frozen=True)
class Free:
    """A fitted constant: where it lives, its search range, and the points of its class."""

    name: str
    get: Callable[[], float]
    set: Callable[[float], None]
    lo: float
    hi: float
    member: Callable[[Point], bool]
    increases_time: bool  # a larger value predicts a longer step
    #: the value when no point is in the class (leave-one-out of a class's only point): another
    #: fitted constant, so the left-out point never informs its own prediction
    fallback: Callable[[], float] | None = None


def _const_setter(key: str) -> Callable[[float], None]:
    def put(v: float) -> None:
        cost.COST_CONSTANTS[key] = (v, cost.COST_CONSTANTS[key][1])

    return put


def _dict_setter(table: dict[str, float], keys: tuple[str, ...]) -> Callable[[float], None]:
    def put(v: float) -> None:
        for k in keys:
            table[k] = v

    return put


def _is_train(p: Point) -> bool:
    return p.raw["mode"] == "train"


def _compute_bound(p: Point) -> bool:
    return (
        _is_train(p) and p.settings.quant == "none" and p.settings.offload == "none"
        and p.tokens_per_micro_batch >= 2048
    )  # fmt: skip


def _mfu_free(arch: str, fitted_to: tuple[str, ...]) -> Free:
    return Free(
        name=f"MFU_BY_ARCH[{arch}]",
        get=lambda: cost.MFU_BY_ARCH[arch],
        set=_dict_setter(cost.MFU_BY_ARCH, fitted_to),
        lo=0.05, hi=1.0,
        member=lambda p: _compute_bound(p) and p.rates.arch == arch,
        increases_time=False,
        fallback=None if arch == "ampere" else lambda: cost.MFU_BY_ARCH["ampere"],
    )  # fmt: skip


BNB = ("nf4", "nf4-dq", "fp4", "int8")
GPTQ = ("int4-gptq", "int4-awq")
#: Read the packed weight (0.5 B), write the 16-bit copy (2 B), read it in the GEMM (2 B): the
#: dequantization traffic cannot be less.
DEQUANT_FLOOR = 4.5

FREE: tuple[Free, ...] = (
    Free(
        "host_overhead_per_layer_s",
        lambda: cost.COST_CONSTANTS["host_overhead_per_layer_s"][0],
        _const_setter("host_overhead_per_layer_s"),
        1e-5,
        2e-2,
        lambda p: (
            not p.raw["compiled"]
            and p.settings.quant == "none"
            and (p.raw["mode"] == "infer" or p.tokens_per_micro_batch <= 512)
        ),
        True,
    ),
    Free(
        "quant_overhead_per_layer_s",
        lambda: cost.COST_CONSTANTS["quant_overhead_per_layer_s"][0],
        _const_setter("quant_overhead_per_layer_s"),
        1e-6,
        2e-2,
        lambda p: (
            not p.raw["compiled"]
            and p.settings.quant != "none"
            and (p.raw["mode"] == "infer" or p.tokens_per_micro_batch <= 512)
        ),
        True,
    ),
    Free(
        "decode_mbu",
        lambda: cost.COST_CONSTANTS["decode_mbu"][0],
        _const_setter("decode_mbu"),
        0.1,
        1.0,
        lambda p: (
            p.raw["mode"] == "infer"
            and p.raw["compiled"]
            and p.settings.tp == 1
            and p.settings.quant == "none"
        ),
        False,
    ),
    Free(
        "quant_decode_bandwidth_share",
        lambda: cost.COST_CONSTANTS["quant_decode_bandwidth_share"][0],
        _const_setter("quant_decode_bandwidth_share"),
        0.05,
        1.0,
        lambda p: p.raw["mode"] == "infer" and p.raw["compiled"] and p.settings.quant != "none",
        False,
    ),
    Free(
        "tp_allreduce_latency_s",
        lambda: cost.COST_CONSTANTS["tp_allreduce_latency_s"][0],
        _const_setter("tp_allreduce_latency_s"),
        1e-7,
        1e-3,
        lambda p: p.raw["mode"] == "infer" and p.settings.tp > 1,
        True,
    ),
    _mfu_free("ampere", ("ampere",)),
    _mfu_free("ada", ("ada",)),
    _mfu_free("hopper", ("hopper", "blackwell", "cdna3")),
    _mfu_free("volta", ("volta", "turing")),
    Free(
        "DEQUANT_BYTES_PER_WEIGHT[bitsandbytes/torchao 4-bit, int8]",
        lambda: cost.DEQUANT_BYTES_PER_WEIGHT["nf4"],
        _dict_setter(cost.DEQUANT_BYTES_PER_WEIGHT, BNB),
        DEQUANT_FLOOR,
        200.0,
        lambda p: _is_train(p) and p.settings.quant in BNB and p.tokens_per_micro_batch > 512,
        True,
    ),
    Free(
        "DEQUANT_BYTES_PER_WEIGHT[GPTQ/AWQ]",
        lambda: cost.DEQUANT_BYTES_PER_WEIGHT["int4-gptq"],
        _dict_setter(cost.DEQUANT_BYTES_PER_WEIGHT, GPTQ),
        DEQUANT_FLOOR,
        200.0,
        lambda p: _is_train(p) and p.settings.quant in GPTQ and p.tokens_per_micro_batch > 512,
        True,
    ),
    Free(
        "host_link_efficiency",
        lambda: cost.COST_CONSTANTS["host_link_efficiency"][0],
        _const_setter("host_link_efficiency"),
        0.02,
        1.0,
        lambda p: _is_train(p) and p.settings.offload != "none",
        False,
    ),
)


@contextmanager
def preserved() -> Iterator[None]:
    """Restore every fitted constant after the block."""
    consts = dict(cost.COST_CONSTANTS)
    mfus = dict(cost.MFU_BY_ARCH)
    dequant = dict(cost.DEQUANT_BYTES_PER_WEIGHT)
    try:
        yield
    finally:
        cost.COST_CONSTANTS.clear()
        cost.COST_CONSTANTS.update(consts)
        cost.MFU_BY_ARCH.clear()
        cost.MFU_BY_ARCH.update(mfus)
        cost.DEQUANT_BYTES_PER_WEIGHT.clear()
        cost.DEQUANT_BYTES_PER_WEIGHT.update(dequant)


def _solve(free: Free, members: list[Point]) -> None:
    """Set ``free`` so the median log-ratio of ``members`` is 0 (bisection in log space)."""

    def median_at(v: float) -> float:
        free.set(v)
        return statistics.median(p.log_ratio() for p in members)

    lo, hi = math.log(free.lo), math.log(free.hi)
    for _ in range(50):
        mid = (lo + hi) / 2
        m = median_at(math.exp(mid))
        too_slow = m > 0
        if too_slow == free.increases_time:
            hi = mid
        else:
            lo = mid
    free.set(math.exp((lo + hi) / 2))


#: A measured time that implies more than this share of the dense peak at memfit's FLOP count is
#: not fitted (a counting difference in the source, or a setting it does not state).
PLAUSIBLE_MFU = 0.85


def fit(points: list[Point], sweeps: int = 8) -> dict[str, float]:
    """Fit every free constant on its class of ``points``; returns the fitted values."""
    points = [p for p in points if p.implied_mfu() <= PLAUSIBLE_MFU]
    for _ in range(sweeps):
        for free in FREE:
            members = [p for p in points if free.member(p)]
            if members:
                _solve(free, members)
            elif free.fallback is not None:
                free.set(free.fallback())
    return {f.name: f.get() for f in FREE}


# -- report -----------------------------------------------------------------------------------


def _err(log_ratio: float) -> float:
    return (math.exp(log_ratio) - 1) * 100


def _summary(rows: list[tuple[Point, float]]) -> tuple[float, float, str]:
    errs = [(abs(_err(lr)), p.id) for p, lr in rows]
    worst = max(errs)
    return statistics.median(e for e, _ in errs), worst[0], worst[1]


def _cost_per_token(p: Point, step_s: float) -> float:
    """GPU-seconds per token: what ranks plans of one job."""
    return step_s * p.gpus / p.tokens


def ranking(points: list[Point]) -> tuple[int, int, list[str]]:
    """Pairs within one source group: does the model order their cost per token as measured?"""
    agree, total, misses = 0, 0, []
    by_group: dict[str, list[Point]] = {}
    for p in points:
        by_group.setdefault(p.raw["group"], []).append(p)
    for group in by_group.values():
        for a, b in combinations(group, 2):
            ma, mb = (_cost_per_token(p, p.measured_step_s()) for p in (a, b))
            if abs(math.log(ma / mb)) < 0.03:  # a measured tie orders nothing
                continue
            pa, pb = (_cost_per_token(p, p.predicted_step_s()) for p in (a, b))
            total += 1
            if (ma < mb) == (pa < pb):
                agree += 1
            else:
                misses.append(f"{a.id} vs {b.id}")
    return agree, total, misses


def report(points: list[Point]) -> str:
    shipped = [(p, p.log_ratio()) for p in points]
    loo: list[tuple[Point, float]] = []
    for i, p in enumerate(points):
        with preserved():
            fit(points[:i] + points[i + 1 :])
            loo.append((p, p.log_ratio()))
    with preserved():
        fitted = fit(points)
    agree, total, misses = ranking(points)
    implausible = [p for p in points if p.implied_mfu() > PLAUSIBLE_MFU]
    lines = [
        "# Step-time model against published throughputs",
        "",
        "Generated by `PYTHONPATH=src python benchmarks/step_time_calibration.py` from "
        "`benchmarks/data/step_time_published.jsonl` (sources, quoted settings and memfit's "
        "assumptions per point). Error = predicted step time / measured - 1 (+: memfit "
        "predicts slower). LOO: the constants refitted without the point, then the point "
        "predicted.",
        "",
        "| point | technique | GPU | measured | unit | predicted | error % | LOO error % |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for (p, lr), (_, lr_loo) in zip(shipped, loo, strict=True):
        meas = p.raw["value"]
        pred_step = p.predicted_step_s()
        pred = meas * p.measured_step_s() / pred_step
        if p.raw["unit"] in ("s_per_step", "min_per_1k_micro_batches"):
            pred = meas * pred_step / p.measured_step_s()
        gpu = p.raw["gpu"] + (f" x{p.gpus}" if p.gpus > 1 else "")
        lines.append(
            f"| {p.id} | {p.raw['technique']} | {gpu} | {meas:g} | {p.raw['unit']} | "
            f"{pred:.3g} | {_err(lr):+.0f} | {_err(lr_loo):+.0f} |"
        )
    lines += ["", "| class | points | median abs error % | worst % (point) | LOO median abs % |"]
    lines.append("|---|---:|---:|---:|---:|")
    classes: dict[str, list[int]] = {"all": list(range(len(points)))}
    classes["fitted (plausible MFU)"] = [
        i for i, p in enumerate(points) if p.implied_mfu() <= PLAUSIBLE_MFU
    ]
    for i, p in enumerate(points):
        classes.setdefault(p.raw["technique"], []).append(i)
    for name, idx in classes.items():
        med, worst, who = _summary([shipped[i] for i in idx])
        loo_med, _, _ = _summary([loo[i] for i in idx])
        lines.append(f"| {name} | {len(idx)} | {med:.0f} | {worst:.0f} ({who}) | {loo_med:.0f} |")
    lines += [
        "",
        f"Pairwise ranking (same source group, cost per token differing by > 3 %): "
        f"{agree} of {total} pairs ordered as measured.",
    ]
    if misses:
        lines.append("Misordered: " + "; ".join(misses) + ".")
    if implausible:
        lines += [
            "",
            f"Not fitted (implied MFU > {PLAUSIBLE_MFU:.0%} of the dense peak at memfit's FLOP "
            "count, recompute included): "
            + ", ".join(f"{p.id} ({p.implied_mfu():.0%})" for p in implausible)
            + ".",
        ]
    lines += ["", "Constants fitted on all points (cost.py ships them rounded):", ""]
    lines += [f"- {k}: {v:.3g}" for k, v in fitted.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fit", action="store_true", help="print the fitted constants only")
    args = parser.parse_args(argv)
    points = load_points()
    if args.fit:
        with preserved():
            for k, v in fit(points).items():
                print(f"{k}: {v:.4g}")
        return 0
    text = report(points)
    RESULT.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
