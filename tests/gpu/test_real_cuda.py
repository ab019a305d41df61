"""On a CUDA machine: memfit's estimate against torch.cuda's own counters for the same step.

Skipped without CUDA. Run on a GPU box with ``pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import memfit

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MEASURE = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_measure.py"


@pytest.mark.parametrize("case", ["llama1b-train-bf16", "bert-train-seqcls", "mistral7b-infer"])
def test_estimate_matches_this_gpu(case: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(MEASURE), "--case", case], capture_output=True, text=True, check=True
    )
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    est = memfit.estimate(measured["config"], memfit.WorkloadSpec(**measured["workload"]))
    error = est.peak_allocated_bytes / measured["max_memory_allocated"] - 1
    assert -0.02 <= error <= 0.12, f"allocated {error:+.2%}"
    error = est.peak_reserved_bytes / measured["max_memory_reserved"] - 1
    assert -0.07 <= error <= 0.15, f"reserved {error:+.2%}"
