"""A static PNG of a run (``memfit report --png``): memory per step and over time, step time and
throughput, drawn with matplotlib (the ``report`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.errors import MissingDependencyError
from memfit.monitor.log import RunData, read_log
from memfit.report.html import RECEIPT_METRICS, run_estimate, shown_capacity, was_measured
from memfit.report.svg import COLORS
from memfit.userwrites import write_files

GiB = 1024**3


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError(
            "--png needs matplotlib: pip install 'memfit[report]' (the HTML report needs nothing)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _memory(ax: Any, run: RunData, xkey: str, est: dict[str, Any] | None) -> None:
    t0 = run.t0
    lines = [
        ("peak_allocated_bytes", "peak allocated", COLORS["allocated"], "-"),
        ("allocated_bytes", "allocated", COLORS["allocated"], "--"),
        ("peak_reserved_bytes", "peak reserved", COLORS["reserved"], "-"),
        ("device_used_bytes", "device used", COLORS["device"], "-"),
    ]
    for key, name, color, style in lines:
        if key == "peak_reserved_bytes" and not was_measured(run, key):
            continue
        pts = [
            ((s[xkey] - t0) if xkey == "time" else s[xkey], s[key] / GiB)
            for s in run.steps
            if s.get(key) is not None
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), label=name, color=color, linestyle=style, lw=1.8)
    total = shown_capacity(run, est)
    if total:
        ax.axhline(total / GiB, color="#444", linestyle="--", linewidth=1, label="capacity")
    if est and est.get("peak_allocated_bytes") is not None:
        ax.axhline(
            est["peak_allocated_bytes"] / GiB,
            color=COLORS["allocated"],
            linestyle=":",
            linewidth=1.2,
            label="estimate: " + RECEIPT_METRICS[0][1],
        )
    for o in run.ooms:
        x = (o["time"] - t0) if xkey == "time" else o.get("step")
        if x is not None:
            ax.axvline(x, color=COLORS["oom"], linewidth=1.5)
    ax.set_ylabel("GiB")
    ax.set_xlabel("step" if xkey == "step" else "seconds since start")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def render_png(log_path: str | Path | RunData, out_path: str | Path, estimate: Any = None) -> Path:
    """Write a 2×2 PNG summary of the run log to ``out_path``."""
    plt = pyplot()
    run = log_path if isinstance(log_path, RunData) else read_log(log_path)
    est = run_estimate(run, estimate)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    _memory(axes[0][0], run, "step", est)
    axes[0][0].set_title("Memory per step")
    _memory(axes[0][1], run, "time", est)
    axes[0][1].set_title("Memory over time")
    steps = [(s["step"], s["step_time_s"]) for s in run.steps if s.get("step_time_s") is not None]
    if steps:
        axes[1][0].plot(*zip(*steps, strict=True), color=COLORS["step_time"])
    axes[1][0].set_title("Step time (s)")
    axes[1][0].set_xlabel("step")
    axes[1][0].grid(alpha=0.3)
    for key, unit in (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s")):
        pts = [(s["step"], s[key]) for s in run.steps if s.get(key) is not None]
        if pts:
            axes[1][1].plot(*zip(*pts, strict=True), color=COLORS["throughput"])
            axes[1][1].set_title(f"Throughput ({unit})")
            break
    else:
        axes[1][1].set_title("Throughput: not logged")
    axes[1][1].set_xlabel("step")
    axes[1][1].grid(alpha=0.3)
    name = (run.start or {}).get("device_name") or ""
    fig.suptitle(f"memfit run report: {run.path.name} {name}".strip())
    fig.tight_layout()
    import io

    out = Path(out_path)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=100, format="png")  # --png: a PNG whatever the file's suffix
    finally:
        plt.close(fig)
    write_files([(out, buffer.getvalue())], what="picture")  # atomic; OSError -> one line
    return out
