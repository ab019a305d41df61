"""An inference job's reserved bytes: parameters, the KV cache and the rest of the peak apart
(issue 32).

``analytic/reserved.py``'s ``INFER_RESERVED`` is fitted by ``benchmarks/infer_reserved.py`` to
the rows of ``benchmarks/results/infer_reserved.jsonl`` (serving-size traces, KV-heavy ones
among them, the fast-path grid's inference rows) and the H200 inference measurements; these
tests refit it, and hold the answer shown within 2 % under, and the band's top over, every one
of those rows, and the KV-heavy jobs' answers near the trace's.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

import memfit
from memfit.estimate import fastpath
from memfit.estimate.analytic.reserved import (
    INFER_BAND_ROWS,
    INFER_RESERVED,
    MIN_SEGMENTS_BYTES,
    InferParts,
    class_band,
    infer_rule,
    reserved_rule,
)
from memfit.estimate.policy import run_engine
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks import infer_reserved as bench  # noqa: E402
from benchmarks.fastpath_grid import (  # noqa: E402
    JOBS,
    JUDGED_AS,
    _latest,
    default_answer,
    model_type_of,
)

POINTS = bench.all_points()


def test_the_fit_is_the_one_the_rows_give() -> None:
    result = bench.fit(POINTS)
    assert (tuple(result["shown"]), tuple(result["top"])) == (
        INFER_RESERVED["shown"],
        INFER_RESERVED["top"],
    )
    assert (result["n_rows"], result["n_large_rows"], result["worst"]) == INFER_BAND_ROWS
    assert result["fixed_bytes"] == MIN_SEGMENTS_BYTES
    # serving-size traces at real width, the grid's 60 inference rows, the two H200 cases
    assert sum(1 for p in POINTS if p.label.endswith("(H200)")) == 2
    assert sum(1 for p in POINTS if "depth" in p.label) >= 32
    assert len(KV_HEAVY) >= 12


#: The KV-heavy serving jobs (benchmarks/infer_reserved.py JOBS after the first 20, helper
#: "kvinfer"): gpt2, qwen3-0.6b, llama-3.2-1b at full depth, the cache 32-91 % of the analytic
#: peak, 128-2048 new tokens.
KV_HEAVY_JOBS = {f"{m} (depth full, {b} x {s} + {n})" for m, _d, b, s, n in bench.JOBS[20:]}
KV_HEAVY = [p for p in POINTS if p.label in KV_HEAVY_JOBS]


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.label)
def test_the_band_is_never_under_a_recorded_row(point: bench.Point) -> None:
    band = class_band("infer")
    assert band is not None
    top = band.top_bytes(point.allocated_bytes, point.parts)
    assert top >= point.covered_bytes >= point.measured_reserved_bytes
    rule_top, _range = infer_rule(point.parts, band=True).at(point.allocated_bytes)
    assert rule_top == top  # the rule the engine applies is the band the test holds


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.label)
def test_the_answer_shown_is_at_most_2_percent_under_a_recorded_row(point: bench.Point) -> None:
    shown, rng = infer_rule(point.parts, band=False).at(point.allocated_bytes)
    assert shown >= point.measured_reserved_bytes * (1 - fastpath.TOLERANCE)
    assert rng is not None and rng[0] <= shown <= rng[1]


def test_the_grids_validated_inference_rows_shown_within_the_tolerance() -> None:
    """What ``fastpath_grid.default_answer`` shows (the engine's rule, the row's parameters'
    share from infer_reserved.jsonl) on every inference row of a model type the fast path
    answers: no more than 2 % under the trace (it was -21.4 % on tiny bloom, -16.2 % on
    vit-base cut to 2 layers, -7.6 % on phi-4 with allocated x 1.082)."""
    rows = [json.loads(x) for x in (ROOT / "benchmarks/results/fastpath_grid.jsonl").open()]
    checked = 0
    for r in _latest(rows):
        if JOBS.get(r["job"], {}).get("mode") != "infer":
            continue
        if JUDGED_AS.get(r["job"], r["job"]) not in fastpath.VALIDATED.get(model_type_of(r), ()):
            continue
        d = default_answer(r)
        assert d is not None
        assert d["reserved_bytes"] >= r["trace"]["reserved_bytes"] * (1 - fastpath.TOLERANCE), r
        checked += 1
    assert checked >= 30


def test_the_engine_applies_the_rule_to_its_parameters_share() -> None:
    w = WorkloadSpec(mode="infer", precision="bf16-true", batch_size=8, seq_len=2048, new_tokens=64)
    source = resolve_model("qwen3-0.6b")
    shown = run_engine("analytic", source, w, None)
    parts = InferParts.of({k: p.components for k, p in shown.phases.items()})
    assert parts.prompt_kv_bytes and parts.grown_kv_bytes > parts.prompt_kv_bytes
    # the estimate's phases carry the cuBLAS workspaces the engine's rule adds after it: the
    # same bytes up to the rounding of each product (a few bytes)
    at = infer_rule(parts, band=False).at(shown.peak_allocated_bytes)[0]
    assert abs(shown.peak_reserved_bytes - at) <= 4
    band = run_engine("analytic", source, w, None, reserved_end="band")
    top = class_band("infer")
    assert top is not None
    assert abs(band.peak_reserved_bytes - top.top_bytes(band.peak_allocated_bytes, parts)) <= 4
    assert "parameters x 1.050 + its KV cache x 1.010" in band.trace["reserved_band"]


def test_training_ignores_the_parameters_share() -> None:
    assert reserved_rule(training=True, held_bytes=10**9) == reserved_rule(training=True)
    wide = reserved_rule(training=False, end="high", held_bytes=10**9)
    assert wide == reserved_rule(training=False, end="high")  # the wide band as it was


def test_an_8b_inference_estimate_on_an_l4_settles_without_the_trace() -> None:
    """The band's top (parameters x 1.050 + the KV cache x 1.010 + the rest x 1.492 + 22 MiB)
    leaves the verdict "fits" at L4's capacity; the wide band (allocated x 1.303 + 22 MiB) left
    it "tight"."""
    est = memfit.estimate("llama-3.1-8b", WorkloadSpec(mode="infer"), gpu="L4")
    assert (est.engine, est.confirmed, est.fits.verdict) == ("analytic", False, "fits")


def _shown_error(point: bench.Point, fit: tuple[float, ...]) -> float:
    """The answer shown by ``fit`` on ``point``, relative to its measured reserved bytes."""
    from memfit.estimate.analytic.reserved import InferFit, infer_bytes

    return infer_bytes(point.parts, InferFit(*fit)) / point.measured_reserved_bytes - 1


#: The rule before the KV cache was taken apart (parameters x 1.005 + the rest of the peak x
#: 1.447 + 22 MiB, the cache among the rest): as an InferFit, the cache at the rest's ratio.
OLD_SHOWN = (1.005, 1.447, 1.447, 0.0, 1.447)


def test_gpt2_at_150_x_1024_tokens_is_shown_within_10_percent_of_the_trace() -> None:
    """The lead's case (docs/accuracy.md, "Known over-prediction of the inference rule"):
    gpt2, 150 requests of 768 + 256 tokens, KV cache 3.96 GiB of a 7.82 GiB prefill peak; the
    trace reserves 8.70 GiB (x 1.113). The rule with the cache among the rest showed 11.24 GiB
    (+29 %); the cache apart, +9.3 %, and +10.8 % since the refit of helper "fp16rest" (96
    rows: falcon-7b's two bf16 rows added, 7 rows moved by the multi-query fix; the fit's
    least-mean-over-prediction choice now takes a prompt KV ratio of 1.03), so 11 %."""
    (point,) = [p for p in POINTS if p.label == "gpt2 (depth full, 150 x 768 + 256)"]
    assert _shown_error(point, OLD_SHOWN) > 0.28  # the old rule, on the same parts
    w = WorkloadSpec(mode="infer", precision="bf16-true", batch_size=150, seq_len=768,
                     new_tokens=256)  # fmt: skip
    est = run_engine("analytic", resolve_model("gpt2"), w, None)
    error = est.peak_reserved_bytes / point.measured_reserved_bytes - 1
    assert -fastpath.TOLERANCE <= error <= 0.11


@pytest.mark.parametrize("point", KV_HEAVY, ids=lambda p: p.label)
def test_a_kv_heavy_job_is_shown_at_most_16_percent_over_the_trace(point: bench.Point) -> None:
    """Each KV-heavy serving job (12: gpt2, qwen3-0.6b, llama-3.2-1b at 16-256 requests of
    up to 5120 tokens, up to 2048 new): the answer shown -2 % ... +16 % of the trace; the rule
    with the cache among the rest reached +29 % (gpt2) and +16 % (llama-3.2-1b at 64 x 2048)."""
    assert -fastpath.TOLERANCE <= _shown_error(point, INFER_RESERVED["shown"]) <= 0.16


def test_the_old_rule_was_further_over_on_the_kv_heavy_jobs() -> None:
    """The mean over-prediction of the answer shown on the KV-heavy jobs: the old rule's more
    than twice the new one's (measured: +14.4 % against +5.6 %)."""
    old = sum(_shown_error(p, OLD_SHOWN) for p in KV_HEAVY) / len(KV_HEAVY)
    new = sum(_shown_error(p, INFER_RESERVED["shown"]) for p in KV_HEAVY) / len(KV_HEAVY)
    assert old > 2 * new > 0


def test_each_part_takes_its_own_ratio() -> None:
    """The rule by hand (``INFER_RESERVED["shown"]``): an encoder's forward (no cache) is
    parameters x h + the rest x r + 22 MiB; a prefill's cache is charged k, not the rest's r;
    a decode whose grown cache outweighs the prefill's activations takes the decode's sum."""
    from memfit.estimate.analytic.reserved import infer_bytes

    fit = INFER_RESERVED["shown"]
    gib = 2**30
    encoder = InferParts.of({"forward": {"parameters": gib, "activations": gib}})
    assert encoder.decode_bytes == encoder.prompt_kv_bytes == 0
    assert infer_bytes(encoder, fit) == (
        gib + int(gib * (fit.held_ratio - 1)) + MIN_SEGMENTS_BYTES + int(gib * fit.ratio)
    )
    prefill = {"parameters": gib, "kv_cache": 4 * gib, "activations": 4 * gib}
    short = InferParts.of({"prefill": prefill, "decode": {"parameters": gib, "kv_cache": 4 * gib}})
    base = gib + int(gib * (fit.held_ratio - 1)) + MIN_SEGMENTS_BYTES
    assert infer_bytes(short, fit) == base + int(4 * gib * fit.kv_ratio) + int(4 * gib * fit.ratio)
    grown = {"parameters": gib, "kv_cache": 12 * gib}
    long = InferParts.of({"prefill": prefill, "decode": grown})
    cache = int(4 * gib * fit.prompt_kv_ratio) + int(12 * gib * fit.grown_kv_ratio)
    assert (long.peak_bytes, long.grown_kv_bytes) == (13 * gib, 12 * gib)
    assert infer_bytes(long, fit) == base + cache > infer_bytes(short, fit)


# -- the grid's inference variants (eager / flash attention, another image size), judged by the
# fit as it is: their rows' parts recorded (benchmarks/infer_reserved.py --grid), never fitted to

GRID_ROWS = [json.loads(x) for x in (ROOT / "benchmarks/results/fastpath_grid.jsonl").open()]
VARIANTS = bench.variant_rows()


def test_the_variant_rows_are_recorded_but_not_fitted_to() -> None:
    """Every variant row of the grid both engines answered has its parts recorded (167 rows:
    41 model types or bundled configs x eager / flash at both sizes, 3 image-size rows), and
    none of them is among the fit's rows (INFER_BAND_ROWS: 96, the fit's own)."""
    assert len(VARIANTS) >= 167
    assert {r["job"] for r in VARIANTS} == set(bench.VARIANT_JOBS)
    assert all(r.get("image_size") for r in VARIANTS if r["job"] == "infer_img")
    fitted = {p.label for p in POINTS}
    assert not any(f"{r['family']} ({r['origin']}, {r['job']})" in fitted for r in VARIANTS)


def test_the_pending_inference_variants_are_what_the_rows_say() -> None:
    """``fastpath.INFER_VARIANTS_PENDING`` is the set of (model_type, job) with a variant row the
    fit does not hold; gemma2's eager and flash jobs are in it (gemma-2-2b at 20 x 512 + 16)
    and no variant job of a pending pair is answered by the analytic engine."""
    from benchmarks.fastpath_grid import infer_pending_table

    assert infer_pending_table(GRID_ROWS) == fastpath.INFER_VARIANTS_PENDING
    assert {("gemma2", "infer_eager"), ("gemma2", "infer_flash")} <= fastpath.INFER_VARIANTS_PENDING
    for model_type, job in fastpath.INFER_VARIANTS_PENDING:
        assert job not in fastpath.VALIDATED.get(model_type, ())
        assert job not in fastpath.SETTLES.get(model_type, ())
    assert "infer_eager" in fastpath.VALIDATED["llama"] and "infer_img" in fastpath.VALIDATED["vit"]


def test_gemma_2_2b_at_serving_size_is_under_the_fitted_rule() -> None:
    """The rows that keep gemma2's variants pending: the trace reserves 1.223 x its allocated
    bytes; the answer shown is 2.60 % under, the band's top 0.55 % under."""
    rows = [r for r in VARIANTS if (r["family"], r["job"][:10]) == ("gemma-2-2b", "infer_long")]
    rows = [r for r in rows if "fp16" not in r["job"]]  # bf16's (fp16's: the fp16infer test)
    judged = bench.judge(rows)
    assert len(judged) == 2 and not any(j["holds"] for j in judged)
    for j in judged:
        assert -0.027 < j["shown_err"] < -0.025 and -0.006 < j["top_err"] < -0.005


def test_a_validated_variant_row_is_under_the_band_top() -> None:
    """On every variant row of a (model_type, job) the fast path answers, the inference band's
    top (the parameters and the KV cache apart, ``class_band("infer")``) covers the trace's
    reserved bytes (plus any analytic excess of allocated bytes), and the answer shown is at
    most 2 % under them."""
    band = class_band("infer")
    assert band is not None
    checked = 0
    for r, p in zip(VARIANTS, bench.trace_points(VARIANTS), strict=True):
        if JUDGED_AS.get(r["job"], r["job"]) not in fastpath.VALIDATED.get(model_type_of(r), ()):
            continue
        assert band.top_bytes(p.allocated_bytes, p.parts) >= p.covered_bytes, p.label
        shown, _rng = infer_rule(p.parts, band=False).at(p.allocated_bytes)
        assert shown >= p.measured_reserved_bytes * (1 - fastpath.TOLERANCE), p.label
        checked += 1
    assert checked >= 140  # 143 of the 167 rows (the rest: gemma2, allocated bytes off)


#: fp16 inference (a T4 / V100's ``16-true``; helper "fp16infer") and its variants.
FP16_INFER_JOBS = tuple(j for j in bench.VARIANT_JOBS if "fp16" in j)


def test_fp16_inference_settles_on_the_inference_fit_as_bf16_does() -> None:
    """``infer_fp16``'s band is the inference fit (parameters, KV cache and the rest apart),
    not the grid's short decodes nor the wide band: the same rule as ``infer``, under its own
    name; the fp16 variants (eager, flash, image size) keep the wide band as bf16's do."""
    bf16, fp16 = class_band("infer"), class_band("infer_fp16")
    assert bf16 is not None and fp16 is not None
    assert fp16.job == "infer_fp16" and fp16.held_ratio is not None
    assert dataclasses.replace(fp16, job="infer") == bf16
    for job in ("infer_fp16_eager", "infer_fp16_flash", "infer_fp16_img"):
        assert class_band(job) is None


def test_the_fp16_inference_rows_are_judged_by_the_fit_not_fitted_to() -> None:
    """Every fp16 inference grid job has rows recorded (tiny configs and bundled configs cut to
    2 layers, both sizes), judged by the fit as it is: on each row of a (model_type, job) the
    fast path answers, the band's top covers the trace and the answer shown is at most 2 %
    under it (test_a_validated_variant_row_is_under_the_band_top holds them all); a pair with a
    row the fit does not hold is pending (gemma2: gemma-2-2b at 20 x 512 + 16, as in bf16)."""
    rows = [r for r in VARIANTS if r["job"] in FP16_INFER_JOBS]
    assert {r["job"] for r in rows} == set(FP16_INFER_JOBS)
    assert sum(1 for r in rows if r["origin"].startswith("bundled-")) >= 60
    judged = bench.judge(rows)
    failing = {(model_type_of(r), JUDGED_AS.get(r["job"], r["job"]))
               for r, j in zip(rows, judged, strict=True) if not j["holds"]}  # fmt: skip
    assert failing and failing <= fastpath.INFER_VARIANTS_PENDING
    assert ("gemma2", "infer_fp16") in failing
    assert "infer_fp16" in fastpath.VALIDATED["llama"] and "infer_fp16" in fastpath.SETTLES["llama"]
