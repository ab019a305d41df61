"""The serving job: VllmConfig lives in spec/ and names vLLM's flags in its refusals."""

from __future__ import annotations

import pytest

import memfit
from memfit.errors import SpecError
from memfit.spec.serving import VllmConfig


def test_the_serving_job_is_public_from_memfit_and_memfit_spec() -> None:
    assert memfit.VllmConfig is VllmConfig is memfit.spec.VllmConfig


def test_a_serving_job_reports_every_problem_with_the_flag_name() -> None:
    with pytest.raises(SpecError, match=r"2 problems: --block-size \(3\) must be one of.*--dtype"):
        VllmConfig(block_size=3, dtype="fp9")
