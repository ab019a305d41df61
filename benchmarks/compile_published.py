"""Published per-GPU memory of runs that used torch.compile, against ``memfit estimate --compile``.

    PYTHONPATH=src .venv/bin/python benchmarks/compile_published.py            # markdown table
    PYTHONPATH=src .venv/bin/python benchmarks/compile_published.py --write    # + results file

Points: every row of ``benchmarks/data/multigpu_published.jsonl`` with ``"compile": true``
(sources, versions and assumptions are in that file). Each is run as the ``memfit estimate``
command ``benchmarks/multigpu_points.py`` prints for it (with ``--compile``; a subprocess with
``--json``; the float8 and sequence-parallel points go to the per-rank closed form, the others
to the analytic engine). Where the source also measured the same job without torch.compile
(torchtitan's Table 1 and 3 FSDP rows), the table gives that eager point too, so the saving
memfit predicts can be read against the one measured. Error = (estimate - measured) / measured
on the point's metric. A row whose other settings memfit cannot express is listed with why.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.multigpu_points import (  # noqa: E402  (the repository root on the path first)
    DATA,
    GIB,
    METRIC_FIELD,
    command,
    layout_text,
    run_cli,
)

RESULTS = ROOT / "benchmarks" / "results" / "compile_published.md"
#: The eager twin of a compile point: the same table's row without torch.compile.
EAGER_TWIN = {
    "tt-t1-fsdp8-compile": "tt-t1-fsdp8",
    "tt-t1-fsdp8-compile-float8": "tt-t1-fsdp8",
    "tt-t3-fsdp128-compile": "tt-t3-fsdp128",
    "tt-t3-fsdp128-compile-float8": "tt-t3-fsdp128",
}


def load() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    by_id = {r["id"]: r for r in rows if "id" in r}
    return [r for r in rows if r.get("compile") is True], by_id


def other_missing(point: dict[str, Any]) -> list[str]:
    """What else memfit cannot express about ``point`` (torch.compile itself it can)."""
    lay = point["layout"]
    out = [f"{k} {lay[k]}" for k in ("pp", "cp", "ep") if lay.get(k, 1) > 1]
    if point.get("expressible") is False:
        reason = point["reason"]
        parts = [p.strip() for p in reason.split(";")]
        out += [p for p in parts if not p.startswith("torch.compile")]
    return out


def estimate_gib(argv: list[str], metric: str) -> tuple[float, str]:
    est = run_cli(argv)
    return est[METRIC_FIELD[metric]] / GIB, str(est["engine"]).split(" (")[0] + (
        " (closed form)" if "closed form" in str(est["engine"]) else ""
    )


def run(point: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {k: point.get(k) for k in ("id", "model", "gpus", "metric")}
    row |= {"measured_gib": point["measured_gib"], "layout": layout_text(point)}
    row["checkpointing"] = point["checkpointing"]
    row["float8"] = bool(point.get("float8"))
    row["missing"] = other_missing(point)
    if row["missing"]:
        return row
    argv = command(point)  # multigpu_points.command adds --compile for a compile point
    row["command"] = "memfit estimate " + " ".join(argv)
    predicted, row["engine"] = estimate_gib(argv, point["metric"])
    row["predicted_gib"] = round(predicted, 2)
    row["error"] = round(predicted / point["measured_gib"] - 1, 4)
    twin = by_id.get(EAGER_TWIN.get(point["id"], ""))
    if twin is not None:
        # the eager twin on the engine that answers the compile point (the derived engine
        # refuses --compile: the analytic engine answers), so the saving compares like with like
        eager_argv = command(twin)[: command(twin).index("--engine")]
        if point.get("float8"):
            eager_argv += ["--float8", "tensorwise"]
        eager_argv += ["--engine", "analytic"]
        eager_pred, _ = estimate_gib(eager_argv, twin["metric"])
        row["eager"] = {
            "id": twin["id"],
            "measured_gib": twin["measured_gib"],
            "predicted_gib": round(eager_pred, 2),
        }
    return row


def render(rows: list[dict[str, Any]]) -> str:
    head = [
        "# torch.compile runs: published per-GPU memory vs `memfit estimate --compile`",
        "",
        "`PYTHONPATH=src .venv/bin/python benchmarks/compile_published.py --write` — every "
        '`"compile": true` row of `benchmarks/data/multigpu_published.jsonl` (sources, framework '
        "versions and assumptions in that file). Saving: the source's eager twin (same table, "
        "without torch.compile) minus the compile point, measured vs memfit's (the eager twin "
        "estimated with the same flags but `--compile`, and `--float8 tensorwise` for a Float8 "
        "point, whose eager twin ran without Float8).",
        "",
        "| point | model | GPUs | layout | ckpt | metric | measured GiB | memfit GiB | error | "
        "saving measured / memfit GiB | engine |",
        "| --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    lines = []
    for r in rows:
        lead = (
            f"| {r['id']} | {r['model']} | {r['gpus']} | {r['layout']} | {r['checkpointing']} "
            f"| {r['metric']} | {r['measured_gib']:.2f} |"
        )
        if r["missing"]:
            lines.append(f"{lead} - | - | - | not expressible: {'; '.join(r['missing'])} |")
            continue
        saving = "-"
        if "eager" in r:
            e = r["eager"]
            measured = e["measured_gib"] - r["measured_gib"]
            ours = e["predicted_gib"] - r["predicted_gib"]
            saving = f"{measured:.1f} / {ours:.1f} (eager {e['id']})"
        lines.append(
            f"{lead} {r['predicted_gib']:.2f} | {r['error']:+.1%} | {saving} | {r['engine']} |"
        )
    scored = [r for r in rows if "error" in r]
    tail = ["", f"{len(scored)} of {len(rows)} points estimated. Commands:", ""]
    tail += [f"- {r['id']}: `{r['command']}`" for r in scored]
    if scored:
        errors = [r["error"] for r in scored]
        tail += [
            "",
            f"Errors: min {min(errors):+.1%}, max {max(errors):+.1%}, mean "
            f"{sum(errors) / len(errors):+.1%}; without Float8: "
            + ", ".join(f"{r['id']} {r['error']:+.1%}" for r in scored if not r["float8"]),
        ]
    return "\n".join(head + lines + tail) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"also write {RESULTS.name}")
    ap.add_argument("--json", action="store_true", help="one JSON object per point")
    args = ap.parse_args()
    points, by_id = load()
    rows = [run(p, by_id) for p in points]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    text = render(rows)
    print(text)
    if args.write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
