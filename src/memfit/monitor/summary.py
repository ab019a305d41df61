"""What a run used, in one record (the ``end`` record's ``summary``), and the receipt: the
estimate's predicted peaks next to the measured ones.

``error_pct`` is ``(predicted - measured) / measured × 100``: positive means memfit over-predicted,
the sign convention of docs/accuracy.md.
"""

from __future__ import annotations

from typing import Any

from memfit.estimate.verdict import judge
from memfit.units import format_bytes

#: Receipt metric → (the estimate's JSON key, the summary's measured key(s), first known wins).
#: ``device_used``: the estimate predicts this process's own use (``nvidia-smi``'s per-process
#: column); the device-level total stands in only when NVML cannot attribute memory to processes.
RECEIPT_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "peak_allocated": ("peak_allocated_bytes", ("peak_allocated_bytes",)),
    "peak_reserved": ("peak_reserved_bytes", ("peak_reserved_bytes",)),
    "device_used": ("device_used_bytes", ("peak_process_used_bytes", "peak_device_used_bytes")),
}


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


class RunStats:
    """Running peaks and step-time sums (constant memory, however long the run)."""

    def __init__(self) -> None:
        self.n_steps = 0
        self.first_step_time_s: float | None = None
        self._time_s = 0.0  # steps after the first (the first includes warm-up: compilation, CUDA
        self._n_timed = 0  # context, cuBLAS handles, lazily created optimizer states)
        self._tokens = 0
        self._samples = 0
        self._has_tokens = self._has_samples = False
        self.peaks: dict[str, int | None] = dict.fromkeys(
            (
                "peak_allocated_bytes",
                "peak_reserved_bytes",
                "peak_device_used_bytes",
                "peak_process_used_bytes",
                "peak_rss_bytes",
            )
        )

    def peak(self, key: str, value: int | None) -> None:
        self.peaks[key] = _max(self.peaks[key], value)

    def add_step(self, rec: dict[str, Any]) -> None:
        self.n_steps += 1
        self.peak("peak_allocated_bytes", rec["peak_allocated_bytes"])
        self.peak("peak_reserved_bytes", rec["peak_reserved_bytes"])
        self.peak("peak_device_used_bytes", rec["device_used_bytes"])
        self.peak("peak_rss_bytes", rec["rss_bytes"])
        if self.n_steps == 1:
            self.first_step_time_s = rec["step_time_s"]
            return
        self._time_s += rec["step_time_s"]
        self._n_timed += 1
        if rec["tokens"] is not None:
            self._tokens += rec["tokens"]
            self._has_tokens = True
        if rec["samples"] is not None:
            self._samples += rec["samples"]
            self._has_samples = True

    def add_sample(self, rec: dict[str, Any]) -> None:
        self.peak("peak_device_used_bytes", rec["device_used_bytes"])
        self.peak("peak_process_used_bytes", rec["process_used_bytes"])

    def summary(self, *, outcome: str, duration_s: float, n_errors: int) -> dict[str, Any]:
        timed = self._time_s if self._n_timed else None

        def rate(total: int, known: bool) -> float | None:
            return round(total / timed, 3) if known and timed else None

        if self.peaks["peak_process_used_bytes"] is not None:
            source = "process"
        elif self.peaks["peak_device_used_bytes"] is not None:
            source = "device"
        else:
            source = None
        return {
            "outcome": outcome,
            "duration_s": round(duration_s, 6),
            "n_steps": self.n_steps,
            **self.peaks,
            "device_used_source": source,
            "first_step_time_s": self.first_step_time_s,
            "mean_step_time_s": None if timed is None else timed / self._n_timed,
            "tokens_per_s": rate(self._tokens, self._has_tokens),
            "samples_per_s": rate(self._samples, self._has_samples),
            "n_errors": n_errors,
        }


def receipt(
    estimate: dict[str, Any], summary: dict[str, Any], *, device: str
) -> dict[str, dict[str, Any]]:
    """Predicted vs measured peak per metric. On a CPU run only ``peak_allocated`` is measured
    (exact tensor bytes, 512 B-rounded): the CPU has no caching allocator and no device memory."""
    on_cuda = device.startswith("cuda")
    out: dict[str, dict[str, Any]] = {}
    for metric, (predicted_key, measured_keys) in RECEIPT_METRICS.items():
        predicted = estimate.get(predicted_key)
        measured = next((summary[k] for k in measured_keys if summary.get(k) is not None), None)
        if not on_cuda and metric != "peak_allocated":
            measured = None
        error = None
        if predicted is not None and measured:
            error = round((predicted - measured) / measured * 100, 2)
        out[metric] = {"predicted_bytes": predicted, "measured_bytes": measured, "error_pct": error}
    verdict = _verdict_row(estimate, out.get("device_used", {}).get("measured_bytes"))
    if verdict is not None:
        out["verdict"] = verdict
    return out


def _verdict_row(estimate: dict[str, Any], measured: int | None) -> dict[str, Any] | None:
    """The estimate's verdict (THE rule, memfit.estimate.verdict) next to the same rule applied
    to the measured device use (point and upper end both the measurement)."""
    fits = estimate.get("fits") or {}
    if "verdict" not in fits:
        return None

    row: dict[str, Any] = {"gpu": fits["gpu"], "predicted": fits["verdict"], "measured": None}
    row["predicted_margin_bytes"] = fits["margin_bytes"]
    if measured:
        v = judge(
            point_bytes=measured,
            need_bytes=measured,
            capacity_bytes=fits["capacity_bytes"],
            headroom_bytes=fits["headroom_bytes"],
        )
        row.update(measured=v.verdict, measured_margin_bytes=v.margin_bytes)
    return row


def render_summary(summary: dict[str, Any], receipt: dict[str, dict[str, Any]] | None) -> str:
    """A few human lines for the end of a run (the Monitor writes them to stderr)."""
    mean = summary["mean_step_time_s"]
    ran = f"{summary['n_steps']} steps in " if summary["n_steps"] else "ran "
    if "exit_code" in summary:
        ran = f"exit code {summary['exit_code']}, {ran}"
    lines = [
        f"memfit monitor: {ran}{summary['duration_s']:.1f} s"
        + (f", {mean * 1e3:.1f} ms/step after the first" if mean is not None else "")
        + (f", {summary['tokens_per_s']:.0f} tokens/s" if summary["tokens_per_s"] else "")
        + (f", {summary['samples_per_s']:.1f} samples/s" if summary["samples_per_s"] else ""),
        "  peak allocated "
        + format_bytes(summary["peak_allocated_bytes"])
        + ", reserved "
        + format_bytes(summary["peak_reserved_bytes"])
        + ", device used "
        + format_bytes(summary["peak_process_used_bytes"] or summary["peak_device_used_bytes"])
        + ", RSS "
        + format_bytes(summary["peak_rss_bytes"]),
    ]
    if receipt:
        lines.append("  receipt: predicted vs measured peak")
        for metric, row in receipt.items():
            if metric == "verdict":
                lines.append(f"    verdict on {row['gpu']}: predicted {row['predicted']}, "
                             f"measured {row['measured'] or 'n/a'}")  # fmt: skip
                continue
            err = row["error_pct"]
            lines.append(
                f"    {metric:<15}{format_bytes(row['predicted_bytes']):>12}"
                f"{format_bytes(row['measured_bytes']):>12}"
                + (f"  {err:+.1f} %" if err is not None else "  (not measured)")
            )
    return "\n".join(lines)
