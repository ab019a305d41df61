"""`memfit estimate --engine trace --snapshot`: the predicted allocation history, in torch's
snapshot format, agrees with the estimate it came from and is read by torch's own tools."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from memfit.cli import main
from memfit.errors import SpecError
from memfit.snapshot import analyze_snapshot, load_snapshot
from memfit.snapshot.predicted import pick

TINY = dict(
    model_type="gpt2",
    architectures=["GPT2LMHeadModel"],
    n_embd=64,
    n_layer=2,
    n_head=4,
    vocab_size=300,
    n_positions=256,
)


@pytest.fixture(scope="module")
def predicted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps(TINY))
    path = folder / "predicted.pickle"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            ["estimate", str(folder), "--engine", "trace", "--precision", "bf16", "--seq", "64",
             "--snapshot", str(path), "--json"]
        )  # fmt: skip
    assert code == 0, err.getvalue()
    assert f"wrote {path}" in err.getvalue()
    return path, json.loads(out.getvalue())  # stdout stays the JSON answer alone


def test_the_predicted_history_peaks_where_the_estimate_says(predicted) -> None:
    path, est = predicted
    device = analyze_snapshot(path).devices[0]
    assert device.peak_allocated_bytes == est["peak_allocated_bytes"]
    assert device.peak_reserved_bytes == est["peak_reserved_bytes"]
    assert set(device.actions) == {"segment_alloc", "alloc", "free_requested", "free_completed"}


def test_the_predicted_snapshot_is_torchs_format(predicted) -> None:
    from torch.cuda import _memory_viz

    path, _ = predicted
    snapshot = load_snapshot(path)  # memfit's reader, which refuses any class or function
    assert set(snapshot) >= {"segments", "device_traces"}
    with path.open("rb") as f:
        raw = pickle.load(f)  # our own file, written by this test
    assert "segments:" in _memory_viz.segsum(raw)
    assert "<html" in _memory_viz.trace_plot(raw).lower()  # the page memory_viz draws


def test_each_allocation_names_its_module_and_component(predicted) -> None:
    path, _ = predicted
    frames = [
        e["frames"][0]
        for e in load_snapshot(path)["device_traces"][0]
        if e["action"] == "alloc" and e["frames"]
    ]
    names = {f["name"] for f in frames}
    files = {f["filename"] for f in frames}
    assert "parameters (born in init)" in names and "cuBLAS workspace" in names
    assert any(f.endswith("mlp.c_fc") for f in files)


def test_the_analytic_engine_has_no_history(tmp_path: Path, capsys) -> None:
    code = main(
        ["estimate", "gpt2", "--engine", "analytic", "--snapshot", str(tmp_path / "x.pickle")]
    )
    assert code == 2 and not (tmp_path / "x.pickle").exists()
    assert "the analytic engine runs no model and records none: pass --engine trace" in (
        capsys.readouterr().err
    )
    with pytest.raises(SpecError, match=r"the analytic engine answered, which runs no model"):
        pick([], "analytic")
