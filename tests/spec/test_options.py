"""EstimateOptions: how a job is answered, validated once, applied in one place."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.estimate import policy
from memfit.estimate.derived import cache
from memfit.estimate.options import using_options
from memfit.models import source
from memfit.spec.options import EstimateOptions


def test_bad_options_are_refused_together_naming_field_and_value() -> None:
    with pytest.raises(SpecError, match=r"3 problems: engine \('fast'\) must be one of auto.*"
                       r"use_cache \(1\) must be True or False.*extrapolate"):  # fmt: skip
        EstimateOptions(engine="fast", use_cache=1, extrapolate="yes")  # type: ignore[arg-type]


def test_using_options_sets_the_engine_the_caches_and_the_code_rule() -> None:
    options = EstimateOptions(engine="trace", use_cache=False, allow_code=True)
    with using_options(options):
        assert policy.active().engine == "trace"
        assert not cache.enabled()
        assert source._ALLOW_CODE.get() is True
    assert policy.active().engine == "auto" and source._ALLOW_CODE.get() is False


def test_default_options_keep_what_the_caller_set() -> None:
    with policy.use_engine("analytic"), source.allowing_code(True), using_options(
        EstimateOptions()
    ):  # fmt: skip
        assert policy.active().engine == "analytic"
        assert source._ALLOW_CODE.get() is True
