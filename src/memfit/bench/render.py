"""A bench as a text table, a Markdown table, and a bar chart (PNG, matplotlib)."""

from __future__ import annotations

from pathlib import Path

from memfit.bench.gate import QualityResult
from memfit.bench.result import BenchResult, BenchRow
from memfit.report.png import pyplot
from memfit.report.svg import COLORS
from memfit.units import format_bytes
from memfit.userwrites import write_files

HEADERS = (
    "row",
    "measured peak",
    "estimate",
    "est. error",
    "saving (meas / est)",
    "fwd+bwd peak (meas / est)",
    "× vs base",
    "step s",
    "tok/s",
    "last loss (Δ)",
    "quality",
)


def _cells(r: BenchRow) -> list[str]:
    if r.error is not None:
        return [r.name, *["—"] * (len(HEADERS) - 2), f"did not run: {r.error}"]
    pe = r.prediction_error
    saving = "—"
    if r.measured_saving_bytes is not None and r.name != "baseline":
        est = (
            format_bytes(r.estimated_saving_bytes) if r.estimated_saving_bytes is not None else "?"
        )
        saving = f"{format_bytes(r.measured_saving_bytes)} / {est}"
    loss = "—"
    if r.losses:
        loss = f"{r.losses[-1]:.3f}"
        if r.loss_delta is not None and r.name != "baseline":
            loss += f" ({r.loss_delta:+.3f})"
    return [
        r.name,
        format_bytes(r.measured_peak_bytes) if r.measured_peak_bytes is not None else "—",
        format_bytes(r.estimated_peak_bytes) if r.estimated_peak_bytes is not None else "failed",
        f"{pe:+.1%}" if pe is not None else "—",
        saving,
        _pair(r.measured_fwd_bwd_peak_bytes, r.estimated_fwd_bwd_peak_bytes),
        f"{r.reduction_factor:.2f}" if r.reduction_factor else "—",
        f"{r.step_time_s:.2f}" if r.step_time_s is not None else "—",
        f"{r.tokens_per_s:.0f}" if r.tokens_per_s is not None else "—",
        loss,
        quality_cell(r.quality),
    ]


def _pair(measured: int | None, estimated: int | None) -> str:
    if measured is None:
        return "—"
    return f"{format_bytes(measured)} / {format_bytes(estimated)}"


def quality_cell(q: QualityResult | None) -> str:
    if q is None:
        return ""
    verdict = "pass" if q.passed else "FAIL"
    return f"{verdict}: KL {q.kl:.2g}, top-1 {q.top1:.1%}, cos {q.cosine:.4f}"


def _header_lines(res: BenchResult) -> list[str]:
    weights = (
        res.pretrained or "random weights (seed 0): no checkpoint of this size ships in a package"
    )
    return [
        f"model: {res.model} ({res.task}; {weights})",
        f"device: {res.device}; {res.steps} steps of batch {res.batch_size} x seq {res.seq_len}",
        f"data: {res.corpus}; tokenizer: {res.tokenizer}",
        f"estimate: {res.estimate_kind}"
        + (
            f" ({format_bytes(res.workspace_bytes_excluded)} of workspaces taken out)"
            if res.workspace_bytes_excluded
            else ""
        ),
    ]


def render_text(res: BenchResult) -> str:
    rows = [list(HEADERS)] + [_cells(r) for r in res.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = _header_lines(res) + [""]
    for n, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"wall time {res.wall_s:.0f} s" + _notes(res))
    return "\n".join(lines)


def render_markdown(res: BenchResult) -> str:
    out = [f"- {line}" for line in _header_lines(res)] + [""]
    out.append("| " + " | ".join(HEADERS) + " |")
    out.append("|" + "---|" * len(HEADERS))
    for r in res.rows:
        out.append("| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |")
    return "\n".join(out) + "\n"


def _notes(res: BenchResult) -> str:
    failed = res.quality_failures
    return f"; quality gate FAILED for: {', '.join(failed)}" if failed else ""


def render_png(res: BenchResult, path: str | Path) -> Path:
    """Grouped bars: measured peak and estimate per row (MiB), reduction factor on top."""

    plt = pyplot()
    rows = [r for r in res.rows if r.measured_peak_bytes is not None]
    mib = 1024**2
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.2), dpi=110)
    measured = [r.measured_peak_bytes / mib for r in rows]  # type: ignore[operator]
    estimated = [(r.estimated_peak_bytes or 0) / mib for r in rows]
    ax.bar([i - 0.2 for i in x], measured, 0.4, label="measured peak", color=COLORS["allocated"])
    ax.bar([i + 0.2 for i in x], estimated, 0.4, label="memfit estimate", color=COLORS["estimate"])
    for i, r in enumerate(rows):
        if r.reduction_factor and r.name != "baseline":
            ax.annotate(f"{r.reduction_factor:.1f}×", (i, measured[i]), ha="center", va="bottom")
    ax.set_xticks(x, [r.name for r in rows], rotation=25, ha="right")
    ax.set_ylabel("peak tensor memory (MiB)")
    ax.set_title(
        f"memfit bench: {res.model} on {res.device}, batch {res.batch_size} x {res.seq_len}"
    )
    ax.legend()
    fig.tight_layout()
    import io

    out = Path(path)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png")  # --png: a PNG whatever the file's suffix
    finally:
        plt.close(fig)
    write_files([(out, buffer.getvalue())], what="--png picture")  # atomic; FIFOs refused
    return out
