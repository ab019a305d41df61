"""Tracing a few layers and extrapolating gives the same estimate as tracing every layer."""

from __future__ import annotations

import pytest
from tests.conftest import TINY_GEMMA2, TINY_LLAMA, TINY_T5

from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec


def _pair(config: dict, **workload) -> tuple:
    wl = WorkloadSpec(**{"batch_size": 2, "seq_len": 128, **workload})
    full = trace_hf(config, wl, name="t", extrapolate=False)
    fast = trace_hf(config, wl, name="t", extrapolate=True)
    return full, fast


@pytest.mark.parametrize(
    "workload",
    [
        {},
        {"precision": "amp-bf16"},
        {"checkpointing": "full"},
        {"lora_rank": 8},
        {"freeze_layers": 2},
        {"mode": "infer", "new_tokens": 8},
    ],
    ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()) or "default",
)
def test_extrapolated_llama_equals_the_full_trace(workload: dict) -> None:
    config = {**TINY_LLAMA, "num_hidden_layers": 9}
    full, fast = _pair(config, **workload)
    assert fast.trace["extrapolated"] is True
    assert fast.trace["extrapolation_check_error"] == 0
    assert fast.peak_allocated_bytes == full.peak_allocated_bytes
    assert fast.components == full.components
    assert {k: v.peak_allocated_bytes for k, v in fast.phases.items()} == {
        k: v.peak_allocated_bytes for k, v in full.phases.items()
    }
    assert fast.n_params == full.n_params


def test_extrapolation_respects_alternating_layer_patterns() -> None:
    """Gemma 2 alternates sliding-window and full attention: period 2."""
    full, fast = _pair(TINY_GEMMA2, seq_len=256)
    assert fast.trace["extrapolated"] is True
    assert fast.peak_allocated_bytes == full.peak_allocated_bytes
    assert fast.components == full.components


def test_extrapolation_handles_encoder_and_decoder_stacks() -> None:
    config = {**TINY_T5, "num_layers": 7, "num_decoder_layers": 8}
    full, fast = _pair(config, precision="fp32")
    assert fast.trace["extrapolated"] is True
    assert fast.peak_allocated_bytes == full.peak_allocated_bytes


def test_extrapolated_reserved_memory_stays_close_to_the_full_replay() -> None:
    """The allocator replay is not linear in layers to the byte (segment packing); 2 % bound."""
    full, fast = _pair({**TINY_LLAMA, "num_hidden_layers": 12})
    assert fast.peak_reserved_bytes == pytest.approx(full.peak_reserved_bytes, rel=0.02)


def test_small_models_are_traced_in_full() -> None:
    est = trace_hf(TINY_LLAMA, WorkloadSpec(seq_len=64), name="t")
    assert est.trace["extrapolated"] is False
