"""The precision a GPU runs: bf16 names become their fp16 counterparts without bf16 tensor cores."""

from __future__ import annotations

import pytest

from memfit.hardware import get_gpu, list_gpus
from memfit.hardware.precision import precision_on


@pytest.mark.parametrize(
    ("precision", "on_t4"),
    [("bf16-mixed", "16-mixed"), ("bf16-true", "16-true"), ("16-mixed", "16-mixed"),
     ("32-true", "32-true")],
)  # fmt: skip
def test_a_gpu_without_bf16_gets_the_fp16_counterpart(precision: str, on_t4: str) -> None:
    assert precision_on(precision, get_gpu("T4")) == on_t4
    assert precision_on(precision, get_gpu("L4")) == precision  # Ada has bf16
    assert precision_on(precision, None) == precision  # no GPU: as asked


def test_every_catalog_gpu_without_bf16_is_mapped() -> None:
    without = [g for g in list_gpus() if not g.supports_bf16]
    assert {g.name for g in without} >= {"T4", "V100-32GB"}
    assert all(precision_on("bf16-true", g) == "16-true" for g in without)
