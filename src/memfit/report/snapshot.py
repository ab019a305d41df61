"""Text rendering of a snapshot analysis (``memfit snapshot``); nothing here prints."""

from __future__ import annotations

from typing import Any

from memfit.snapshot.analyze import DeviceTrace, PlaceBytes, SnapshotAnalysis
from memfit.units import format_bytes

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[int], width: int = 60) -> str:
    """``values`` squeezed to ``width`` characters (each the maximum of its slice)."""
    if not values:
        return ""
    n = len(values)
    cols = [
        max(values[i * n // width : max((i + 1) * n // width, i * n // width + 1)])
        for i in range(min(width, n))
    ]
    lo, hi = min(cols), max(cols)
    span = hi - lo or 1
    return "".join(_BARS[min(7, (v - lo) * 8 // span)] for v in cols)


def _places(title: str, rows: list[PlaceBytes], total: int) -> list[str]:
    if not rows:
        return []
    out = [title]
    for r in rows:
        share = f"{100 * r.n_bytes / total:5.1f}%" if total else ""
        out.append(f"  {format_bytes(r.n_bytes):>11} {share}  ×{r.n_allocations:<5} {r.place}")
    return out


def _seconds(t_us: int | None, start_us: int | None) -> str:
    if t_us is None or start_us is None:
        return ""
    return f" at +{(t_us - start_us) / 1e6:.3f} s"


def _device(d: DeviceTrace, top: int) -> list[str]:
    lines = [
        "",
        f"trace, device {d.device}: {d.n_events} events ("
        + ", ".join(f"{k} {v}" for k, v in sorted(d.actions.items()))
        + ")",
    ]
    if d.timeline:
        spark = sparkline([p.allocated_bytes for p in d.timeline])
        lines.append(f"  allocated over the trace  {spark}")
    where = f"event {d.peak_event_index}" if d.peak_event_index is not None else "trace start"
    lines.append(
        f"  peak allocated {format_bytes(d.peak_allocated_bytes)} at {where}"
        f"{_seconds(d.peak_time_us, d.first_time_us)}; peak reserved "
        f"{format_bytes(d.peak_reserved_bytes)}"
    )
    if d.before_trace_bytes:
        lines.append(
            f"  {format_bytes(d.before_trace_bytes)} of it allocated before the trace window "
            "(stack unknown)"
        )
    lines += _places(
        "  live at the peak, by place in the code:", d.at_peak[:top], d.peak_allocated_bytes
    )
    if d.lead_up:
        lines.append(
            "  lead-up: the last allocations before the peak, still live at it (newest first)"
        )
        for a in d.lead_up[:top]:
            when = _seconds(a.time_us, d.first_time_us)
            lines.append(
                f"    {format_bytes(a.size_bytes):>11}  event {a.event_index}{when}  {a.location}"
            )
    for o in d.ooms:
        free = o.get("device_free_bytes")
        lines.append(
            f"  OOM at event {o['event_index']}: asked {format_bytes(o['requested_bytes'])}, "
            f"device free {format_bytes(free) if free is not None else 'unknown'}, "
            f"at {o['location']}"
        )
    return lines


def render_snapshot(a: SnapshotAnalysis, *, top: int = 10) -> str:
    f = a.fragmentation
    lines = [
        f"memfit snapshot: {a.path} ({format_bytes(a.file_bytes)}, read {a.reader})",
        f"at the snapshot: allocated {format_bytes(a.allocated_bytes)} in {a.n_live_allocations} "
        f"blocks (requested {format_bytes(a.requested_bytes)}), reserved "
        f"{format_bytes(a.reserved_bytes)} in {f.n_segments} segments",
        f"fragmentation: {format_bytes(f.inactive_split_bytes)} free inside partly used segments "
        f"({f.fragmentation_pct:.1f}% of reserved, {f.n_inactive_split_blocks} blocks; "
        f"empty_cache() cannot return it), {format_bytes(f.releasable_bytes)} in "
        f"{f.n_free_segments} empty segments (empty_cache() returns it)",
    ]
    if f.pending_free_bytes:
        lines.append(f"  {format_bytes(f.pending_free_bytes)} freed but awaiting other streams")
    if f.worst_segments:
        lines.append("  most free space inside used segments:")
        for s in f.worst_segments[: min(top, 5)]:
            lines.append(
                f"    {s.segment_type:<5} segment {s.address:#x}: {format_bytes(s.total_bytes)}, "
                f"{format_bytes(s.allocated_bytes)} used, {format_bytes(s.inactive_bytes)} free in "
                f"{s.n_inactive_blocks} blocks (largest {format_bytes(s.largest_inactive_bytes)})"
            )
    lines += _places(
        "live allocations by place in the code:", a.by_location[:top], a.allocated_bytes
    )
    lines += _places("by module:", a.by_module[:top], a.allocated_bytes)
    if a.largest:
        lines.append("largest live allocations:")
        for al in a.largest[:top]:
            stack = " ← ".join(al.frames[:3]) or al.location
            lines.append(f"  {format_bytes(al.size_bytes):>11}  {al.address:#x}  {stack}")
    for d in a.devices:
        lines += _device(d, top)
    lines += [f"note: {n}" for n in a.notes]
    return "\n".join(lines)


def render_comparison(c: Any, *, top: int = 10) -> str:
    """``memfit snapshot MEASURED --predicted PRED``: the metrics side by side, then where the
    bytes were at each trace's peak, by module."""
    lines = [
        f"memfit snapshot: predicted {c.predicted.path} vs measured {c.measured.path}",
        f"  {'':<34}{'predicted':>14}{'measured':>14}{'error':>9}",
    ]
    for m in c.metrics:
        is_bytes = m.name.endswith("bytes") or "bytes " in m.name
        show = format_bytes if is_bytes else (lambda v: "n/a" if v is None else str(v))
        err = "n/a" if m.error is None else f"{m.error:+.1%}"
        lines.append(f"  {m.name:<34}{show(m.predicted):>14}{show(m.measured):>14}{err:>9}")
    for label, a in (("predicted", c.predicted), ("measured", c.measured)):
        if a.devices and a.devices[0].at_peak_by_module:
            lines.append(f"{label}: at the trace's peak, by module")
            lines += [
                f"  {format_bytes(p.n_bytes):>12}  {p.place}"
                for p in a.devices[0].at_peak_by_module[:top]
            ]
    return "\n".join(lines)
