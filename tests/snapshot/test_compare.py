"""`memfit snapshot MEASURED --predicted PRED`: two snapshots side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.snapshot.compare import ComparedMetric, compare_snapshots


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("torch")
    from memfit.snapshot.generate import snapshot_from_cpu_step, write_pickle

    d = tmp_path_factory.mktemp("snaps")
    small = write_pickle(snapshot_from_cpu_step(batch=16, hidden=128), d / "small.pickle")
    big = write_pickle(snapshot_from_cpu_step(batch=64, hidden=128), d / "big.pickle")
    return small, big


def test_the_error_is_predicted_minus_measured_over_measured() -> None:
    assert ComparedMetric(name="x", predicted=90, measured=100).error == pytest.approx(-0.1)
    assert ComparedMetric(name="x", predicted=90, measured=0).error is None


def test_compare_lines_up_the_peaks_of_both(two) -> None:
    small, big = two
    c = compare_snapshots(small, big)
    peak = next(m for m in c.metrics if m.name == "trace peak allocated bytes")
    assert peak.predicted == c.predicted.devices[0].peak_allocated_bytes
    assert peak.measured == c.measured.devices[0].peak_allocated_bytes
    assert peak.error is not None and peak.error < 0  # the smaller batch peaks lower


def test_the_cli_prints_the_comparison_and_its_json(two, capsys) -> None:
    small, big = two
    assert main(["snapshot", str(big), "--predicted", str(small)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"memfit snapshot: predicted {small} vs measured {big}")
    assert "trace peak allocated bytes" in text
    assert main(["snapshot", str(big), "--predicted", str(small), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in body["metrics"]][:2] == [
        "trace peak allocated bytes",
        "trace peak reserved bytes",
    ]
