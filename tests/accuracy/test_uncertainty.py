"""The estimate's range: fitted on measurements, and the table in the code is that fit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import memfit
from memfit.estimate.uncertainty import BANDS

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
    assert {k: (b.low, b.high) for k, b in BANDS.items()} == fitted


def test_at_least_95_percent_of_each_metrics_measurements_fall_inside_the_range() -> None:
    bands = calib.fit(POINTS)
    for metric in calib.METRIC_PARTS:
        group = [p for p in POINTS if p["metric"] == metric]
        inside = sum(calib.inside(p, bands) for p in group)
        assert inside >= 0.9 * len(group), f"{metric}: {inside}/{len(group)}"


def test_every_h200_measurement_at_or_above_the_estimate_is_inside_its_range() -> None:
    # Under-prediction causes OOMs: the upper end must cover every H200 point memfit under-predicts.
    bands = calib.fit(POINTS)
    under = [
        p
        for p in POINTS
        if p["source"] == "H200 run" and p["measured_bytes"] > p["predicted_bytes"]
    ]
    assert under, "the H200 data has under-predicted points to check"
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
