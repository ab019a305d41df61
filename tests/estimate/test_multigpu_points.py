"""The published multi-GPU training points (benchmarks/data/multigpu_published.jsonl): the agreed
schema, and memfit's per-rank answer on the expressible ones against the measurement."""

from __future__ import annotations

import pytest
from benchmarks.multigpu_points import load, missing, run

FIELDS = {
    "source", "framework", "version", "model", "gpus", "layout", "precision", "micro_batch",
    "seq", "checkpointing", "measured_gib", "metric",
}  # fmt: skip
LAYOUT = {"dp", "fsdp", "tp", "pp", "cp", "ep"}


def test_every_point_has_the_agreed_fields_and_a_layout_that_spans_its_gpus() -> None:
    for p in load():
        assert set(p) >= FIELDS, p.get("id")
        assert set(p["layout"]) == LAYOUT, p["id"]
        assert p["metric"] in ("allocated", "reserved", "device"), p["id"]
        assert p["source"].startswith("https://"), p["id"]
        n = 1
        for v in p["layout"].values():
            n *= v
        assert n == p["gpus"], p["id"]


@pytest.mark.parametrize("point", [p for p in load() if not missing(p)], ids=lambda p: p["id"])
def test_expressible_points_are_not_under_predicted(point: dict) -> None:
    """Tolerance: never more than 10 % under (issue 30's rule), at most 10 % over — torchtitan's
    per-op SAC runs as memfit's ``selective-op``, the same policy (before it, as ``selective``,
    these points were +18 % / +28 %: docs/accuracy.md, torchtitan's checkpointing)."""
    row = run(point)
    assert -0.10 <= row["error"] <= 0.10, row
