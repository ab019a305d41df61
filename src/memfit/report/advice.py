"""Text of the GPU advice (``memfit plan --recommend-gpu``, the GPUs ``memfit upgrade`` names):
one row per GPU and count with speed, price and cost per 1 M tokens, in the advice's rank order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.report.plan import need_text, rate_text

if TYPE_CHECKING:
    from memfit.plan.advice import GPUAdvice

#: What each rank puts first, for the header line.
RANK_TEXT = {
    "cost": "cheapest per 1M {kind} tokens first; GPUs without a price follow, fastest first",
    "speed": "fastest first (tokens/s over all GPUs)",
    "memory": "most free memory per GPU first",
}


def money_text(usd: float | None) -> str:
    """``$0.42``, ``$12.3``, ``$0.0031``; ``-`` for no price."""
    if usd is None:
        return "-"
    if usd >= 10:
        return f"${usd:.1f}"
    return f"${usd:.2f}" if usd >= 0.1 else f"${usd:.2g}"


def render_advice(advice: list[GPUAdvice], *, confirm: str | None = None) -> str:
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
    rank = getattr(advice, "rank", "cost")
    kind = advice[0].token_kind
    lines = [
        f"ranked by {rank}: {RANK_TEXT.get(rank, rank).format(kind=kind)}",
        f"{'gpu':<24}{'count':>6}{'tokens/s':>10}{'$/hour':>9}{'$/1M tok':>10}{'memory':>12}"
        "  risk    plan",
    ]
    for a in advice:
        lines.append(
            f"{a.gpu:<24}{a.gpus:>6}{rate_text(a.best.cost.tokens_per_s):>10}"
            f"{money_text(a.usd_per_hour):>9}{money_text(a.usd_per_million_tokens):>10}"
            f"{need_text(a.best):>12}  {a.best.risk:<8}{a.best.settings.describe()}"
        )
    notes.append(
        f"$/1M tok: on-demand $/hour x GPUs / predicted {kind} tokens per hour; prices and "
        "their dates: `memfit gpus`; the speed is a roofline estimate, not a measurement"
    )
    return "\n".join(lines + [f"note: {n}" for n in notes])
