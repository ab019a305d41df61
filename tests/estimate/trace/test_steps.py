"""The traced steps: generation of models that keep their state under ``cache_params`` (Mamba),
counted as real CPU execution counts it."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from benchmarks.tiny_models import tiny_config

from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec


def _mamba_generation(execution: str) -> MemoryEstimate:
    w = WorkloadSpec(mode="infer", batch_size=2, seq_len=8, new_tokens=3, precision="fp32")
    return trace_hf(
        tiny_config("mamba"), w, name="t", extrapolate=False, execution=execution,
        emulate_cuda=False,
    )  # fmt: skip


@pytest.mark.slow  # real execution: 15 s CPU, over a minute on the shared machine
def test_mamba_generation_decodes_through_its_cache_params_as_real_execution_does() -> None:
    """MambaForCausalLM returns its state as ``cache_params`` (no ``past_key_values``): each
    decode step passes it back, as ``generate()`` does, and the fake trace counts what the same
    loop allocates on real CPU tensors (was an AttributeError: issue 11, the grid)."""
    fake, real = _mamba_generation("fake"), _mamba_generation("real")
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    assert fake.phases["decode"].to_json() == real.phases["decode"].to_json()
    assert fake.phases["decode"].components["kv_cache"] > 0, "the SSM state is the cache"
