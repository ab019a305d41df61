"""Docs stay true to the code."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_matches_the_parser(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    from benchmarks.render_cli_doc import DOC, render

    assert DOC.read_text() == render(), (
        "run: COLUMNS=100 .venv/bin/python benchmarks/render_cli_doc.py"
    )


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def test_accuracy_doc_quotes_the_generated_gpu_table() -> None:
    generated = (ROOT / "benchmarks/results/gpu_h200_comparison.md").read_text()
    doc = (ROOT / "docs/accuracy.md").read_text()
    table = [line for line in generated.splitlines() if line.startswith("| llama1b")]
    assert table and all(line in doc for line in table)


def test_accuracy_doc_quotes_the_generated_uncertainty_bands() -> None:
    generated = (ROOT / "benchmarks/results/uncertainty.md").read_text()
    doc = (ROOT / "docs/accuracy.md").read_text()
    bands = [line for line in generated.split("| point |")[0].splitlines() if line.startswith("| ")]
    # the per-path band table (4 paths x 4 parts) and the coverage table, each with its header
    assert len(bands) >= 2 + 16 and all(line in doc for line in bands)
