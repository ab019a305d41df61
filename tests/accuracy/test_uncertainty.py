"""The estimate's range: fitted on measurements, and the table in the code is that fit."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

import memfit
from memfit.estimate.uncertainty import DEFAULT_PATH, MIN_POINTS, PARTS, PATHS, PER_RANK, ranges
from memfit.report.text import render_estimate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import calibrate_uncertainty as calib  # noqa: E402


@pytest.fixture
def tiny_llama_dir(tmp_path: Path, tiny_llama: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama))
    return tmp_path


POINTS = [
    json.loads(x)
    for x in (ROOT / "benchmarks/results/uncertainty_points.jsonl").read_text().splitlines()
]


def test_the_band_table_is_the_fit_of_the_committed_measurements() -> None:
    fitted = calib.fit(POINTS)
    table = {
        path: {part: (b.low, b.high) for part, b in band.parts.items()}
        for path, band in PATHS.items()
    }
    assert table == fitted
    counts = calib.evidence(POINTS)
    for path, band in PATHS.items():
        assert band.n_points == sum(p["path"] == path for p in POINTS), path
        too_few = tuple(part for part in PARTS if counts[path][part] < MIN_POINTS)
        assert band.fallback == too_few, path


def test_every_committed_point_belongs_to_a_path_with_its_own_dynamic_band() -> None:
    counts = calib.evidence(POINTS)
    assert {p["path"] for p in POINTS} == set(PATHS)
    assert all(counts[path]["dynamic"] >= MIN_POINTS for path in PATHS)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_at_least_95_percent_of_each_paths_measurements_fall_inside_its_range(path: str) -> None:
    bands = calib.fit(POINTS)
    for metric in calib.METRIC_PARTS:
        group = [p for p in POINTS if p["metric"] == metric and p["path"] == path]
        inside = sum(calib.inside(p, bands) for p in group)
        assert inside >= 0.9 * len(group), f"{path} {metric}: {inside}/{len(group)}"


def test_every_current_stack_measurement_at_or_above_the_estimate_is_inside_its_range() -> None:
    # Under-prediction causes OOMs: the upper end must cover every point memfit under-predicts on
    # the path its default job takes (the H200 runs and the LlamaMLP blocks).
    bands = calib.fit(POINTS)
    under = [
        p
        for p in POINTS
        if p["path"] == DEFAULT_PATH and p["measured_bytes"] > p["predicted_bytes"]
    ]
    assert under, "the current-stack data has under-predicted points to check"
    assert all(calib.inside(p, bands) for p in under)


def test_weights_only_inference_has_a_tight_range_and_training_a_wider_one() -> None:
    infer = memfit.estimate("llama-3.2-1b", memfit.WorkloadSpec(mode="infer", seq_len=16))
    train = memfit.estimate("llama-3.2-1b", memfit.WorkloadSpec(seq_len=256))
    for est in (infer, train):
        for metric, (low, high) in est.ranges.items():
            assert low <= getattr(est, metric) <= high, metric

    def width(est: memfit.MemoryEstimate) -> float:
        low, high = est.ranges["peak_allocated_bytes"]
        return (high - low) / est.peak_allocated_bytes

    assert width(infer) < 0.03
    assert width(train) > 2 * width(infer)


def test_the_json_reports_low_and_high_for_each_metric(tiny_llama_dir: Path) -> None:
    data = memfit.estimate(str(tiny_llama_dir), memfit.WorkloadSpec(seq_len=64)).to_json()
    for metric in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes"):
        assert data[f"{metric}_low"] <= data[metric] <= data[f"{metric}_high"]


@pytest.mark.parametrize("engine", ["analytic"])
def test_the_analytic_engine_range_is_wider_than_the_trace_range(
    tiny_llama_dir: Path, engine: str
) -> None:
    pytest.importorskip("memfit.estimate.analytic")
    wl = memfit.WorkloadSpec(seq_len=64)
    trace = memfit.estimate(str(tiny_llama_dir), wl, engine="trace")
    other = memfit.estimate(str(tiny_llama_dir), wl, engine=engine)
    t_low, t_high = trace.ranges["peak_allocated_bytes"]
    a_low, a_high = other.ranges["peak_allocated_bytes"]
    assert (a_high - a_low) / other.peak_allocated_bytes > (
        t_high - t_low
    ) / trace.peak_allocated_bytes


def test_the_device_range_covers_the_reserved_range_plus_the_context() -> None:
    est = memfit.estimate(
        "llama-3.1-8b",
        memfit.WorkloadSpec(seq_len=4096, precision="amp-bf16", checkpointing="full"),
        engine="analytic",
        gpu="A100-80GB",
    )
    context = est.device_used_bytes - est.peak_reserved_bytes
    res_low, res_high = est.ranges["peak_reserved_bytes"]
    dev_low, dev_high = est.ranges["device_used_bytes"]
    assert dev_high >= res_high + context and dev_low <= res_low + context


def _est(**changes: object) -> memfit.MemoryEstimate:
    base = memfit.estimate(
        "llama-3.2-1b", memfit.WorkloadSpec(seq_len=256), engine="analytic", gpu="L4"
    )
    return dataclasses.replace(base, ranges={}, **changes)  # the band's range alone


def test_the_default_hugging_face_job_carries_the_current_stack_band() -> None:
    est = _est()
    assert est.band.path == "current-hf"
    data = est.to_json()
    assert data["band"]["path"] == "current-hf" and data["band"]["n_points"] > 0
    assert "range: current Hugging Face stack band (" in render_estimate(est)


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"workload": {"quant": "nf4", "shard": "none"}}, "current-hf"),
        ({"workload": {"quant": "none", "shard": "zero3"}}, "other-framework"),
        ({"workload": {"quant": "none", "shard": "fsdp"}}, "current-hf"),
        ({"trace": {"framework": "litgpt"}}, "other-framework"),
        ({"environment": {"torch": "2.4.1+cu121", "transformers": "5.23.0"}}, "old-stack"),
        ({"environment": {"torch": "2.8.0", "transformers": "4.57.1"}}, "current-hf"),
        ({"environment": {"torch": "2.13.0+cpu", "transformers": "5.23.0"}}, "current-hf"),
        ({"band_path": "other-framework"}, "other-framework"),
    ],
)
def test_the_band_follows_the_code_path_the_estimate_says_runs_the_job(
    changes: dict[str, object], path: str
) -> None:
    est = _est(**changes)
    assert est.band.path == path
    assert est.ranges == ranges(est, path)


def test_a_wider_path_widens_the_upper_end_of_the_same_estimate() -> None:
    hf = _est()
    other = _est(band_path="other-framework")
    for metric in ("peak_allocated_bytes", "device_used_bytes"):
        assert other.ranges[metric][1] > hf.ranges[metric][1], metric


def test_an_unknown_band_path_is_refused() -> None:
    with pytest.raises(ValueError, match="band_path .'nope'. must be one of current-hf"):
        _est(band_path="nope")


def test_a_caller_that_knows_the_job_runs_another_framework_widens_its_range_and_verdict() -> None:
    # a LitGPT / torchtune file answered through transformers' model (memfit check, framework
    # not installed): the estimate is transformers', the job runs the framework's code
    wl = memfit.WorkloadSpec(seq_len=2048, batch_size=4)
    est = memfit.estimate("llama-3.2-1b", wl, engine="analytic", gpu="L4")
    assert est.fits is not None
    # the band's range alone (the analytic engine's own reserved range can set the upper end)
    est = dataclasses.replace(est, ranges={}, fits=dataclasses.replace(est.fits, verdict=None))
    other = est.with_band("other-framework")
    assert (est.band.path, other.band.path) == ("current-hf", "other-framework")
    assert other.to_json()["band"]["path"] == "other-framework"
    for metric, (low, high) in est.ranges.items():
        o_low, o_high = other.ranges[metric]
        assert o_low <= low and o_high >= high, metric
    assert other.ranges["peak_allocated_bytes"][1] > est.ranges["peak_allocated_bytes"][1]
    assert est.verdict is not None and other.verdict is not None
    assert other.verdict.need_bytes == other.ranges["device_used_bytes"][1]  # judged again
    assert other.verdict.need_bytes > est.verdict.need_bytes


# ---------------------------------------------------------------- the per-rank closed form's band
PER_RANK_POINTS = [p for p in POINTS if p["path"] == PER_RANK]
METRIC_ATTR = {
    "allocated": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "device": "device_used_bytes",
}


def test_the_per_rank_closed_form_has_a_band_of_its_own_fitted_on_its_published_points() -> None:
    band = PATHS[PER_RANK]
    assert band.fallback == () and len(PER_RANK_POINTS) >= MIN_POINTS
    # one fraction of the whole figure: the same band on every part
    assert len({(b.low, b.high) for b in band.parts.values()}) == 1
    fitted = calib.whole_figure_band(PER_RANK_POINTS)
    assert {part: (b.low, b.high) for part, b in band.parts.items()} == dict.fromkeys(PARTS, fitted)
    # no wider than the evidence: each end is the worst miss on its side, rounded up one step
    ratios = [p["measured_bytes"] / p["predicted_bytes"] for p in PER_RANK_POINTS]
    low, high = fitted
    assert max(ratios) - 1 <= high < max(ratios) - 1 + calib.STEP
    assert 1 - min(ratios) <= low < 1 - min(ratios) + calib.STEP


def test_the_committed_per_rank_points_are_what_the_closed_form_answers_now() -> None:
    # a change to the closed form that moves a published point must refit the band
    # (benchmarks/calibrate_uncertainty.py --refresh-closed-form)
    live = calib.closed_form_points()
    keys = ("name", "metric", "measured_bytes", "predicted_bytes", "parts", "path")
    assert [{k: p[k] for k in keys} for p in live] == [
        {k: p[k] for k in keys} for p in PER_RANK_POINTS
    ]


def test_every_published_per_rank_point_is_inside_the_range_its_estimate_carries() -> None:
    estimates = calib.closed_form_estimates()
    assert len(estimates) == len(PER_RANK_POINTS)
    outside = []
    for name, row, est in estimates:
        assert est.band.path == PER_RANK, name
        low, high = est.ranges[METRIC_ATTR[row["metric"]]]
        measured = round(row["measured_gib"] * 2**30)
        if not low <= measured <= high:
            outside.append(f"{name}: {measured / 2**30:.1f} GiB not in [{low / 2**30:.1f}, "
                           f"{high / 2**30:.1f}]")  # fmt: skip
    assert not outside, outside


def test_the_70b_sequence_parallel_estimate_upper_end_is_within_the_evidence() -> None:
    # docs/distributed.md's gap: the other-framework band put this job's allocated upper end
    # at +72 % of the estimate
    wl = memfit.WorkloadSpec(
        gpus=64, tp=8, sequence_parallel=True, shard="fsdp", seq_len=8192
    )  # fmt: skip
    est = memfit.estimate("llama-3.1-70b", wl, gpu="H100")
    assert est.engine.startswith("analytic (closed form: parallel)")
    assert est.band.path == PER_RANK
    worst_under = max(p["measured_bytes"] / p["predicted_bytes"] - 1 for p in PER_RANK_POINTS)
    for metric in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes"):
        value = getattr(est, metric)
        low, high = est.ranges[metric]
        assert value * (1 + worst_under) <= high <= value * (1 + worst_under + calib.STEP) + 1
        assert high < 1.2 * value and low < value, metric
