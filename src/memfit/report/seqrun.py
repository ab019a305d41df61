"""Text of a variable-length run (``estimate|fit|plan --seq-dist``; the CLI prints these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.units import format_bytes

if TYPE_CHECKING:  # the replay's modules reach the trace engine; report/ stays torch-free
    from memfit.estimate.seqrun.run import SeqRunEstimate
    from memfit.plan.seq_fit import SeqFitResult, SeqPlanResult


def render_seq_run(run: SeqRunEstimate, used_bytes: int, fits: bool | str | None) -> str:
    """The text block of a variable-length run; ``fits``: its verdict (a word of THE verdict
    rule, or whether it fits), None without a GPU."""
    if isinstance(fits, str):
        word = "  " + (fits if fits == "fits" else fits.upper())
    else:
        word = "" if fits is None else ("  fits" if fits else "  DOES NOT FIT")
    lines = [
        "",
        f"variable-length run: {run.n_steps} steps (seed {run.seed}), mean step "
        f"{run.mean_step_len:.0f} tokens, {run.n_distinct_lengths} distinct lengths, "
        f"max {run.max_len}; traced at {', '.join(map(str, run.anchors))}",
        f"  reserved, fixed shape at {run.max_len}: {format_bytes(run.fixed.reserved_bytes)}"
        f"   expandable_segments: {format_bytes(run.fixed.reserved_expandable_bytes)}",
        f"  reserved after the run:       {format_bytes(run.run.reserved_bytes)} "
        f"({run.growth:+.1%})   expandable_segments: "
        f"{format_bytes(run.run.reserved_expandable_bytes)}",
        f"  device used after the run: {format_bytes(used_bytes)}"
        + word
        + (
            f" ({run.run.n_ooms} OOMs in the replay capped at the GPU; without a cap the run "
            f"reserves {format_bytes(run.need_bytes)} with the CUDA context)"
            if run.run.n_ooms
            else ""
        ),
    ]
    for v in run.alternatives:
        lines.append(
            f"  with {v.how}: {format_bytes(v.reserved_bytes)}"
            f" (expandable {format_bytes(v.reserved_expandable_bytes)})"
        )
    if run.recommendations:
        lines.append("recommended (reserved growth over the run matters here):")
        lines += [f"  - {r}" for r in run.recommendations]
    if run.floor_len > 1:
        lines.append(
            f"  note: steps shorter than {run.floor_len} tokens take other kernel paths; "
            f"replayed at {run.floor_len} (larger tensors, the safe direction)"
        )
    return "\n".join(lines)


def render_seq_fit(r: SeqFitResult) -> str:
    """The text of ``fit --seq-dist``."""
    b, run = r.budget, r.run
    lines = [
        f"largest batch size whose reserved memory after the run fits {b.gpu_name}: "
        f"{r.max_batch}  (the reserved bytes of a run of sampled lengths, replayed without a "
        "cap: no allocator cache flushes)",
        f"  (the fixed-shape estimate at the longest length allows {r.fixed.max_value}; "
        f"{r.n_replays} runs replayed)",
        f"  limit {format_bytes(b.limit_bytes)} = {format_bytes(b.capacity_bytes)} - "
        f"{format_bytes(b.headroom_bytes)} headroom, of which the CUDA context takes "
        f"{format_bytes(r.overhead_bytes)}",
    ]
    if run is not None:
        lines.append(render_seq_run(run, r.overhead_bytes + run.run.reserved_bytes, r.fits))
    return "\n".join(lines)


def render_seq_plan(r: SeqPlanResult) -> str:
    """The text of the recommended plan's variable-length run."""
    if r.run is None:
        return "\nvariable-length run: not replayed (no plan fits at the longest length)"
    limit = format_bytes(r.plan.budget.limit_bytes)
    if r.fits_after_run:
        verdict = f"the recommended plan fits after the run (limit {limit})"
    elif r.fits_expandable:
        verdict = (
            f"the recommended plan fits after the run only with "
            f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (limit {limit})"
        )
    else:
        verdict = (
            f"the recommended plan DOES NOT FIT after the run (limit {limit}): reserved grows "
            "past the card even with expandable segments; see the alternatives below"
        )
    used = r.overhead_bytes + r.run.run.reserved_bytes
    return render_seq_run(r.run, used, r.fits_after_run) + "\n" + verdict
