"""``engine="auto"``: trace where torch can build the model, analytic otherwise, and it says so."""

from __future__ import annotations

import importlib.util

import pytest

import memfit
from memfit.errors import MissingDependencyError


def test_auto_uses_the_trace_engine_when_torch_and_transformers_are_installed() -> None:
    # fp32 inference: a job the fast-path grid does not run (bf16 and fp16 inference of gpt2
    # it validates, and the analytic engine answers them: tests/estimate/test_fastpath.py)
    w = memfit.WorkloadSpec(mode="infer", seq_len=32, precision="32-true")
    est = memfit.estimate("gpt2", w)
    assert est.engine == "trace"


def test_auto_falls_back_to_analytic_without_transformers_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else real(name, *a),
    )
    w = memfit.WorkloadSpec(mode="infer", seq_len=32, precision="32-true")  # not validated
    est = memfit.estimate("gpt2", w)
    assert est.engine == "analytic"
    assert est.notes[0] == "engine auto: transformers is not installed; used analytic"
    with pytest.raises(MissingDependencyError, match=r"transformers is not installed.*--engine"):
        memfit.estimate("gpt2", memfit.WorkloadSpec(mode="infer"), engine="trace")
