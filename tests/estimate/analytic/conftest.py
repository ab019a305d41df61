"""Fixtures of the analytic-engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def trace_hf():
    pytest.importorskip("transformers")
    from memfit.estimate.trace.engine import trace_hf

    return trace_hf
