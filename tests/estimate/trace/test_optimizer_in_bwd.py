"""``optimizer_in_bwd``: one optimizer per parameter, stepped and zeroed in the parameter's
post-accumulate-grad hook (torchtune ``optimizer_in_bwd: True``), traced as real CPU execution
allocates it; the full set of gradients never exists."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from benchmarks.tiny_models import tiny_config

from memfit.errors import NotModelledError, SpecError
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec


def _trace(execution: str = "fake", **kw: object) -> MemoryEstimate:
    w = WorkloadSpec(batch_size=1, seq_len=2, precision="fp32", **kw)  # type: ignore[arg-type]
    return trace_hf(
        tiny_config("llama"), w, name="t", extrapolate=False, execution=execution,
        emulate_cuda=False,
    )  # fmt: skip


def test_the_fake_trace_counts_what_real_cpu_execution_allocates() -> None:
    fake, real = _trace("fake", optimizer_in_bwd=True), _trace("real", optimizer_in_bwd=True)
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    for phase in ("forward", "backward", "optimizer"):
        assert fake.phases[phase].to_json() == real.phases[phase].to_json()


def test_no_full_set_of_gradients_and_the_states_still_exist() -> None:
    plain, in_bwd = _trace(), _trace(optimizer_in_bwd=True)
    full_grads = plain.phases["optimizer"].components["gradients"]
    assert full_grads > 0
    for phase in in_bwd.phases.values():
        # at most the gradients of one node (the largest weight: the embedding / LM head)
        assert phase.components["gradients"] < full_grads / 2, phase.phase
    assert in_bwd.phases["optimizer"].components["gradients"] == 0
    states = plain.phases["optimizer"].components["optimizer_states"]
    assert in_bwd.phases["backward"].components["optimizer_states"] == states
    # (the peaks of a model this small are the cuBLAS workspaces': compare the phases)
    for phase in ("backward", "optimizer"):
        saved = plain.phases[phase].peak_allocated_bytes - in_bwd.phases[phase].peak_allocated_bytes
        assert saved > 0, phase


def test_combinations_that_cannot_run_are_refused() -> None:
    with pytest.raises(SpecError, match="grad_accum"):
        WorkloadSpec(optimizer_in_bwd=True, grad_accum=2, zero_grad_set_to_none=False)
    with pytest.raises(SpecError, match="16-mixed"):
        WorkloadSpec(optimizer_in_bwd=True, precision="16-mixed")
    with pytest.raises(SpecError, match="training job"):
        WorkloadSpec(mode="infer", optimizer_in_bwd=True)
    w = WorkloadSpec(optimizer_in_bwd=True, gpus=2, shard="fsdp", batch_size=1, seq_len=16)
    with pytest.raises(NotModelledError, match="one GPU"):
        trace_hf(tiny_config("llama"), w, name="t", extrapolate=False)
