"""A bundled pipeline's components traced whole and with their block stacks cut (issue 32).

For each component of the pipeline call that has a stack longer than the blocks kept
(``estimate/diffusion/blockwise.py``), at the job's shapes: the record of the whole component's
trace and the record of the cut one (``pipelines._trace_cut_record``), the CPU seconds of each
(``time.process_time``: build on meta, dtype cast, trace) and whether they are equal — the
activation peak, the output bytes, the cuDNN allowance and every event with the storage keys
renamed in order of appearance. Writes ``benchmarks/results/diffusion_blockwise.md``.

    PYTHONPATH=src .venv/bin/python benchmarks/diffusion_blockwise.py            # flux.1-dev
    PYTHONPATH=src .venv/bin/python benchmarks/diffusion_blockwise.py sd3.5-medium
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "src" / "memfit" / "models" / "pipelines"


def _renamed(events: list[list[Any]]) -> list[tuple[str, int, int]]:
    names: dict[int, int] = {}
    return [(k, names.setdefault(key, len(names)), n) for k, key, n in events]


def measure(name: str) -> list[dict[str, Any]]:
    from memfit.estimate.diffusion import blockwise
    from memfit.estimate.diffusion.pipeline import DTYPES, build_component, read_tree
    from memfit.estimate.diffusion.pipelines import (
        _recipe,
        _to_dtype,
        _trace_cut_record,
        _trace_record,
    )
    from memfit.spec.diffusion import DiffusionJob

    index, configs = read_tree(PIPELINES / name)
    job = DiffusionJob(height=1024, width=1024, steps=28, precision="bf16")
    dt = DTYPES[job.precision]
    steps, vae_dt, _ = _recipe(str(index["_class_name"]), configs, job, dt, index)
    rows = []
    for comp, (make_inputs, call, _stage) in steps.items():
        library, cls = index[comp]

        def built(lib: str = library, c: str = cls, comp: str = comp) -> Any:
            model = build_component(lib, c, configs[comp])
            return _to_dtype(model, vae_dt if comp == "vae" else dt, lib)

        probe = built()
        stacks = [(cut.path, cut.n_blocks) for cut, _ in blockwise.stacks_of(probe)]
        del probe
        if not stacks:
            continue
        # the cut trace first: a first run's one-time costs (lazy imports, kernels' first
        # dispatch) then count against it, not against the whole trace
        t0 = time.process_time()
        cut = _trace_cut_record(built(), make_inputs, call)
        t1 = time.process_time()
        whole = _trace_record(built(), make_inputs, call)
        t2 = time.process_time()
        same = cut is not None and (
            (cut["activation"], cut["output"], cut["workspace"])
            == (whole["activation"], whole["output"], whole["workspace"])
            and _renamed(cut["events"]) == _renamed(whole["events"])
        )
        rows.append({"component": comp, "class": cls, "stacks": stacks,
                     "events": len(whole["events"]), "whole_s": t2 - t1, "cut_s": t1 - t0,
                     "cut": cut is not None, "equal": same})  # fmt: skip
    return rows


def render(name: str, rows: list[dict[str, Any]]) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    lines = [
        f"# {name}: components traced whole and with their block stacks cut (issue 32)",
        "",
        f"Written by `benchmarks/diffusion_blockwise.py {name}` at commit {commit}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 1024x1024, batch 1, bf16. "
        "CPU seconds (`time.process_time`) of build on meta + dtype cast + trace (the cut "
        "one first: one-time costs count against it), on 2 cores shared with other work. "
        "`equal`: activation peak, output bytes, cuDNN allowance and every event (keys "
        "renamed in order of appearance) the same.",
        "",
        "| component | class | stacks (blocks) | events | whole CPU s | cut CPU s | equal |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stacks = ", ".join(f"`{p}` ({n})" for p, n in r["stacks"])
        lines.append(
            f"| {r['component']} | {r['class']} | {stacks} | {r['events']} | "
            f"{r['whole_s']:.2f} | {r['cut_s']:.2f} | "
            f"{'yes' if r['equal'] else ('no' if r['cut'] else 'traced whole')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else "flux.1-dev"
    rows = measure(name)
    text = render(name, rows)
    out = ROOT / "benchmarks" / "results" / f"diffusion_blockwise_{name}.md"
    out.write_text(text)
    print(text)
    return 0 if all(r["equal"] or not r["cut"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
