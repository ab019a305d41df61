"""HTML of one estimate: the page ``memfit estimate ... --html FILE`` writes, and the small
fragment a notebook shows (``MemoryEstimate._repr_html_``).

Both are self-contained (inline CSS and SVG, no script, nothing fetched) and are drawn from the
estimate's JSON (``MemoryEstimate.to_json()``, the dict ``--json`` prints), with the styling and
the stacked bars of the run report (:mod:`memfit.report.html`, :mod:`memfit.report.svg`).
The page: the GPU verdict, the three peaks with their measured-error ranges, the breakdown by
component at the peak and by phase, the modules holding most at the peak, the notes, the exact
command and the versions of memfit and of the libraries the estimate depends on.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from memfit.report import svg
from memfit.report.style import COMPONENT_COLORS, PAGE_CSS
from memfit.units import format_bytes
from memfit.userwrites import write_text
from memfit.version import __version__

#: The three peaks, as the CLI labels them.
PEAKS = (
    ("peak_allocated_bytes", "peak allocated", "torch.cuda.max_memory_allocated()"),
    ("peak_reserved_bytes", "peak reserved", "torch.cuda.max_memory_reserved()"),
    ("device_used_bytes", "device used", "what nvidia-smi shows"),
)
#: Libraries whose versions an estimate depends on (read from package metadata, not imported).
LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "huggingface-hub")


def versions() -> dict[str, str]:
    """memfit's, Python's and the installed libraries' versions (absent ones left out).
    ``importlib.metadata`` (~0.04 s of imports) is loaded here, when a page is written, not with
    the estimate record that imports this module for its notebook view."""
    import platform
    from importlib import metadata

    out = {"memfit": __version__, "python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def verdict_html(est: dict[str, Any]) -> str:
    """The fits / does-not-fit box (or a hint to pass --gpu)."""
    fits = est.get("fits")
    if not fits:
        return '<div class="box">no GPU given: pass <code>--gpu NAME</code> for a verdict</div>'
    need, cap = format_bytes(est["device_used_bytes"]), format_bytes(fits["capacity_bytes"])
    if fits["fits"]:
        return (
            f'<div class="box ok"><b class="good">fits on {escape(fits["gpu"])}</b>: needs '
            f"{need} of {cap} ({format_bytes(fits['free_bytes'])} free)</div>"
        )
    return (
        f'<div class="box warn"><b class="bad">does not fit on {escape(fits["gpu"])}</b>: needs '
        f"{need} of {cap} (short by {format_bytes(-fits['free_bytes'])})</div>"
    )


def peaks_table(est: dict[str, Any]) -> str:
    """The three peaks with the low and high ends of their ranges."""
    rows = "".join(
        f'<tr><td>{label}</td><td class="num"><b>{format_bytes(est[key])}</b></td>'
        f'<td class="num">{format_bytes(est.get(key + "_low"))}</td>'
        f'<td class="num">{format_bytes(est.get(key + "_high"))}</td><td>{escape(what)}</td></tr>'
        for key, label, what in PEAKS
    )
    return (
        '<table class="peaks"><tr><th>peak</th><th class="num">estimate</th>'
        '<th class="num">range low</th><th class="num">range high</th><th>as</th></tr>'
        f"{rows}</table>"
    )


def _parts(components: dict[str, int]) -> list[tuple[str, int, str]]:
    return [(c, components.get(c, 0), color) for c, color in COMPONENT_COLORS.items()]


def component_bars(est: dict[str, Any], width: int = 920) -> str:
    """Stacked bars: the peak's components, then each phase's."""
    rows = [(f"peak ({est['peak_phase']})", _parts(est["components"]))]
    rows += [(name, _parts(p["components"])) for name, p in est.get("phases", {}).items()]
    return svg.stacked_bar(rows, format_bytes, width=width)


def _components_table(est: dict[str, Any]) -> str:
    phases = est.get("phases", {})
    head = "".join(f'<th class="num">{escape(p)}</th>' for p in phases)
    body = ""
    for c in COMPONENT_COLORS:
        cells = "".join(
            f'<td class="num">{format_bytes(p["components"].get(c, 0))}</td>'
            for p in phases.values()
        )
        body += (
            f'<tr><td>{c}</td><td class="num">{format_bytes(est["components"].get(c, 0))}</td>'
            f"{cells}</tr>"
        )
    totals = "".join(
        f'<td class="num"><b>{format_bytes(p["peak_allocated_bytes"])}</b></td>'
        for p in phases.values()
    )
    return (
        f'<table><tr><th>component</th><th class="num">at the peak</th>{head}</tr>{body}'
        f'<tr><td><b>allocated</b></td><td class="num"><b>'
        f"{format_bytes(est['peak_allocated_bytes'])}</b></td>{totals}</tr></table>"
    )


def _modules_table(est: dict[str, Any]) -> str:
    modules = est.get("top_modules") or []
    if not modules:
        return (
            '<p class="meta">No per-module breakdown: the '
            f"{escape(est.get('engine', '?'))} engine does not attribute bytes to modules "
            "(the trace engine does: <code>--engine trace</code>).</p>"
        )
    rows = "".join(
        f'<tr><td><code>{escape(m["name"])}</code></td><td class="num">'
        f"{format_bytes(m['bytes'])}</td></tr>"
        for m in modules
    )
    return f'<table><tr><th>module</th><th class="num">live at the peak</th></tr>{rows}</table>'


def versions_table(extra: dict[str, Any] | None = None) -> str:
    """memfit's and the libraries' versions, plus ``extra`` rows (e.g. the estimate's own)."""
    rows = {**versions(), **(extra or {})}
    return (
        "<table>"
        + "".join(
            f"<tr><td>{escape(k)}</td><td>{escape(str(v))}</td></tr>" for k, v in rows.items()
        )
        + "</table>"
    )


def page_tail(command: str, extra_versions: dict[str, Any] | None = None) -> str:
    """The end of every standalone page: the command that made it and the versions."""
    return (
        f"<h2>Command</h2><p><code>{escape(command)}</code></p>"
        f"<h2>Versions</h2>{versions_table(extra_versions)}"
        "<footer>a self-contained page: nothing is loaded from the network</footer>"
    )


def standalone_page(title: str, body: str) -> str:
    """A whole self-contained HTML document around ``body`` (no network loads)."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{PAGE_CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def estimate_page(est: dict[str, Any], *, command: str) -> str:
    """The whole page of one estimate (``est``: ``MemoryEstimate.to_json()``)."""
    model = est["model"]
    w = est.get("workload", {})
    shape = ", ".join(f"{k} {w[k]}" for k in ("mode", "batch_size", "seq_len") if k in w)
    notes = "".join(f"<li>{escape(n)}</li>" for n in est.get("notes", []))
    body = (
        f"<h1>memfit estimate: {escape(model['name'])}</h1>"
        f'<div class="meta">{model["n_params"] / 1e6:,.1f} M parameters '
        f"({model['n_trainable_params'] / 1e6:,.1f} M trainable) · {escape(shape)} · "
        f"{escape(est['engine'])} engine</div>"
        f"{verdict_html(est)}<h2>Peaks, with the measured-error range</h2>{peaks_table(est)}"
        f"<h2>By component and phase</h2>{component_bars(est)}{_components_table(est)}"
        f"<h2>By module, at the peak</h2>{_modules_table(est)}"
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + page_tail(command, {f"estimate: {k}": v for k, v in est.get("environment", {}).items()})
    )
    return standalone_page(f"memfit estimate: {model['name']}", body)


def write_estimate_html(est: dict[str, Any], path: str | Path, *, command: str) -> Path:
    out = Path(path)
    write_text(out, estimate_page(est, command=command), what="--html page")  # atomic
    return out


#: The fragment's own style: scoped to its root class, so a notebook's page keeps its look.
FRAGMENT_CSS = (
    ".memfit-est{font:13px/1.4 system-ui,sans-serif}.memfit-est table{border-collapse:collapse}"
    ".memfit-est td,.memfit-est th{border:1px solid #d8dbe0;padding:2px 8px;text-align:right}"
    ".memfit-est .good{color:#1e7d32;font-weight:600}.memfit-est .bad{color:#b3261e;"
    "font-weight:600}.memfit-est svg{max-width:640px;height:auto}"
    ".memfit-est .chart text{font-size:11px;fill:#4a505c}.memfit-est .ytick{text-anchor:end}"
    ".memfit-est .inbar{fill:#fff;font-weight:600}"
)


def estimate_fragment(est: dict[str, Any]) -> str:
    """A notebook cell's view: the verdict, the peaks and the bar of components at the peak."""
    fits = est.get("fits")
    verdict = ""
    if fits:
        word, cls = ("fits", "good") if fits["fits"] else ("does not fit", "bad")
        verdict = f'<p><b class="{cls}">{word} on {escape(fits["gpu"])}</b></p>'
    rows = "".join(
        f"<tr><th>{label}</th><td>{format_bytes(est[key])}</td>"
        f"<td>{format_bytes(est.get(key + '_low'))} – {format_bytes(est.get(key + '_high'))}</td>"
        "</tr>"
        for key, label, _ in PEAKS
    )
    bar = svg.stacked_bar([("at the peak", _parts(est["components"]))], format_bytes, width=640)
    return (
        f'<div class="memfit-est"><style>{FRAGMENT_CSS}</style>'
        f"<b>{escape(est['model']['name'])}</b> ({escape(est['engine'])} engine){verdict}"
        f"<table>{rows}</table>{bar}</div>"
    )
