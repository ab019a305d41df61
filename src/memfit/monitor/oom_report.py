"""The OOM report: one self-contained HTML file (inline CSS, no scripts, no network)."""

from __future__ import annotations

import html
import time
from typing import Any

from memfit.units import format_bytes
from memfit.version import __version__

_CSS = """
body{font:15px/1.45 system-ui,sans-serif;max-width:860px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.4em;margin-bottom:.2em}.sub{color:#666;margin-top:0}
.verdict{background:#fff3f0;border-left:5px solid #d9381e;padding:.6em 1em;margin:1em 0}
table{border-collapse:collapse;width:100%;margin:.6em 0}
td,th{padding:.3em .5em;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bar{background:#4a7bd0;height:.8em;display:inline-block;vertical-align:middle}
tr.hit td{font-weight:600}tr.hit .bar{background:#d9381e}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.6em;font-size:.85em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _component_rows(a: Any) -> list[str]:
    total = max(1, a.reserved_bytes)
    predicted = a.predicted_bytes or {}
    rows = []
    for name, n in a.live_bytes.items():
        width = round(100 * n / total)
        guess = format_bytes(predicted[name]) if name in predicted else ""
        rows.append(
            f'<tr class="{"hit" if name == a.culprit else ""}"><td>{_e(name)}</td>'
            f'<td class="n">{_e(format_bytes(n))}</td><td class="n">{n / total:.0%}</td>'
            f'<td style="width:40%"><span class="bar" style="width:{width}%"></span></td>'
            + (f'<td class="n">{_e(guess)}</td>' if predicted else "")
            + "</tr>"
        )
    return rows


def _context_rows(a: Any) -> list[str]:
    pairs = [
        ("device", a.device),
        ("step", "n/a" if a.step is None else a.step),
        ("failed request", format_bytes(a.requested_bytes)),
        ("allocated (live tensors)", format_bytes(a.allocated_bytes)),
        ("reserved (allocator segments)", format_bytes(a.reserved_bytes)),
        ("device capacity", format_bytes(a.total_bytes)),
        ("measured from", a.source),
    ]
    return [f'<tr><td>{_e(k)}</td><td class="n">{_e(v)}</td></tr>' for k, v in pairs]


def render_oom_html(a: Any) -> str:
    """HTML for an :class:`~memfit.monitor.oom.OOMAnalysis`."""
    head = "<th>component</th><th>live</th><th>share</th><th></th>" + (
        "<th>estimate</th>" if a.predicted_bytes else ""
    )
    advice = "".join(f"<li>{_e(line)}</li>" for line in a.advice)
    blocks = ""
    if a.largest_blocks:
        items = "".join(
            f'<tr><td class="n">{_e(format_bytes(b["bytes"]))}</td>'
            f"<td>{_e(b['where'] or '(no stack frame recorded)')}</td></tr>"
            for b in a.largest_blocks
        )
        blocks = f"<h2>Largest unregistered blocks</h2><table>{items}</table>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>memfit: out of memory on {_e(a.device)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Out of memory on {_e(a.device)}</h1>"
        f"<p class='sub'>memfit {_e(__version__)}, {_e(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>"
        f"<div class='verdict'><b>{_e(a.culprit)} overflowed.</b> {_e(a.reason)}.</div>"
        f"<h2>How to fix it</h2><ol>{advice}</ol>"
        f"<h2>What was live</h2><table><tr>{head}</tr>{''.join(_component_rows(a))}</table>"
        f"<table>{''.join(_context_rows(a))}</table>{blocks}"
        f"<h2>The error</h2><pre>{_e(a.message)}</pre></body></html>\n"
    )
