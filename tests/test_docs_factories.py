"""docs/factories.md's worked example runs as the page says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def test_the_documented_factory_example_estimates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    code = main(
        [
            "estimate",
            "tiny_cnn:make",
            "--allow-code",
            "--batch",
            "8",
            "--precision",
            "fp32",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["model"]["n_params"] == 3 * 32 * 9 + 32 + 32 * 64 * 9 + 64 + 64 * 10 + 10
    assert out["components"]["optimizer_states"] > 0  # a training step with AdamW by default
    assert out["peak_allocated_bytes"] > 0


def test_a_factory_refuses_a_technique_it_cannot_take(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    code = main(
        ["estimate", "tiny_cnn:make", "--allow-code", "--precision", "fp32", "--lora-rank", "8"]
    )
    assert code == 2
    assert "inside the factory" in capsys.readouterr().err
