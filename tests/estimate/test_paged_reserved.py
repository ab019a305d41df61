"""Paged optimizer states (bitsandbytes ``get_paged``: ``cudaMallocManaged``) live outside torch's
caching allocator: the analytic engine's reserved/allocated ratio scales the rest only, and
``--engine auto`` answers a setting only the analytic engine models with it."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main
from memfit.estimate import estimate
from memfit.estimate.analytic.reserved import RESERVED_RATIO
from memfit.spec import WorkloadSpec


def test_the_reserved_ratio_leaves_paged_states_unscaled() -> None:
    wl = WorkloadSpec(
        batch_size=1, seq_len=512, precision="bf16-true", optimizer="paged-adamw-8bit"
    )
    est = estimate("qwen2.5-0.5b", wl, engine="analytic", gpu="L4")
    paged = est.unified_memory_bytes
    assert paged > 0
    mid = RESERVED_RATIO["train"][0]
    expected = int((est.peak_allocated_bytes - paged) * mid) + paged
    assert est.peak_reserved_bytes == pytest.approx(expected, abs=2 * 2**20)  # block rounding


def test_auto_answers_a_fused_loss_with_the_analytic_engine(capsys) -> None:
    pytest.importorskip("transformers")
    rc = main([
        "estimate", "qwen2.5-0.5b", "--gpu", "L4", "--mode", "train", "--batch", "1",
        "--seq", "256", "--loss", "fused", "--json", "--quiet",
    ])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["engine"] == "analytic"
    assert "trace engine refuses" in " ".join(out["notes"])
