"""Serving-size inference: the trace's reserved / allocated bytes against the analytic engine's.

The analytic engine knows an inference job's peak allocated bytes (within 0.2 % of the trace
on the fast-path grid) but not its allocation order, so the reserved bytes it shows and the
band a verdict is settled on are rules (``estimate/analytic/reserved.py``, ``infer_reserved``).
This script measures, per job, the trace engine's replay of the caching allocator (peak
allocated, peak reserved) and the analytic engine's peak and its components at the peak
(``parameters``: held for the process's life; the rest: KV cache, activations, temporaries),
on bundled real configs at their real widths, at full depth or cut to a few layers (the
``depth`` field; None: full depth), bf16, batches 1-32, prompts 512-8192, 16-256 new tokens.
Rows are appended to ``benchmarks/results/infer_reserved.jsonl`` (one per job, as measured).
``--grid`` adds, per inference row of ``benchmarks/results/fastpath_grid.jsonl`` (``infer``,
``infer_long``), the analytic engine's components at the peak (the grid records the bytes, not
the parameters' share), with the grid row's trace bytes as they are (``"source": "grid"``);
and the same for the rows of the grid's inference variants (:data:`VARIANT_JOBS`: eager or
flash attention, another image size), whose workload is the grid job's fields
(``fastpath_grid.JOBS``): those rows are judged by the fit (``--judge``), not fitted to, so
the fit (:data:`FIT_JOBS`' rows) stays the one the constants are.

``--fit`` prints the rule fitted to every row (the trace's) and to the H200 measurements
(``gpu_h200_measurements.jsonl``, inference cases: the real allocator, which reserves more than
the trace's replay on llama-3.2-1b), each row's parts (``InferParts``: its phases' peaks, the
parameters and the KV cache in them) taken from the analytic engine now (it must still allocate
the row's bytes): the reserved bytes of an inference job are the larger of

    prefill: held x held_ratio + prompt KV x kv_ratio + (the rest of its peak) x ratio
    decode:  held x held_ratio + prompt KV x prompt_kv_ratio + grown KV x grown_kv_ratio
             + (the rest of its peak) x ratio

plus 22 MiB (``estimate/analytic/reserved.py``, ``infer_bytes``). ``held``: the parameters
(allocated once at load, never freed: only their sizes' rounding into the allocator's segments
costs, a few %); the rest (activations, temporaries) is where the caching allocator fragments;
the KV cache lives from the prefill on, but transformers' DynamicCache grows it by
``torch.cat`` every decode step (``DynamicLayer.update``: the new copy allocated while the old
one is alive), so the grown tensors need blocks larger than those they leave, and the prompt's
blocks stay behind as holes unless the prefill's freed activations held the grown cache; 22
MiB: one partly used segment of each pool (a 20 MiB large-pool one for 1-10 MiB requests, a 2
MiB small-pool one), which no ratio of a job's bytes reaches (PyTorch
c10/cuda/CUDACachingAllocator.cpp, ``kLargeBuffer`` / ``kSmallBuffer``). Two fits: ``shown``
(every row at >= 98 % of its measured reserved bytes) and ``top`` (every row's reserved bytes,
plus any excess of the analytic allocated bytes over the measured: the band a verdict settles
on); of the grid of ratios (``HELD_RATIOS`` ... ``GROWN_KV_RATIOS``, ``ratio`` the least that
reaches every row), the one with the least mean over-prediction on the job-sized rows (>= 1
GiB). The jobs after the first 20 are KV-heavy (the cache 32-91 % of the peak, 128-2048 new
tokens), added by helper "kvinfer" (docs/accuracy.md, "Inference reserved bytes: the KV cache
apart").

    PYTHONPATH=src .venv/bin/python benchmarks/infer_reserved.py         # the jobs not yet there
    PYTHONPATH=src .venv/bin/python benchmarks/infer_reserved.py --only llama-3.2-1b
    PYTHONPATH=src .venv/bin/python benchmarks/infer_reserved.py --grid     # the grid's rows
    PYTHONPATH=src .venv/bin/python benchmarks/infer_reserved.py --fit  # infer_reserved_fit.txt
    PYTHONPATH=src .venv/bin/python benchmarks/infer_reserved.py --judge  # the variant rows
    PYTHONPATH=src .venv/bin/python benchmarks/infer_reserved.py --judge-moe  # MoE families' rows
    PYTHONPATH=src .venv/bin/python benchmarks/infer_reserved.py --timeline gpt2 150 768 256
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.estimate.analytic.replay import REPLAYED_KEY
from memfit.estimate.analytic.reserved import InferFit, InferParts, infer_bytes

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "infer_reserved.jsonl"
GRID = ROOT / "benchmarks" / "results" / "fastpath_grid.jsonl"
H200 = ROOT / "benchmarks" / "results" / "gpu_h200_measurements.jsonl"

#: (bundled config, depth or None for full depth, batch, prompt, new tokens).
JOBS: tuple[tuple[str, int | None, int, int, int], ...] = (
    ("llama-3.2-1b", None, 4, 2048, 64),  # the H200 row llama1b-infer-gen
    ("qwen3-0.6b", None, 1, 512, 16),
    ("qwen3-0.6b", None, 8, 2048, 64),
    ("qwen3-0.6b", None, 32, 1024, 128),
    ("llama-3.2-1b", None, 32, 512, 256),
    ("llama-3.2-1b", None, 1, 8192, 16),
    ("llama-3.1-8b", 2, 1, 8192, 16),
    ("llama-3.1-8b", 4, 1, 8192, 16),
    ("llama-3.1-8b", 2, 16, 2048, 256),
    ("llama-3.1-8b", 4, 16, 2048, 256),
    ("llama-3.1-8b", 2, 32, 512, 64),
    ("llama-3.1-8b", 4, 32, 512, 64),
    ("mistral-7b-v0.1", 2, 1, 4096, 32),  # the H200 row mistral7b-infer, cut
    ("mistral-7b-v0.1", 4, 1, 4096, 32),
    ("qwen3-0.6b", 4, 8, 2048, 64),  # qwen3-0.6b cut: the ratio in depth
    ("qwen3-0.6b", 14, 8, 2048, 64),
    ("llama-3.1-8b", None, 16, 2048, 256),  # full depth: the cuts against the whole model
    ("llama-3.1-8b", None, 32, 512, 64),
    ("llama-3.1-8b", None, 1, 8192, 16),
    ("mistral-7b-v0.1", None, 1, 4096, 32),  # the H200 row, traced
    # KV-heavy jobs (helper "kvinfer"): the cache a large share of the peak, grown over many
    # decode steps (docs/accuracy.md, "Inference reserved bytes: the KV cache apart")
    ("gpt2", None, 94, 768, 256),
    ("gpt2", None, 150, 768, 256),
    ("gpt2", None, 64, 256, 768),
    ("qwen3-0.6b", None, 64, 1024, 512),
    ("qwen3-0.6b", None, 16, 4096, 1024),
    ("qwen3-0.6b", None, 128, 256, 256),
    ("llama-3.2-1b", None, 128, 512, 512),
    ("llama-3.2-1b", None, 64, 2048, 256),
    ("llama-3.2-1b", None, 64, 256, 1024),  # decode-dominated: the cache grows 5x
    ("gpt2", None, 32, 128, 896),
    ("qwen3-0.6b", None, 32, 512, 2048),
    ("qwen3-0.6b", None, 256, 128, 128),
)


def _source(name: str, depth: int | None) -> Any:
    from memfit.models import resolve_model

    if depth is None:
        return resolve_model(name)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fastpath_grid import real_config

    path = Path(tempfile.mkdtemp(prefix="memfit-infer-")) / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(real_config(name, depth)))
    return resolve_model(str(path.parent))


def measure(name: str, depth: int | None, batch: int, seq: int, new: int) -> dict[str, Any]:
    from memfit.estimate.policy import run_engine
    from memfit.spec import WorkloadSpec

    w = WorkloadSpec(mode="infer", precision="bf16-true", batch_size=batch, seq_len=seq,
                     new_tokens=new)  # fmt: skip
    source = _source(name, depth)
    row: dict[str, Any] = {"model": name, "depth": depth, "batch": batch, "seq": seq,
                           "new_tokens": new}  # fmt: skip
    for engine in ("analytic", "trace"):
        started = time.perf_counter()
        est = run_engine(engine, source, w, None)
        row[engine] = {
            "allocated_bytes": est.peak_allocated_bytes,
            "reserved_bytes": est.peak_reserved_bytes,
            "phase": est.peak_phase,
            "components": {k: v for k, v in est.components.items() if v},
            "phases": {
                name: {
                    "allocated_bytes": ph.peak_allocated_bytes,
                    "components": {k: v for k, v in ph.components.items() if v},
                }
                for name, ph in est.phases.items()
            },  # fmt: skip
            "wall_s": round(time.perf_counter() - started, 2),
        }
    row["trace_ratio"] = round(row["trace"]["reserved_bytes"] / row["trace"]["allocated_bytes"], 4)
    row["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                   capture_output=True, text=True).stdout.strip()  # fmt: skip
    return row


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    if r.get("source") == "grid":
        return ("grid", r["family"], r["origin"], r["job"])
    return (r["model"], r["depth"], r["batch"], r["seq"], r["new_tokens"])


MIB = 2**20
#: The allocator's smallest segments, added once (module docstring).
FIXED_BYTES = 22 * MIB
#: What the answer shown may lie under a measured row (memfit.estimate.fastpath.TOLERANCE).
SHOWN_UNDER = 0.02
#: Rows of at least this many analytic allocated bytes are job-sized (their mean
#: over-prediction picks the fit).
LARGE_ROW_BYTES = 2**30
#: The ratios tried (``InferFit``'s fields but ``ratio``, which the rows then set).
HELD_RATIOS = tuple(1 + i / 200 for i in range(13))  # 1.000 ... 1.060
KV_RATIOS = tuple(1 + i / 100 for i in range(21))  # 1.00 ... 1.20
PROMPT_KV_RATIOS = tuple(i / 20 for i in range(21))  # 0.00 ... 1.00
GROWN_KV_RATIOS = tuple(1 + i / 100 for i in range(41))  # 1.00 ... 1.40


@dataclass(frozen=True)
class Point:
    """One measured inference job: the analytic engine's parts (its phases' peaks, the
    parameters and the KV cache in them), the measured allocated and reserved bytes (the
    trace's, or a real GPU's)."""

    label: str
    parts: InferParts
    measured_allocated_bytes: int
    measured_reserved_bytes: int

    @property
    def allocated_bytes(self) -> int:  # the analytic engine's
        return self.parts.peak_bytes

    @property
    def held_bytes(self) -> int:
        return self.parts.held_bytes

    @property
    def covered_bytes(self) -> int:
        excess = max(0, self.allocated_bytes - self.measured_allocated_bytes)
        return self.measured_reserved_bytes + excess


#: The fast-path grid's inference jobs the fit rests on (their rows' parts are fitted to).
FIT_JOBS = ("infer", "infer_long")
#: The grid's inference variants (``fastpath_grid.JOBS``): their rows' parts are recorded by
#: ``--grid`` and judged by the fit as it is (``--judge``; the fast path's per-(model type,
#: job) pending set, ``memfit.estimate.fastpath.INFER_VARIANTS_PENDING``), never fitted to.
VARIANT_JOBS = ("infer_eager", "infer_long_eager", "infer_flash", "infer_long_flash", "infer_img")
#: fp16 inference (a T4 / V100's 16-true; helper "fp16infer") and its variants: judged too.
VARIANT_JOBS += ("infer_fp16", "infer_long_fp16", "infer_fp16_eager", "infer_long_fp16_eager",
                 "infer_fp16_flash", "infer_long_fp16_flash", "infer_fp16_img")  # fmt: skip

#: Issue 32 (moeinfer): the MoE families whose analytic programs are inference only
#: (``families_deepseek.py``, ``families_gptoss.py``), tiny and bundled: their grid rows'
#: parts are recorded by ``--grid`` (``infer``, ``infer_long`` and :data:`MOE_JOBS`: generation
#: at 4x the sequence and 64 new tokens, gpt-oss's MXFP4 experts) and judged by the fit as it
#: is, never fitted to (they were added after it: ``all_points`` leaves them out).
MOE_FAMILIES = ("deepseek_v2", "deepseek-v2-lite", "gpt_oss", "gpt-oss-20b")
MOE_JOBS = ("infer_gen", "infer_mxfp4", "infer_long_mxfp4")
#: Issue 32 (whisper2): Whisper's analytic program (``families_whisper.py``) on the grid's tiny
#: whisper, whisper-base and whisper-small cut to 2 layers: their ``infer`` / ``infer_long``
#: rows (and the fp16 variants) are recorded by ``--grid`` and judged by the fit as it is,
#: never fitted to (added after it).
WHISPER_FAMILIES = ("whisper", "whisper-base", "whisper-small")
#: The families whose :data:`FIT_JOBS` rows the fit judges but does not rest on.
JUDGED_FAMILIES = MOE_FAMILIES + WHISPER_FAMILIES


def grid_workload(r: dict[str, Any]) -> Any:
    """A grid row's workload: its grid job's fields (``fastpath_grid.JOBS``: attention ...),
    its batch, sequence and new tokens, and its image size where it has one."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.fastpath_grid import JOBS as GRID_JOBS
    from memfit.spec import MediaSpec, WorkloadSpec

    fields = {"precision": "bf16-true", **GRID_JOBS[r["job"]], "batch_size": r["batch"],
              "seq_len": r["seq"], "new_tokens": r.get("new_tokens") or 0}  # fmt: skip
    if r.get("image_size"):
        fields["media"] = MediaSpec(image_size=int(r["image_size"]))
    return WorkloadSpec(**fields)


def row_source(r: dict[str, Any]) -> Any:
    """The model of a row: a grid row's tiny or cut config, a job row's bundled config at its
    depth."""
    if r.get("source") != "grid":
        return _source(r["model"], r["depth"])
    sys.path.insert(0, str(ROOT))
    from benchmarks.fastpath_grid import real_config
    from benchmarks.tiny_models import write_tiny
    from memfit.models import resolve_model

    folder = Path(tempfile.mkdtemp(prefix="memfit-infer-"))
    if r["origin"] == "tiny":
        return resolve_model(str(write_tiny(folder, r["family"])))
    path = folder / r["family"] / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(real_config(r["family"], int(r["origin"].split("-")[1]))))
    return resolve_model(str(path.parent))


def analytic_parts(source: Any, w: Any, recorded_bytes: int | None, what: str) -> InferParts:
    """The analytic engine's parts of a job now; it must still allocate ``recorded_bytes``
    (the row's), else the row no longer measures this engine."""
    from memfit.estimate.policy import run_engine

    est = run_engine("analytic", source, w, None)
    if recorded_bytes is not None and est.peak_allocated_bytes != recorded_bytes:
        raise SystemExit(f"{what}: analytic {est.peak_allocated_bytes} != the row's "
                         f"{recorded_bytes}: the engine moved since the row")  # fmt: skip
    parts = InferParts.of({name: ph.components for name, ph in est.phases.items()})
    # routed experts: the allocator's replay of the program's order (analytic/replay.py)
    replayed = int((est.trace or {}).get("analytic", {}).get(REPLAYED_KEY) or 0)
    return dataclasses.replace(parts, replayed_bytes=replayed)


def trace_points(rows: list[dict[str, Any]]) -> list[Point]:
    from memfit.models import take_media
    from memfit.spec import WorkloadSpec

    out = []
    for r in rows:
        a, t = r["analytic"], r["trace"]
        label = (
            f"{r['family']} ({r['origin']}, {r['job']})"
            if r.get("source") == "grid"
            else f"{r['model']} (depth {r['depth'] or 'full'}, {r['batch']} x {r['seq']} + "
            f"{r['new_tokens']})"
        )
        if r.get("source") == "grid":
            w = grid_workload(r)
            source = take_media(row_source(r), w.media)
        else:
            w = WorkloadSpec(mode="infer", precision="bf16-true", batch_size=r["batch"],
                             seq_len=r["seq"], new_tokens=r.get("new_tokens") or 0)  # fmt: skip
            source = row_source(r)
        parts = analytic_parts(source, w, int(a["allocated_bytes"]), label)
        out.append(Point(label, parts, int(t["allocated_bytes"]), int(t["reserved_bytes"])))
    return out


def h200_points() -> list[Point]:
    """The real-GPU inference measurements against the analytic engine's answer now."""
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    out = []
    for line in H200.read_text(encoding="utf-8").splitlines():
        r = json.loads(line) if line.strip() else {}
        if (r.get("workload") or {}).get("mode") != "infer":
            continue
        w = WorkloadSpec(precision="bf16-true", **r["workload"])
        parts = analytic_parts(resolve_model(r["config"]), w, None, r["case"])
        out.append(Point(f"{r['case']} (H200)", parts, int(r["max_memory_allocated"]),
                         int(r["max_memory_reserved"])))  # fmt: skip
    return out


def fit(pts: list[Point]) -> dict[str, Any]:
    """The shown and the top fit (module docstring): ``InferFit`` each, ``ratio`` rounded up
    to 3 places."""
    shown = _best(pts, [p.measured_reserved_bytes * (1 - SHOWN_UNDER) for p in pts])
    top = _best(pts, [p.covered_bytes for p in pts])
    worst = min(pts, key=lambda p: infer_bytes(p.parts, top) / p.covered_bytes)
    return {"shown": shown, "top": top, "fixed_bytes": FIXED_BYTES, "n_rows": len(pts),
            "n_large_rows": sum(1 for p in pts if p.allocated_bytes >= LARGE_ROW_BYTES),
            "worst": worst.label}  # fmt: skip


def _best(pts: list[Point], need: list[float]) -> InferFit:
    """Of every fit on the grid of ratios, with the least ``ratio`` that reaches ``need`` on
    every row, the one with the least mean over-prediction on the job-sized rows (the first
    such in the grid's order); the sums in floats (numpy), checked in integers after."""
    import numpy as np

    def col(values: list[float]) -> Any:
        return np.array(values, dtype=np.float64)

    held = col([min(p.held_bytes, p.allocated_bytes) for p in pts])
    prompt = col([p.parts.prompt_kv_bytes for p in pts])
    rest_pre = col([max(p.parts.prefill_bytes - h - p.parts.prompt_kv_bytes, 0)
                    for p, h in zip(pts, held, strict=True)])  # fmt: skip
    decoded = col([1.0 if p.parts.decode_bytes else 0.0 for p in pts])
    grown = col([p.parts.grown_kv_bytes for p in pts])
    rest_dec = col([max(p.parts.decode_bytes - h - p.parts.grown_kv_bytes, 0)
                    for p, h in zip(pts, held, strict=True)])  # fmt: skip
    needed = col(need)
    large = col([1.0 if p.allocated_bytes >= LARGE_ROW_BYTES else 0.0 for p in pts])
    large /= large.sum()
    measured = col([p.measured_reserved_bytes for p in pts])
    k = col(list(KV_RATIOS))[:, None, None, None]
    a = col(list(PROMPT_KV_RATIOS))[None, :, None, None]
    b = col(list(GROWN_KV_RATIOS))[None, None, :, None]

    def ratio_for(gap: Any, rest: Any) -> Any:  # the ratio of the rest that closes the gap
        safe = np.where(rest > 0, rest, 1.0)
        return np.where(rest > 0, gap / safe, np.where(gap <= 0, 0.0, np.inf))

    options = []
    for h in HELD_RATIOS:
        base = held * h + FIXED_BYTES
        pre_cache, dec_cache = prompt * k, prompt * a + grown * b
        r_pre = ratio_for(needed - base - pre_cache, rest_pre)
        r_dec = np.where(decoded > 0, ratio_for(needed - base - dec_cache, rest_dec), np.inf)
        r = np.maximum(1.0, np.minimum(r_pre, r_dec).max(axis=-1))
        r = np.ceil(r * 1000 - 1e-9) / 1000
        rr = r[..., None]
        rule = base + np.maximum(pre_cache + rest_pre * rr,
                                 np.where(decoded > 0, dec_cache + rest_dec * rr, 0.0))  # fmt: skip
        over = (rule / measured * large).sum(axis=-1)
        i = np.unravel_index(int(np.argmin(over)), over.shape)
        options.append((float(over[i]), h, float(r[i]), KV_RATIOS[i[0]],
                        PROMPT_KV_RATIOS[i[1]], GROWN_KV_RATIOS[i[2]]))  # fmt: skip
    _over, h, r, k0, a0, b0 = min(options)
    best = InferFit(h, r, k0, a0, b0)
    while any(infer_bytes(p.parts, best) < n for p, n in zip(pts, need, strict=True)):
        best = best._replace(ratio=round(best.ratio + 0.001, 3))  # integer rounding
    return best


def _rows() -> list[dict[str, Any]]:
    """The recorded rows, the last of each key (a grid row recorded again after the grid
    re-ran it with a moved analytic engine replaces the earlier one: ``--grid``)."""
    rows = [json.loads(line) for line in OUT.read_text(encoding="utf-8").splitlines() if line]
    return list({_key(r): r for r in rows}.values())


def all_points() -> list[Point]:
    """The rows the fit rests on: the serving-size jobs, the grid's :data:`FIT_JOBS` rows and
    the H200 measurements."""
    rows = [
        r
        for r in _rows()
        if r.get("source") != "grid"
        or (r["job"] in FIT_JOBS and r["family"] not in JUDGED_FAMILIES)
    ]
    # the fitted rule alone: a MoE row's replay (REPLAYED_RATIO) is judged, not fitted to
    return [
        dataclasses.replace(p, parts=dataclasses.replace(p.parts, replayed_bytes=0))
        for p in trace_points(rows) + h200_points()
    ]


def variant_rows() -> list[dict[str, Any]]:
    """The recorded grid rows of the inference variants (:data:`VARIANT_JOBS`)."""
    return [r for r in _rows() if r.get("source") == "grid" and r["job"] in VARIANT_JOBS]


def moe_rows() -> list[dict[str, Any]]:
    """The recorded grid rows of the families the fit judges but does not rest on
    (:data:`JUDGED_FAMILIES`: the MoE families' inference, :data:`MOE_JOBS` too, and
    Whisper's)."""
    jobs = FIT_JOBS + MOE_JOBS
    return [
        r
        for r in _rows()
        if r.get("source") == "grid" and r["family"] in JUDGED_FAMILIES and r["job"] in jobs
    ]


def judge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recorded grid row judged by the fit as it is (:data:`INFER_RESERVED`): the answer
    shown and the band's top against the trace's reserved bytes (``shown_err``, ``top_err``:
    (rule - trace) / trace) and whether the shown answer is no more than :data:`SHOWN_UNDER`
    under the trace and the top covers the row (the trace's reserved bytes plus any excess of
    the analytic allocated bytes over the trace's: ``Point.covered_bytes``)."""
    from memfit.estimate.analytic.reserved import INFER_RESERVED, REPLAYED_RATIO

    out = []
    for r, p in zip(rows, trace_points(rows), strict=True):
        shown = infer_bytes(p.parts, INFER_RESERVED["shown"], REPLAYED_RATIO["shown"])
        top = infer_bytes(p.parts, INFER_RESERVED["top"], REPLAYED_RATIO["top"])
        m = p.measured_reserved_bytes
        holds = shown >= m * (1 - SHOWN_UNDER) and top >= p.covered_bytes
        out.append({"family": r["family"], "origin": r["origin"], "job": r["job"],
                    "label": p.label, "trace_reserved_bytes": m, "shown_bytes": shown,
                    "top_bytes": top, "shown_err": shown / m - 1, "top_err": top / m - 1,
                    "holds": holds})  # fmt: skip
    return out


def grid_rows() -> list[dict[str, Any]]:
    """The fast-path grid's inference rows with the analytic engine's components (--grid)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.fastpath_grid import _latest
    from memfit.estimate.policy import run_engine
    from memfit.models import take_media

    grid = [json.loads(line) for line in GRID.read_text(encoding="utf-8").splitlines() if line]
    out = []
    for r in _latest(grid):
        a, t = r.get("analytic") or {}, r.get("trace") or {}
        moe = r["family"] in MOE_FAMILIES and r["job"] in FIT_JOBS + MOE_JOBS
        if r["job"] not in FIT_JOBS + VARIANT_JOBS and not moe:
            continue
        if a.get("status") != "ok" or t.get("status") != "ok":
            continue
        w = grid_workload(r)
        source = take_media(row_source({**r, "source": "grid"}), w.media)
        est = run_engine("analytic", source, w, None)
        if est.peak_allocated_bytes != a["allocated_bytes"]:  # the engine moved since the row
            raise SystemExit(f"{r['family']} {r['job']}: analytic {est.peak_allocated_bytes} "
                             f"!= the grid row's {a['allocated_bytes']}")  # fmt: skip
        out.append({"source": "grid", "family": r["family"], "origin": r["origin"],
                    "job": r["job"], "batch": r["batch"], "seq": r["seq"],
                    "new_tokens": r.get("new_tokens") or 0, "grid_commit": r.get("commit"),
                    **({"image_size": r["image_size"]} if r.get("image_size") else {}),
                    "analytic": {"allocated_bytes": est.peak_allocated_bytes,
                                 "components": {k: v for k, v in est.components.items() if v}},
                    "trace": {"allocated_bytes": t["allocated_bytes"],
                              "reserved_bytes": t["reserved_bytes"]}})  # fmt: skip
    return out


def timeline(name: str, batch: int, seq: int, new: int) -> dict[str, int]:
    """The trace's reserved bytes of a bundled model's job at the end of its prefill and at
    the end (its allocation events replayed through the allocator model up to each phase
    mark): how much of the reserved peak the decode's cache growth adds (``--timeline``)."""
    from memfit.estimate.allocator.caching import simulate
    from memfit.estimate.trace import build
    from memfit.estimate.trace import engine as trace_engine
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    config = resolve_model(name).config
    w = WorkloadSpec(mode="infer", precision="bf16-true", batch_size=batch, seq_len=seq,
                     new_tokens=new)  # fmt: skip
    w, _notes = trace_engine.prepare_workload(config, w)
    stacks = build.layer_plan(config, False)
    counts = {v.name: v.count for v in stacks}
    sink: list[Any] = []
    task = build.resolve_task(config, w.task)
    trace_engine._trace_once(config, w, task, stacks, counts, False, gpu=None, sink=sink)
    events, marks = sink
    at = dict(marks)
    return {
        "prefill_end_reserved_bytes": simulate(events[: at["decode"]]).peak_reserved_bytes,
        "end_reserved_bytes": simulate(events).peak_reserved_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="measure only this bundled config's jobs")
    p.add_argument("--grid", action="store_true", help="add the fast-path grid's inference rows")
    p.add_argument("--fit", action="store_true", help="print the fitted rules and every row")
    p.add_argument("--judge", action="store_true",
                   help="judge the grid's inference variant rows by the fit as it is")  # fmt: skip
    p.add_argument("--judge-moe", action="store_true",
                   help="judge the MoE families' recorded grid rows likewise")  # fmt: skip
    p.add_argument(
        "--timeline",
        nargs=4,
        metavar=("MODEL", "BATCH", "SEQ", "NEW"),
        help="the trace's reserved bytes at the prefill's end and at the end",
    )
    args = p.parse_args(argv)
    if args.timeline:
        name, *sizes = args.timeline
        print(json.dumps(timeline(name, *map(int, sizes))))
        return 0
    done = set()
    if OUT.exists():
        # a grid row counts as done at the analytic bytes it was recorded with: a grid row the
        # grid re-ran (the engine moved) is recorded again
        done = {(_key(r), (r.get("analytic") or {}).get("allocated_bytes")) for r in _rows()}
    if args.fit:
        pts = all_points()
        result = fit(pts)
        print(json.dumps(result))
        shown, top = result["shown"], result["top"]
        for pt in pts:
            m = pt.measured_reserved_bytes
            print(f"{pt.label}: measured {m / MIB:.0f} MiB, shown "
                  f"{100 * (infer_bytes(pt.parts, shown) / m - 1):+.2f} %, top "
                  f"{100 * (infer_bytes(pt.parts, top) / m - 1):+.2f} %")  # fmt: skip
        return 0
    if args.judge or args.judge_moe:
        judged = judge(variant_rows() if args.judge else moe_rows())
        for j in judged:
            print(f"{j['label']}: trace {j['trace_reserved_bytes'] / MIB:.2f} MiB, shown "
                  f"{100 * j['shown_err']:+.2f} %, top {100 * j['top_err']:+.2f} %"
                  f"{'' if j['holds'] else '  FAILS'}")  # fmt: skip
        fails = sum(1 for j in judged if not j["holds"])
        print(f"{len(judged)} rows, {fails} fail; shown "
              f"{100 * min(j['shown_err'] for j in judged):+.2f} % .. "
              f"{100 * max(j['shown_err'] for j in judged):+.2f} %, top "
              f"{100 * min(j['top_err'] for j in judged):+.2f} % .. "
              f"{100 * max(j['top_err'] for j in judged):+.2f} %")  # fmt: skip
        return 0
    if args.grid:
        with open(OUT, "a", encoding="utf-8") as f:
            for row in grid_rows():
                if (_key(row), row["analytic"]["allocated_bytes"]) not in done:
                    f.write(json.dumps(row, sort_keys=True) + "\n")
        return 0
    measured = {key for key, _ in done}
    for job in JOBS:
        if job in measured or (args.only and job[0] != args.only):
            continue
        row = measure(*job)
        with open(OUT, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        print(f"{job}: trace {row['trace_ratio']} ({row['trace']['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
