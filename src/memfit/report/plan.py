"""Text of ``memfit plan`` and ``memfit fit``: a plan with its memory table and settings, a solve
(the CLI prints these; nothing here prints). The GPU advice list: :mod:`memfit.report.advice`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from memfit.errors import MemfitError
from memfit.estimate.result import COMPONENTS
from memfit.hardware import get_gpu, load_prices
from memfit.plan.cost import COST_CONSTANTS, Rates, mfu, usd_per_million_tokens
from memfit.plan.export import export_settings
from memfit.units import format_bytes

if TYPE_CHECKING:
    from memfit.estimate.verdict import Verdict
    from memfit.plan.request import PlanOption
    from memfit.plan.search import Plan
    from memfit.plan.solve import FitResult


def _needs(v: Verdict) -> str:
    """``estimate 19.40 GiB, upper end 20.50 GiB``: the device memory a fit answer needs."""
    return f"estimate {format_bytes(v.point_bytes)}, upper end {format_bytes(v.need_bytes)}"


def rate_text(tokens_per_s: float) -> str:
    """Tokens/s in a few characters: ``812``, ``33.8k``, ``1.9M``."""
    if tokens_per_s >= 1e6:
        return f"{tokens_per_s / 1e6:.1f}M"
    return f"{tokens_per_s / 1000:.1f}k" if tokens_per_s >= 1000 else f"{tokens_per_s:.0f}"


def need_text(opt: PlanOption) -> str:
    """A plan option's device memory (upper end), ``n/a`` when it was not estimated."""
    return format_bytes(opt.need_bytes) if opt.need_bytes is not None else "n/a"


def render_plan(p: Plan) -> str:

    r, b = p.request, p.budget
    batch = f"global batch {r.global_batch}" if r.global_batch else f"batch {r.per_rank_batch}"
    lines = [
        as_asked_line(p),
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
    ]
    if p.confirmed is not None:
        lines.append(f"confirmed: {'yes' if p.confirmed else 'no'} ({p.confirmed_why})")
    lines.append("")
    rec = p.recommended or p.closest
    if p.recommended is None:
        lines.append("NOTHING FITS. closest attempt:" if rec else "NOTHING FITS.")
    if rec is not None:
        try:  # the achievable MFU the step-time model assumes on this GPU's generation
            at = mfu(Rates.of(get_gpu(b.gpu_name)))
        except MemfitError:  # a GPU given by memory only
            at = COST_CONSTANTS["mfu"][0]
        if p.recommended is not None:
            same = "the job as asked" if not rec.changes else rec.settings.describe()
            allowed = ", ".join(sorted(r.allow))
            label = (
                f"{p.tier} or allowed ({allowed})"
                if allowed and p.tier == "memory-only"
                else p.tier
            )
            tier = "" if not label or label == "as asked" else f"  [{label}]"
            lines.append(f"recommended: {same}{tier}")
        else:
            lines.append(f"  {rec.settings.describe()}: {rec.reason}")
        lines += changes_lines(rec)
        lines.append(
            f"  predicted {rec.cost.step_s:.3g} s/step, {rate_text(rec.cost.tokens_per_s)} "
            f"tokens/s (roofline at MFU {at:.0%}); quality risk: {rec.risk}"
            + (f" ({len(rec.risk_reasons)} result-changing)" if rec.risk_reasons else "")
        )
        lines.append("")
        base = p.baseline.estimate
        lines.append(f"  {'memory at the peak':<22}{'as asked':>16}{'this plan':>16}")
        for c in COMPONENTS:
            old = format_bytes(base.components.get(c, 0)) if base else "n/a"
            new = format_bytes(rec.estimate.components.get(c, 0)) if rec.estimate else "n/a"
            lines.append(f"  {c:<22}{old:>16}{new:>16}")
        lines.append(f"  {'device (upper end)':<22}{need_text(p.baseline):>16}{need_text(rec):>16}")
        lines.append(f"  as asked: {p.baseline.settings.describe()}")
    if p.recommended is not None:
        lines += ["", "settings:"]
        for key, value in export_settings(p.recommended.settings, r, p.model_name).items():
            text = json.dumps(value, indent=2) if isinstance(value, dict) else value
            lines.append(f"  {key}: " + text.replace("\n", "\n    "))
    lines += compare_lines(p)
    if p.nearest:
        lines += ["", "nearest changes that fit (for the closest attempt):"]
        lines += [f"  {n['change']}: {n['plan']} ({n['kind']})" for n in p.nearest]
    if p.alternatives:
        lines += ["", f"alternatives:  {'s/step':>8} {'tokens/s':>9} {'memory':>11}  risk"]
        for a in p.alternatives:
            kind = "changes the result" if a.changes_result else "memory-only"
            lines.append(
                f"  {a.settings.describe()}\n  {'':<14}{a.cost.step_s:>8.3g} "
                f"{rate_text(a.cost.tokens_per_s):>9} {need_text(a):>11}  {a.risk} ({kind})"
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


def plan_usd_per_million_tokens(opt: PlanOption, gpu_name: str, gpus: int) -> float | None:
    """Dollars per 1 M tokens of ``opt`` at its predicted speed on ``gpus`` on-demand GPUs (the
    bundled price table); None without a price or a speed."""
    return usd_per_million_tokens_on(gpu_name, gpus, opt.cost.tokens_per_s)


def usd_per_million_tokens_on(gpu_name: str, gpus: int, tokens_per_s: float) -> float | None:
    """Dollars per 1 M tokens at ``tokens_per_s`` on ``gpus`` on-demand ``gpu_name`` GPUs (the
    bundled price table); None without a price or a speed."""
    try:
        price = load_prices().of(get_gpu(gpu_name))
    except MemfitError:  # a GPU given by memory only has no price
        return None
    hourly = getattr(price, "usd_per_hour", None)
    return usd_per_million_tokens(None if hourly is None else hourly * gpus, tokens_per_s)


def compare_lines(p: Plan) -> list[str]:
    """The job as asked, the recommendation, the fastest memory-only plan and the fastest plan
    ``--allow`` permits, side by side: step time, $ per 1 M tokens, memory, quality risk."""
    if p.recommended is None or not p.compare:
        return []
    rows = [("as asked", p.baseline), ("recommended", p.recommended), *p.compare]
    out = [
        "",
        "side by side:",
        f"  {'':<30}{'s/step':>9}{'$/1M tok':>10}{'memory':>12}  risk    kind",
    ]
    for label, o in rows:
        usd = plan_usd_per_million_tokens(o, p.budget.gpu_name, p.request.gpus)
        fits = "" if o.fits or label != "as asked" else " (does not fit)"
        kind = "changes the result" if o.changes_result else "memory-only"
        if label == "as asked":
            kind = "the job as asked"
        out.append(
            f"  {label:<30}{o.cost.step_s:>9.3g}{(f'{usd:.2f}' if usd else 'n/a'):>10}"
            f"{need_text(o):>12}  {o.risk:<7} {kind}{fits}"
        )
        out.append(f"    {o.settings.describe()}")
    return out


def as_asked_line(p: Plan) -> str:
    """The first line of a plan: THE verdict rule on the job as asked."""
    v = p.as_asked
    what = f"as asked ({p.baseline.settings.describe()})"
    if v is None:
        return f"{what}: not estimated ({p.baseline.reason})"
    return f"{what}: {v.text(p.budget.gpu_name)}"


def changes_lines(opt: PlanOption) -> list[str]:
    """A plan's changes to the job as asked, each labelled memory-only or changes the result."""
    out = []
    for c in opt.changes:
        why = f": {c.reason}" if c.reason and c.reason != c.what else ""
        out.append(f"    - {c.what} ({c.kind}{why})")
    return out


def render_fit(r: FitResult) -> str:
    """The largest value that fits and the largest that is only tight, each with its needs
    (estimate and upper end); when nothing fits, the tight value says so (never a bare 0)."""
    what = {"batch": "batch size", "seq": "sequence length", "concurrency": "concurrent requests"}
    b = r.budget
    confirmed = r.confirmed_by not in (None, r.search_engine)
    at_fits, at_tight = r.judgement("fits"), r.judgement("tight")
    if r.fits:
        first = f"largest {what[r.solve]} that fits {b.gpu_name}: {r.max_value}"
        if at_fits is not None:
            first += f"  ({_needs(at_fits)})"
    elif at_fits is not None and at_fits.verdict == "tight":
        first = (
            f"no {what[r.solve]} fits {b.gpu_name}: even the smallest is only tight "
            f"({_needs(at_fits)}, over the limit)"
        )
    else:
        first = f"no {what[r.solve]} fits {b.gpu_name}"
        if at_fits is not None:
            first += (
                f": even the smallest needs {format_bytes(at_fits.point_bytes)} (estimate), "
                f"more than its {format_bytes(b.capacity_bytes)}"
            )
    lines = [first]
    if r.only_tight and at_tight is not None:
        lines.append(
            f"largest {what[r.solve]} that is only tight: {r.max_tight_value}  "
            f"({_needs(at_tight)}: the estimate is within {format_bytes(b.capacity_bytes)}, the "
            "upper end plus headroom is not: it may run out of memory)"
        )
    elif r.max_tight_value is not None and r.fits:
        lines.append(f"no larger {what[r.solve]} is even tight")
    lines.append(
        f"  limit {format_bytes(b.limit_bytes)} = {format_bytes(b.capacity_bytes)} - "
        f"{format_bytes(b.headroom_bytes)} headroom; searched with {r.search_engine}"
        f"{f', confirmed by {r.confirmed_by}' if confirmed else ''} "
        f"({r.n_estimates} estimates)"
    )
    est = r.estimate
    if est is not None:
        lines.append(
            f"  at {'that' if r.fits else 'the smallest'} value: peak allocated "
            f"{format_bytes(est.peak_allocated_bytes)}; range: {est.band.describe()}"
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
