"""Derive the shipped forms of bundled diffusion pipelines and check them against the trace.

    PYTHONPATH=src python benchmarks/derive_pipeline_forms.py flux.1-dev sd3-medium

For each pipeline: every component's forward is traced at batch 1 and 2 at three resolutions
(:data:`SAMPLES`) and fitted as a form (:func:`memfit.estimate.diffusion.derived.fit_form`); the
"what makes it fit" searches of :data:`SEARCH_GPUS` are run with the trace engine to record the
component facts and weight layouts they read; the store is written to
``src/memfit/estimate/diffusion/forms/<pipeline>.json.gz``. Then, at :data:`HELD_OUT` sizes (none a
sample), each component is traced again and its record compared with the form's, event for event,
and the whole pipeline estimate of the derived engine with the trace engine's (allocated,
reserved, reserved with the cuDNN allowance). A form whose records differ anywhere is left out of
the store (the trace answers those jobs). Results: ``benchmarks/results/pipeline_forms.md`` /
``.json`` (appended per pipeline).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

os.environ.setdefault("MEMFIT_CACHE_DIR", tempfile.mkdtemp(prefix="memfit-forms-"))

from memfit.estimate.derived.cache import disabled  # noqa: E402
from memfit.estimate.diffusion import built, derived, pipelines  # noqa: E402
from memfit.estimate.diffusion.answer import read_tree  # noqa: E402
from memfit.estimate.diffusion.pipelines import trace_source, traced_pipeline  # noqa: E402
from memfit.estimate.trace.tracker import StorageTracker  # noqa: E402
from memfit.hardware.catalog import get_gpu  # noqa: E402
from memfit.models.pipelines import pipeline_dir  # noqa: E402
from memfit.plan.budget import DEFAULT_HEADROOM, Budget  # noqa: E402
from memfit.plan.diffusion_infer import plan_pipeline  # noqa: E402
from memfit.spec.diffusion import DiffusionJob  # noqa: E402

SAMPLES = [(b, s, s) for s in (256, 384, 512) for b in (1, 2, 3)]
HELD_OUT = [(1, 1024, 1024), (1, 768, 1344), (2, 640, 896), (4, 512, 512)]
#: the trace's rounding of each storage (StorageTracker.round_to: CUDA's 512 B blocks)
ROUND_TO = 512
SEARCH_GPUS = ("L4", "T4", "RTX-3060", "RTX-4090", "A100-40GB")
RESULTS = Path(__file__).parent / "results" / "pipeline_forms"


@contextlib.contextmanager
def _raw_bytes():
    """Trace each storage's own bytes (the tracker's rounding off), keeping nothing on disk or in
    the process's memo (those records are not the trace engine's)."""
    defaults = StorageTracker.__init__.__kwdefaults__
    defaults["round_to"] = 1
    try:
        with disabled():
            yield
    finally:
        defaults["round_to"] = ROUND_TO
        pipelines._TRACES.clear()


def _records(root: Path, index: dict, configs: dict, job: DiffusionJob) -> dict[str, dict]:
    source, steps = trace_source(root, index, configs, job)
    out = {}
    for comp in steps:
        act, o, events, ws = source.trace(comp, False)
        out[comp] = {"activation": act, "output": o, "events": events, "workspace": ws}
    return out


def _form_keys(root: Path, index: dict, configs: dict, job: DiffusionJob) -> dict[str, str]:
    pipeline = str(index["_class_name"])
    _, dtype_of = derived.outline(pipeline, configs, job)
    return {c: derived.form_key([*index[c], configs[c]], dtype_of[c], job, c, False)
            for c in dtype_of}  # fmt: skip


def _same(form: dict, rec: dict, b: int, area: int) -> str:
    """'' where the form's record at (b, area) equals the trace's, else what differs."""
    try:
        act, out, events, ws = derived.evaluate(form, b, area)
    except derived.NotDerived as exc:
        return str(exc)
    diffs = []
    if derived.canonical_events(events) != derived.canonical_events(rec["events"]):
        diffs.append("events")
    for what, got, want in (("activation", act, rec["activation"]), ("output", out, rec["output"]),
                            ("workspace", ws, rec["workspace"])):  # fmt: skip
        if got != want:
            diffs.append(f"{what} {got} vs {want}")
    return ", ".join(diffs)


def derive(name: str) -> dict:
    root = pipeline_dir(name)
    assert root is not None, name
    index, configs = read_tree(root)
    pipeline = str(index["_class_name"])
    t0 = time.process_time()
    samples: dict[str, list] = {}
    with _raw_bytes():
        for b, h, w in SAMPLES:
            job = DiffusionJob(batch=b, height=h, width=w)
            area = derived.latent_area(pipeline, configs, job)
            keys = _form_keys(root, index, configs, job)
            for comp, rec in _records(root, index, configs, job).items():
                samples.setdefault(keys[comp], []).append((b, area, rec, comp))
    forms: dict[str, dict] = {}
    fit_notes = []
    for key, got in samples.items():
        comp = got[0][3]
        for regime, batches in (("b1", (1,)), ("bN", (2, 3))):
            form = derived.fit_form(
                [(b, a, r) for b, a, r, _ in got if b in batches], round_to=ROUND_TO
            )
            if form is None:
                fit_notes.append(f"{comp} {regime}: the event sequence differs between samples")
                continue
            forms.setdefault(key, {})[regime] = form
    derive_s = time.process_time() - t0
    # the facts and layouts the searches read
    for gpu in SEARCH_GPUS:
        rec = get_gpu(gpu)
        budget = Budget.of(rec, memory_bytes=None, headroom=DEFAULT_HEADROOM)

        def est(j: DiffusionJob):
            return traced_pipeline(root, index, configs, j, name=name)

        plan_pipeline(est, DiffusionJob(), budget=budget, arch=rec.arch)
    store = {
        "derivation": {
            "versions": {p: metadata.version(p) for p in ("torch", "diffusers", "transformers")},
            "derived_at": "batch 1, 2 and 3 at 256x256, 384x384 and 512x512",
            "validated_at": "",
        },
        "facts": {k: asdict(v) for k, v in built._FACTS.items()},
        "layouts": {k: built._layout_record(v) for k, v in built._LAYOUTS.items()},
        "forms": forms,
    }
    # held-out sizes: records and whole estimates
    rows = []
    failed: set = set()
    for b, h, w in HELD_OUT:
        job = DiffusionJob(batch=b, height=h, width=w)
        area = derived.latent_area(pipeline, configs, job)
        keys = _form_keys(root, index, configs, job)
        for comp, rec in _records(root, index, configs, job).items():
            regime = "b1" if b == 1 else "bN"
            form = forms.get(keys[comp], {}).get(regime)
            diff = "no form" if form is None else _same(form, rec, b, area)
            if diff and form is not None:
                failed.add((keys[comp], regime))
            rows.append({"size": [b, h, w], "component": comp, "equal": not diff, "diff": diff})
    for key, regime in failed:  # a form that missed anywhere is not shipped
        del forms[key][regime]
    sizes = ", ".join(f"batch {b} {h}x{w}" for b, h, w in HELD_OUT)
    store["derivation"]["validated_at"] = sizes
    out = derived.FORMS_DIR / f"{root.resolve().name}.json.gz"
    out.parent.mkdir(exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(store, f, separators=(",", ":"), sort_keys=True)
    derived.shipped.cache_clear()
    incomplete = [key for key in samples if not forms.get(key)]
    whole = []
    for b, h, w in HELD_OUT:
        job = DiffusionJob(batch=b, height=h, width=w)
        t = traced_pipeline(root, index, configs, job, name=name)
        try:
            d = derived.derived_pipeline(root, index, configs, job, name=name)
        except derived.NotDerived as exc:
            whole.append({"size": [b, h, w], "derived": None, "why": str(exc)})
            continue
        whole.append({
            "size": [b, h, w],
            "trace": [t.peak_bytes, t.peak_reserved_bytes, t.peak_reserved_upper_bytes],
            "derived": [d.peak_bytes, d.peak_reserved_bytes, d.peak_reserved_upper_bytes],
        })  # fmt: skip
    if incomplete:  # a component without any form: every job would be traced anyway
        out.unlink()
        fit_notes.append(f"{len(incomplete)} component(s) without a form: no store shipped")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    n_forms = sum(len(f) for f in forms.values())
    return {"pipeline": name, "class": pipeline, "commit": commit, "derive_cpu_s": derive_s,
            "forms": n_forms, "fit_notes": fit_notes, "records": rows, "whole": whole,
            "store_bytes": out.stat().st_size if out.exists() else 0,
            "versions": store["derivation"]["versions"]}  # fmt: skip


def _md(res: dict) -> str:
    lines = [
        f"## {res['pipeline']} ({res['class']})",
        "",
        f"Written by `benchmarks/derive_pipeline_forms.py {res['pipeline']}` at commit "
        f"{res['commit']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{', '.join(f'{k} {v}' for k, v in sorted(res['versions'].items()))}. Forms derived "
        "from traces at batch 1, 2 and 3 at 256x256, 384x384, 512x512 (bf16, no offload, no "
        "switches; one form for batch 1, one for larger batches from batches 2 and 3; storages' "
        f"own bytes, rounded to 512 B as the trace does); {res['forms']} forms shipped "
        f"({res['store_bytes']} bytes gzipped, derived in {res['derive_cpu_s']:.1f} CPU s). "
        "Held-out sizes, none of them a sample:" + "".join(f" {n}." for n in res["fit_notes"]),
        "",
        "| size (batch, HxW) | component | record equal to the trace | differs |",
        "|---|---|---|---|",
    ]
    for r in res["records"]:
        b, h, w = r["size"]
        lines.append(f"| {b}, {h}x{w} | {r['component']} | {'yes' if r['equal'] else 'no'} | "
                     f"{r['diff'] or ''} |")  # fmt: skip
    lines += ["", "| size | trace alloc / reserved / reserved+cuDNN (bytes) | derived | "
              "alloc diff | reserved diff |", "|---|---|---|---|---|"]  # fmt: skip
    for r in res["whole"]:
        b, h, w = r["size"]
        if r["derived"] is None:
            lines.append(f"| {b}, {h}x{w} | | not derived: {r['why']} | | |")
            continue
        t, d = r["trace"], r["derived"]
        da = (d[0] - t[0]) / t[0] * 100
        dr = (d[1] - t[1]) / t[1] * 100
        lines.append(f"| {b}, {h}x{w} | {t[0]} / {t[1]} / {t[2]} | {d[0]} / {d[1]} / {d[2]} | "
                     f"{da:+.3f} % | {dr:+.3f} % |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    md = RESULTS.with_suffix(".md")
    if not md.exists():
        md.write_text("# Shipped pipeline forms checked against the trace (issue 32)\n\n")
    for name in sys.argv[1:]:
        res = derive(name)
        with md.open("a") as f:
            f.write(_md(res) + "\n")
        js = RESULTS.with_suffix(".json")
        prev = json.loads(js.read_text()) if js.exists() else []
        js.write_text(json.dumps([*prev, {k: v for k, v in res.items()}], indent=1) + "\n")
        print(_md(res))


if __name__ == "__main__":
    main()
