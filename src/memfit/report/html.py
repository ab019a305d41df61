"""The HTML report of a monitored run: one self-contained page (inline CSS and SVG, no script, no
network), readable offline and attachable to an issue.

Sections: run header and headline numbers; memory over steps and over time (allocated, reserved,
device used, the estimate's predictions as dashed lines, OOMs as red lines); the receipt (each
predicted number next to its measurement, the estimate's components next to the measured peak);
step time and throughput; OOM events with what was live and the advice; the leak diagnosis; errors.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, is_dataclass
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.monitor.log import RunData, read_log
from memfit.report import svg
from memfit.report.style import COMPONENT_COLORS, PAGE_CSS
from memfit.units import MiB, format_bytes
from memfit.userfiles import JSON_MAX_BYTES, read_json
from memfit.userwrites import write_text
from memfit.version import __version__

#: Receipt metrics: (name in the estimate JSON, label, how the run measures it).
RECEIPT_METRICS = (
    ("peak_allocated_bytes", "peak allocated", "max of step peak_allocated_bytes"),
    ("peak_reserved_bytes", "peak reserved", "max of step peak_reserved_bytes"),
    ("device_used_bytes", "device used", "max device_used_bytes of steps and samples"),
)

#: Leak rule of the built-in reading (used when memfit.monitor.diagnose is absent): after the
#: warm-up, allocated bytes that rise by more than both of these over the run are reported.
LEAK_MIN_GROWTH_BYTES = 16 * MiB
LEAK_MIN_GROWTH_FRACTION = 0.02

#: Draw the device capacity only when it is at most this many times the highest curve.
CAPACITY_SHOWN_WITHIN = 3.0


#: The largest byte count an estimate may hold: a 64-bit counter (an integer past it, or inf, is
#: not an estimate memfit wrote, and overflows float conversion in the charts).
MAX_ESTIMATE_BYTES = 2**63


def _fmt_bytes(v: float | None) -> str:
    return "–" if v is None else format_bytes(int(v))


def _tick_bytes(v: float) -> str:
    return format_bytes(int(v)).replace(".00 ", " ")


def load_estimate(estimate: Any) -> dict[str, Any] | None:
    """``MemoryEstimate.to_json()`` from a path, a dict, or a MemoryEstimate; None stays None."""
    if estimate is None:
        return None
    if hasattr(estimate, "to_json"):
        return dict(estimate.to_json())
    if isinstance(estimate, dict):
        return checked_estimate(estimate, "the estimate")
    path = Path(estimate)
    data = read_json(path, what="estimate file", max_bytes=JSON_MAX_BYTES)  # UserFileError: exit 2
    if not isinstance(data, dict) or "peak_allocated_bytes" not in data:
        raise SpecError(
            f"estimate file {str(path)!r} is not `memfit estimate --json` output "
            "(no peak_allocated_bytes)"
        )
    return checked_estimate(data, f"estimate file {str(path)!r}")


def run_estimate(run: RunData, estimate: Any) -> dict[str, Any] | None:
    """The estimate to compare with: ``estimate`` (see :func:`load_estimate`), else the one the
    run log's start record holds (checked the same way), else None."""
    est = load_estimate(estimate)
    if est is None and run.start is not None and isinstance(run.start.get("estimate"), dict):
        est = checked_estimate(
            run.start["estimate"], f"the run log {str(run.path)!r}'s start record"
        )
    return est


def checked_estimate(est: dict[str, Any], where: str) -> dict[str, Any]:
    """``est`` if each receipt metric in it is None or a byte count (a finite number in
    [0, 2**63)); otherwise a SpecError naming the field and its value (exit 2)."""
    for key, _, _ in RECEIPT_METRICS:
        value = est.get(key)
        if value is None:
            continue
        number = type(value) in (int, float)
        if number and value == value and 0 <= value < MAX_ESTIMATE_BYTES:  # NaN != NaN
            continue
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise SpecError(
            f"{where}: {key} is {shown}, not a byte count (a number from 0 to 2**63); pass "
            "`memfit estimate --json` output as it was written"
        )
    return est


def measured(run: RunData) -> dict[str, int | None]:
    device = [s.get("device_used_bytes") for s in run.steps + run.samples]
    device_values = [v for v in device if v is not None]
    return {
        "peak_allocated_bytes": run.peak("peak_allocated_bytes") or run.peak("allocated_bytes"),
        "peak_reserved_bytes": run.peak("peak_reserved_bytes") or run.peak("reserved_bytes"),
        "device_used_bytes": max(device_values) if device_values else None,
    }


def receipt(run: RunData, est: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The end record's receipt when the monitor wrote one, else predicted vs measured here."""
    if run.end is not None and isinstance(run.end.get("receipt"), dict) and run.end["receipt"]:
        return dict(run.end["receipt"])
    if est is None:
        return {}
    got = measured(run)
    out = {}
    for key, _, _ in RECEIPT_METRICS:
        pred, meas = est.get(key), got[key]
        err = None if pred is None or not meas else round(100.0 * (pred - meas) / meas, 1)
        out[key] = {"predicted_bytes": pred, "measured_bytes": meas, "error_pct": err}
    return out


# -- leak diagnosis -----------------------------------------------------------------------------


def diagnosis(run: RunData) -> tuple[str, dict[str, Any]]:
    """(source, findings): ``memfit.monitor.diagnose`` when installed, else a simple reading."""
    try:
        from memfit.monitor.diagnose import diagnose  # written alongside; optional here
    except ImportError:
        return "report", simple_leak_reading(run)
    result: Any = diagnose(run)
    if hasattr(result, "to_json"):
        result = result.to_json()
    elif is_dataclass(result) and not isinstance(result, type):
        result = asdict(result)
    return "monitor", result if isinstance(result, dict) else {"result": result}


def simple_leak_reading(run: RunData) -> dict[str, Any]:
    """Least-squares slope of allocated bytes over steps after a warm-up (first 10%, at least 2)."""
    pts = [
        (s["step"], s["allocated_bytes"]) for s in run.steps if s.get("allocated_bytes") is not None
    ]
    warm = max(2, len(pts) // 10)
    pts = pts[warm:]
    if len(pts) < 5:
        return {
            "verdict": "unknown",
            "message": f"too few steps after the warm-up ({len(pts)}) to judge",
        }
    xs, ys = [float(p[0]) for p in pts], [float(p[1]) for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    growth = slope * (xs[-1] - xs[0])
    leak = growth > LEAK_MIN_GROWTH_BYTES and growth > LEAK_MIN_GROWTH_FRACTION * my
    return {
        "verdict": "leak" if leak else "steady",
        "bytes_per_step": round(slope),
        "growth_bytes": round(growth),
        "steps_used": len(pts),
        "message": (
            f"allocated memory grows by {format_bytes(int(slope))} per step "
            f"({format_bytes(int(growth))} over {len(pts)} steps after the warm-up): something "
            "keeps tensors across steps (a loss summed without .item(), a list of outputs, a "
            "cache that is never cleared)"
            if leak
            else f"allocated memory is steady after the warm-up ({format_bytes(int(growth))} "
            f"change over {len(pts)} steps)"
        ),
    }


# -- page sections ------------------------------------------------------------------------------


def _card(label: str, value: str) -> str:
    return f'<div class="card"><b>{escape(value)}</b><span>{escape(label)}</span></div>'


def _header(run: RunData, est: dict[str, Any] | None) -> str:
    s = run.start or {}
    when = datetime.fromtimestamp(run.t0, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    last = max([r["time"] for r in run.steps + run.samples + run.ooms] + [run.t0])
    if run.end is not None:
        last = max(last, run.end["time"])
    device = f"{s.get('device', '?')} {s.get('device_name') or ''}".strip()
    total = s.get("device_total_bytes")
    argv = " ".join(map(str, s.get("argv") or []))
    status = (
        "finished" if run.end is not None else "no end record: the process was killed or crashed"
    )
    if run.truncated_last_line:
        status += "; the last line was cut short (dropped)"
    if run.n_skipped_lines:
        status += f"; {run.n_skipped_lines} unusable lines skipped ({run.skipped_reason})"
    if run.note:
        status += f"; {run.note}"
    model = f" · model {est['model']['name']}" if est and isinstance(est.get("model"), dict) else ""
    got = measured(run)
    step_times = [float(x["step_time_s"]) for x in run.steps if x.get("step_time_s")]
    tps = [float(x["tokens_per_s"]) for x in run.steps if x.get("tokens_per_s")]
    cards = [
        _card("peak allocated", _fmt_bytes(got["peak_allocated_bytes"])),
        _card(
            "peak reserved",
            _fmt_bytes(
                got["peak_reserved_bytes"] if was_measured(run, "peak_reserved_bytes") else None
            ),
        ),
        _card("device used (max)", _fmt_bytes(got["device_used_bytes"])),
        _card("steps", str(run.n_steps or len(run.steps))),
        _card("median step time", f"{statistics.median(step_times):.3f} s" if step_times else "–"),
        _card("median tokens/s", f"{statistics.median(tps):,.0f}" if tps else "–"),
        _card("OOM events", str(len(run.ooms))),
    ]
    return (
        f"<h1>memfit run report</h1>"
        f'<div class="meta">{escape(device)}'
        f"{' · ' + escape(format_bytes(total)) if total else ''}{escape(model)} · started {when} · "
        f"{last - run.t0:.1f} s · pid {escape(str(s.get('pid', '?')))} · {escape(status)}</div>"
        f'<div class="meta"><code>{escape(argv) or "(no argv)"}</code></div>'
        f'<div class="cards">{"".join(cards)}</div>'
    )


def shown_capacity(run: RunData, est: dict[str, Any] | None) -> int | None:
    """The device's total memory when drawing it keeps the curves readable: within
    :data:`CAPACITY_SHOWN_WITHIN` times the highest measured or estimated value (a CPU run's
    "device" is the whole host RAM, which would flatten every curve to the axis)."""
    total = (run.start or {}).get("device_total_bytes")
    keys = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
    values = [float(r[k]) for r in run.steps for k in keys if r.get(k) is not None]
    values += [float(est[k]) for k, _, _ in RECEIPT_METRICS if est and est.get(k) is not None]
    if not total or not values or total > CAPACITY_SHOWN_WITHIN * max(values):
        return None
    return int(total)


def was_measured(run: RunData, key: str) -> bool:
    """Whether the run measured ``key``: its receipt says so where it has one (a CPU run's
    reserved bytes only mirror allocated), else whether the log holds the value."""
    entry = ((run.end or {}).get("receipt") or {}).get(key.removesuffix("_bytes"))
    if entry is not None:
        return entry.get("measured_bytes") is not None
    return measured(run).get(key) is not None


def _memory_charts(run: RunData, est: dict[str, Any] | None) -> str:
    c = svg.COLORS
    total = shown_capacity(run, est)
    hlines: list[tuple[float, str, str]] = []
    if total:
        hlines.append((float(total), f"device capacity {format_bytes(total)}", "#444"))
    if est:
        colors = {"peak_allocated_bytes": c["allocated"], "peak_reserved_bytes": c["reserved"]}
        for key, label, _ in RECEIPT_METRICS:
            # an estimate line only for what this run measured (a CPU run has no device reading
            # and no caching allocator)
            if est.get(key) is not None and was_measured(run, key):
                hlines.append((float(est[key]), f"estimate: {label}", colors.get(key, c["device"])))

    def series(recs: list[dict[str, Any]], xkey: str, t0: float = 0.0) -> list[svg.Series]:
        def pts(key: str) -> list[tuple[float, float]]:
            return [
                ((r[xkey] - t0) if xkey == "time" else r[xkey], float(r[key]))
                for r in recs
                if r.get(key) is not None
            ]

        out = [
            svg.Series("peak allocated", c["allocated"], pts("peak_allocated_bytes")),
            svg.Series("allocated", c["allocated"], pts("allocated_bytes"), dash=True, width=1.5),
            svg.Series("device used", c["device"], pts("device_used_bytes")),
        ]
        if was_measured(run, "peak_reserved_bytes"):
            out.insert(2, svg.Series("peak reserved", c["reserved"], pts("peak_reserved_bytes")))
        return out

    by_step = svg.Chart(
        "Memory per step", "step", _tick_bytes, series(run.steps, "step"), list(hlines)
    )
    by_step.vlines = [
        (float(o["step"]), "OOM", c["oom"]) for o in run.ooms if o.get("step") is not None
    ]
    t0 = run.t0
    by_time = svg.Chart(
        "Memory over time",
        "seconds since start",
        _tick_bytes,
        series(run.steps, "time", t0),
        list(hlines),
    )
    sampled = [
        (r["time"] - t0, float(r["device_used_bytes"]))
        for r in run.samples
        if r.get("device_used_bytes") is not None
    ]
    if sampled:
        by_time.series.append(svg.Series("device used (sampler)", c["sample"], sampled, width=1.5))
    by_time.vlines = [(o["time"] - t0, "OOM", c["oom"]) for o in run.ooms]
    ys = [y for ch in (by_step, by_time) for s in ch.series for _, y in s.points] + [
        y for y, _, _ in hlines
    ]
    ticks = svg.byte_ticks(max(ys) * 1.05) if ys else None
    return svg.render(by_step, y_ticks=ticks) + svg.render(by_time, y_ticks=ticks)


def _speed_charts(run: RunData) -> str:
    c = svg.COLORS
    times = [
        (float(s["step"]), float(s["step_time_s"]))
        for s in run.steps
        if s.get("step_time_s") is not None
    ]
    out = svg.render(
        svg.Chart(
            "Step time",
            "step",
            lambda v: f"{v:.3g} s",
            [svg.Series("step time", c["step_time"], times)],
        )
    )
    for key, unit in (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s")):
        pts = [(float(s["step"]), float(s[key])) for s in run.steps if s.get(key) is not None]
        if pts:
            chart = svg.Chart(
                f"Throughput ({unit})",
                "step",
                lambda v: f"{v:,.0f}",
                [svg.Series(unit, c["throughput"], pts)],
            )
            out += svg.render(chart)
            break
    else:
        out += '<p class="meta">No throughput: the steps logged neither tokens nor samples.</p>'
    return out


def _receipt_section(run: RunData, est: dict[str, Any] | None) -> str:
    rec = receipt(run, est)
    if not rec and est is None:
        return (
            '<p class="meta">No estimate: pass <code>--estimate est.json</code> (from '
            "<code>memfit estimate … --json</code>) or start the monitor with one.</p>"
        )
    rows = []
    labels = {k: (lab, how) for k, lab, how in RECEIPT_METRICS}
    for key, r in rec.items():
        label, how = labels.get(key, (key, ""))
        err = r.get("error_pct")
        cls = "" if err is None else ("good" if abs(err) <= 10 else "bad")
        err_s = "–" if err is None else f"{err:+.1f}%"
        rows.append(
            f"<tr><td>{escape(label)}</td>"
            f"<td class='num'>{_fmt_bytes(r.get('predicted_bytes'))}</td>"
            f"<td class='num'>{_fmt_bytes(r.get('measured_bytes'))}</td>"
            f"<td class='num {cls}'>{err_s}</td><td class='meta'>{escape(how)}</td></tr>"
        )
    table = (
        "<table><tr><th>metric</th><th class='num'>predicted</th><th class='num'>measured</th>"
        f"<th class='num'>error</th><th>measured as</th></tr>{''.join(rows)}</table>"
    )
    if est is None or not isinstance(est.get("components"), dict):
        return table
    got = measured(run)
    comps = [(k, int(est["components"].get(k, 0)), color) for k, color in COMPONENT_COLORS.items()]
    bars = [(f"estimate ({est.get('peak_phase', 'peak')})", comps)]
    if got["peak_allocated_bytes"] is not None:
        bars.append(
            ("measured", [("allocated", got["peak_allocated_bytes"], svg.COLORS["allocated"])])
        )
    comp_rows = "".join(
        f"<tr><td><span style='color:{color}'>■</span> {escape(name)}</td>"
        f"<td class='num'>{_fmt_bytes(v)}</td></tr>"
        for name, v, color in comps
    )
    return (
        table
        + "<h3>Estimated components at the peak vs the measured peak allocated</h3>"
        + svg.stacked_bar(bars, _tick_bytes)
        + f"<table><tr><th>component</th><th class='num'>estimate</th></tr>{comp_rows}</table>"
    )


def _oom_section(run: RunData) -> str:
    if not run.ooms:
        return '<div class="box ok">No out-of-memory event.</div>'
    parts = []
    for o in run.ooms:
        live = o.get("live_bytes") or {}
        live_rows = "".join(
            f"<tr><td>{escape(str(k))}</td><td class='num'>{_fmt_bytes(v)}</td></tr>"
            for k, v in sorted(live.items(), key=lambda kv: -(kv[1] or 0))
        )
        advice = "".join(f"<li>{escape(str(a))}</li>" for a in o.get("advice") or [])
        parts.append(
            f'<div class="box warn"><b>OOM at step {escape(str(o.get("step")))}</b> '
            f"(+{o['time'] - run.t0:.1f} s), asked {_fmt_bytes(o.get('requested_bytes'))}"
            f"<br><code>{escape(str(o.get('message', '')))[:600]}</code>"
            + (
                f"<table><tr><th>live</th><th class='num'>bytes</th></tr>{live_rows}</table>"
                if live_rows
                else ""
            )
            + (f"<b>advice</b><ul>{advice}</ul>" if advice else "")
            + "</div>"
        )
    return "".join(parts)


def _value(key: str, v: Any) -> str:
    """A diagnosis value as text: byte counts in binary units, trends as one line."""
    if isinstance(v, dict):
        return ", ".join(f"{k} {_value(k, x)}" for k, x in v.items())
    if isinstance(v, list):
        return "; ".join(_value(key, x) for x in v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and "bytes" in key:
        return format_bytes(int(v)) + ("/step" if "per_step" in key else "")
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _leak_section(run: RunData) -> str:
    source, found = diagnosis(run)
    verdict = str(found.get("verdict", ""))
    message = found.get("summary") or found.get("message") or ""
    cls = "warn" if verdict in ("leak", "fragmentation") else "ok"
    raw = found.get("findings")
    findings: list[Any] = raw if isinstance(raw, list) else []
    details = "".join(
        f"<tr><td>{escape(str(k))}</td><td>{escape(_value(str(k), v))[:400]}</td></tr>"
        for k, v in found.items()
        if k not in ("message", "summary", "findings", "verdict") and v is not None
    )
    message = str(message)
    if verdict and message.startswith(f"{verdict}:"):
        message = message[len(verdict) + 1 :].strip()  # the verdict is shown in bold already
    items = "".join(
        f"<li>{escape(str(f))}</li>"
        for f in findings
        if str(f).split(":", 1)[-1].strip() != message
    )
    who = (
        "memfit.diagnose (memfit.monitor.diagnose)"
        if source == "monitor"
        else "the report's own reading (least-squares slope of allocated bytes after the warm-up; "
        "memfit.monitor.diagnose is not installed)"
    )
    return (
        f'<div class="box {cls}"><b>{escape(verdict or "diagnosis")}</b>: {escape(str(message))}'
        + (f"<ul>{items}</ul>" if items else "")
        + f"</div><table>{details}</table><p class='meta'>by {escape(who)}</p>"
    )


def _errors_section(run: RunData) -> str:
    if not run.errors:
        return ""
    rows = "".join(
        f"<tr><td class='num'>+{e['time'] - run.t0:.1f} s</td>"
        f"<td>{escape(str(e.get('where', '')))}</td>"
        f"<td><code>{escape(str(e.get('message', '')))[:400]}</code></td></tr>"
        for e in run.errors
    )
    return (
        f"<h2>Errors</h2><table><tr><th>when</th><th>where</th><th>message</th></tr>{rows}</table>"
    )


def render_html(run: RunData, est: dict[str, Any] | None) -> str:
    body = "".join(
        [
            _header(run, est),
            "<h2>Memory</h2>",
            _memory_charts(run, est),
            "<h2>Estimate vs measurement</h2>",
            _receipt_section(run, est),
            "<h2>Speed</h2>",
            _speed_charts(run),
            "<h2>Out of memory</h2>",
            _oom_section(run),
            "<h2>Leak check</h2>",
            _leak_section(run),
            _errors_section(run),
            f"<footer>memfit {escape(__version__)} · {escape(run.path.name)} · "
            "a self-contained page: "
            "nothing is loaded from the network</footer>",
        ]
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>memfit report: {escape(run.path.name)}</title><style>{PAGE_CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def render_html_report(
    log_path: str | Path | RunData, out_path: str | Path, estimate: Any = None
) -> Path:
    """Write the HTML report of the run log ``log_path`` to ``out_path`` and return its path.

    ``estimate``: a ``memfit estimate --json`` file, its dict, or a MemoryEstimate; default the
    estimate the monitor stored in the log's start record, if any.
    """
    run = log_path if isinstance(log_path, RunData) else read_log(log_path)
    est = run_estimate(run, estimate)

    out = Path(out_path)
    write_text(out, render_html(run, est), what="report")  # atomic; OSError -> one line
    return out
