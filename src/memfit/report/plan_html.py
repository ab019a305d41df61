"""HTML of a plan and of a fit: the page ``memfit plan ... --html FILE`` writes, and the notebook
fragments of ``Plan._repr_html_`` and ``FitResult._repr_html_``.

Drawn from the JSON the CLI prints (``Plan.to_json()``, ``FitResult.to_json()``), self-contained
like :mod:`memfit.report.estimate_html`. The plan page leads with the job as asked (the naive
baseline: no memory technique, the request's shape) and its verdict, then the recommended plan,
its memory next to the baseline's, the alternatives, the settings to use, and the notes.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from memfit.report import svg
from memfit.report.estimate_html import (
    FRAGMENT_CSS,
    estimate_fragment,
    page_tail,
    standalone_page,
)
from memfit.report.style import COMPONENT_COLORS
from memfit.units import format_bytes
from memfit.userwrites import write_text


def _option_line(opt: dict[str, Any] | None) -> str:
    if not opt:
        return "n/a"
    rate = opt.get("tokens_per_s")
    speed = f", {rate:,.0f} tokens/s predicted" if rate else ""
    need = opt.get("need_bytes")
    return f"{escape(opt['summary'])}: needs {format_bytes(need)} (upper end){speed}"


def _bar_row(label: str, opt: dict[str, Any] | None) -> tuple[str, list[tuple[str, int, str]]]:
    comps = (opt or {}).get("components") or {}
    return label, [(c, comps.get(c, 0), color) for c, color in COMPONENT_COLORS.items()]


def _as_asked(p: dict[str, Any]) -> str:
    """The job as asked first: the naive baseline's verdict against the plan's limit."""
    base, budget = p.get("baseline"), p["budget"]
    if not base:
        return '<div class="box">the naive baseline was not estimated</div>'
    ok = bool(base.get("fits"))
    cls, word = ("ok", "fits") if ok else ("warn", "does not fit")
    return (
        f'<div class="box {cls}"><b class="{"good" if ok else "bad"}">as asked, {word}</b> on '
        f"{escape(str(budget['gpu']))} (limit {format_bytes(budget['limit_bytes'])} = "
        f"{format_bytes(budget['capacity_bytes'])} - {format_bytes(budget['headroom_bytes'])} "
        f"headroom): {_option_line(base)}</div>"
    )


def plan_page(p: dict[str, Any], *, command: str) -> str:
    """The whole page of one plan (``p``: ``Plan.to_json()``)."""
    rec = p.get("recommended")
    if rec:
        head = f'<div class="box ok"><b>recommended</b>: {_option_line(rec)}</div>'
    else:
        closest = p.get("closest")
        head = '<div class="box warn"><b class="bad">nothing fits</b>' + (
            f"; closest: {_option_line(closest)}</div>" if closest else "</div>"
        )
    bars = svg.stacked_bar(
        [_bar_row("as asked", p.get("baseline")), _bar_row("plan", rec or p.get("closest"))],
        format_bytes,
    )
    alts = "".join(
        f"<tr><td>{escape(a['summary'])}</td><td class='num'>{format_bytes(a.get('need_bytes'))}"
        f"</td><td class='num'>{a.get('tokens_per_s') or 0:,.0f}</td>"
        f"<td>{escape(str(a.get('quality_risk', '')))}</td></tr>"
        for a in p.get("alternatives", [])
    )
    settings = "".join(
        f"<tr><td>{escape(k)}</td><td><code>{escape(str(v))}</code></td></tr>"
        for k, v in (p.get("settings_export") or {}).items()
    )
    notes = "".join(f"<li>{escape(n)}</li>" for n in p.get("notes", []))
    body = (
        f"<h1>memfit plan: {escape(str(p['model']))}</h1>{_as_asked(p)}{head}"
        f"<h2>Memory at the peak: as asked and planned</h2>{bars}"
        + (
            "<h2>Alternatives</h2><table><tr><th>plan</th><th class='num'>needs</th>"
            f"<th class='num'>tokens/s</th><th>quality risk</th></tr>{alts}</table>"
            if alts
            else ""
        )
        + (f"<h2>Settings</h2><table>{settings}</table>" if settings else "")
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + page_tail(command)
    )
    return standalone_page(f"memfit plan: {p['model']}", body)


def write_plan_html(p: dict[str, Any], path: str | Path, *, command: str) -> Path:
    out = Path(path)
    write_text(out, plan_page(p, command=command), what="--html page")  # atomic; FIFOs refused
    return out


def plan_fragment(p: dict[str, Any]) -> str:
    """A notebook cell's view of a plan: as asked, then the recommendation."""
    base, rec = p.get("baseline"), p.get("recommended")
    asked = "fits" if base and base.get("fits") else "does not fit"
    return (
        f'<div class="memfit-est"><style>{FRAGMENT_CSS}</style>'
        f"<b>plan for {escape(str(p['model']))} on {escape(str(p['budget']['gpu']))}</b>"
        f"<p>as asked: <b>{asked}</b> ({_option_line(base)})</p>"
        + (
            f'<p><b class="good">recommended</b>: {_option_line(rec)}</p>'
            if rec
            else '<p><b class="bad">nothing fits</b></p>'
        )
        + "</div>"
    )


def fit_fragment(f: dict[str, Any]) -> str:
    """A notebook cell's view of a solve: the answer, then the estimate at it."""
    key = next((k for k in f if k.startswith("max_")), None)
    answer = f"{escape(key)} = {f[key]}" if key and f[key] is not None else "nothing fits"
    est = f.get("estimate")
    return (
        f'<div class="memfit-est"><style>{FRAGMENT_CSS}</style>'
        f"<b>fit {escape(str(f['solve']))} on {escape(str(f['gpu']))}</b>: {answer} "
        f"(limit {format_bytes(f['limit_bytes'])})</div>" + (estimate_fragment(est) if est else "")
    )
